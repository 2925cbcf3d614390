"""Instance pools (plain and rate-limited): a caller may wait for one particular instance."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from naiad.backends.base import InProcessRequestInstance
from naiad.runtime.thread_instance import InstancePool
from naiad.scheduling.rate_limiter import InstanceLimits, RateLimiter


class Inst(InProcessRequestInstance):
    def __init__(self, name: str) -> None:
        self.name = name

    def execute_requests(self, requests):  # request-level: the pool needs no thread for it
        raise NotImplementedError

    async def aclose(self) -> None:
        pass


def _plain(instances: list) -> InstancePool:
    return InstancePool(instances)


def _limited(instances: list) -> InstancePool:
    return RateLimiter("execution_count").pool(instances, [InstanceLimits()] * len(instances))


POOLS: dict[str, Callable[[list], InstancePool]] = {"plain": _plain, "rate_limited": _limited}


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


@pytest.mark.parametrize("kind", sorted(POOLS))
def test_a_caller_waiting_for_its_instance_is_not_given_another(kind: str) -> None:
    async def body() -> None:
        first, second = Inst("m_0"), Inst("m_1")
        pool = POOLS[kind]([first, second])
        assert pool.try_acquire(first) is first
        waiting = asyncio.ensure_future(pool.acquire(first))
        await _settle()
        assert not waiting.done(), "the other instance is idle, but it is not the one asked for"
        assert pool.try_acquire(first) is None
        assert pool.try_acquire() is second  # anyone else may still take the other one
        pool.release(second)
        await _settle()
        assert not waiting.done()
        pool.release(first)
        assert await asyncio.wait_for(waiting, 5) is first
        pool.release(first)
        assert {pool.try_acquire(), pool.try_acquire()} == {first, second}

    asyncio.run(body())


@pytest.mark.parametrize("kind", sorted(POOLS))
def test_a_cancelled_waiter_is_skipped_and_the_instance_goes_to_the_next(kind: str) -> None:
    async def body() -> None:
        only = Inst("m_0")
        pool = POOLS[kind]([only])
        assert await pool.acquire() is only
        gone = asyncio.ensure_future(pool.acquire(only))
        served = asyncio.ensure_future(pool.acquire())
        await _settle()
        gone.cancel()
        pool.release(only)  # before the cancelled waiter could withdraw itself
        assert await asyncio.wait_for(served, 5) is only
        with pytest.raises(asyncio.CancelledError):
            await gone
        pool.release(only)
        assert pool.try_acquire(only) is only

    asyncio.run(body())


@pytest.mark.parametrize("kind", sorted(POOLS))
def test_waiters_that_withdrew_leave_the_instances_to_anyone(kind: str) -> None:
    async def body() -> None:
        first, second = Inst("m_0"), Inst("m_1")
        pool = POOLS[kind]([first, second])
        assert {pool.try_acquire(), pool.try_acquire()} == {first, second}
        waiting = [asyncio.ensure_future(pool.acquire()), asyncio.ensure_future(pool.acquire(first))]
        await _settle()
        for waiter in waiting:
            waiter.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        assert pool.try_acquire() is None  # both are still busy
        pool.release(first)
        pool.release(second)
        # nobody waits any more: both are idle, for any caller and for the one asking for `first`
        assert pool.try_acquire(first) is first
        assert pool.try_acquire() is second
        served = asyncio.ensure_future(pool.acquire())
        await _settle()
        pool.release(first)
        assert await asyncio.wait_for(served, 5) is first

    asyncio.run(body())
