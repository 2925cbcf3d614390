"""The rate limiter: resources shared across models, global vs per-device pools, priorities, defaults, flags."""

import argparse
import asyncio

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import InProcessRequestInstance
from naiad.cli.flags import add_serve_flags, config_from_args
from naiad.runtime.thread_instance import InstancePool
from naiad.scheduling.rate_limiter import (
    InstanceLimits,
    RateLimitedPool,
    RateLimiter,
    ResourceOverride,
    parse_resource_override,
)


class Inst(InProcessRequestInstance):
    def __init__(self, name: str) -> None:
        self.name = name

    def execute_requests(self, requests):  # marks it as request-level: no thread needed
        raise NotImplementedError

    async def aclose(self) -> None:
        pass


def run(coro):
    return asyncio.run(coro)


def group(resources=(), priority=0, kind=mc.ModelInstanceGroup.KIND_CPU) -> mc.ModelInstanceGroup:
    g = mc.ModelInstanceGroup(name="g", kind=kind, count=1)
    for name, count, is_global in resources:
        r = g.rate_limiter.resources.add(name=name, count=count)
        setattr(r, "global", is_global)
    g.rate_limiter.priority = priority
    return g


def make_pool(limiter, name, resources=(), priority=0, device=0, count=1) -> RateLimitedPool:
    limits = InstanceLimits.from_group(group(resources, priority), device)
    pool = limiter.pool([Inst(f"{name}_{k}") for k in range(count)], [limits] * count)
    assert isinstance(pool, RateLimitedPool)
    return pool


async def settle():
    for _ in range(3):
        await asyncio.sleep(0)


def test_off_gives_the_plain_pool():
    limiter = RateLimiter()
    assert not limiter.enabled
    pool = limiter.pool([Inst("a_0")], [InstanceLimits()])
    assert type(pool) is InstancePool


def test_shared_resource_blocks_the_second_model_until_the_first_finishes():
    async def body():
        limiter = RateLimiter("execution_count")
        a = make_pool(limiter, "a", [("R", 1, False)])
        b = make_pool(limiter, "b", [("R", 1, False)])
        held = await a.acquire()
        assert limiter.in_use("R", 0) == 1
        waiting = asyncio.create_task(b.acquire())
        await settle()
        assert not waiting.done()  # b's instance is idle but R is taken
        assert b.try_acquire() is None
        a.release(held)
        got = await asyncio.wait_for(waiting, 1)
        assert got.name == "b_0"
        assert limiter.in_use("R", 0) == 1
        assert a.try_acquire() is None  # now a waits for b
        b.release(got)
        assert limiter.in_use("R", 0) == 0
        assert a.try_acquire() is not None

    run(body())


def test_instance_must_be_idle_too():
    async def body():
        limiter = RateLimiter("execution_count")
        a = make_pool(limiter, "a")  # no resources: only idleness counts
        first = await a.acquire()
        second = asyncio.create_task(a.acquire())
        await settle()
        assert not second.done()
        a.release(first)
        assert (await asyncio.wait_for(second, 1)) is first

    run(body())


def test_per_device_resources_are_separate_pools_and_global_ones_are_shared():
    async def body():
        limiter = RateLimiter("execution_count")
        dev0 = make_pool(limiter, "d0", [("R", 1, False)], device=0)
        dev1 = make_pool(limiter, "d1", [("R", 1, False)], device=1)
        assert dev0.try_acquire() is not None
        assert dev1.try_acquire() is not None  # another device, another copy of R
        assert limiter.capacity("R", 0) == limiter.capacity("R", 1) == 1

        g0 = make_pool(limiter, "g0", [("G", 1, True)], device=0)
        g1 = make_pool(limiter, "g1", [("G", 1, True)], device=1)
        assert limiter.capacity("G") == 1
        held = g0.try_acquire()
        assert held is not None
        assert g1.try_acquire() is None  # one copy for the whole server
        g0.release(held)
        assert g1.try_acquire() is not None

    run(body())


def test_default_copies_are_the_largest_single_requirement_and_flags_override():
    async def body():
        limiter = RateLimiter("execution_count")
        a = make_pool(limiter, "a", [("R", 2, False)], count=2)
        b = make_pool(limiter, "b", [("R", 3, False)])
        assert limiter.capacity("R", 0) == 3
        assert a.try_acquire() is not None  # 2 of 3
        assert a.try_acquire() is None  # 4 > 3
        assert b.try_acquire() is None
        await b.close()
        assert limiter.capacity("R", 0) == 2  # the max over the models still loaded

        over = RateLimiter("execution_count", ["R:4", "R:1:1", "G:5"])
        c = make_pool(over, "c", [("R", 1, False)], device=0)
        make_pool(over, "d", [("R", 1, False)], device=1)
        make_pool(over, "e", [("G", 1, True)])
        assert over.capacity("R", 0) == 4  # no device: every device
        assert over.capacity("R", 1) == 1  # the device-specific entry wins
        assert over.capacity("G") == 5
        assert c.try_acquire() is not None

    run(body())


def test_bad_declarations_fail_the_load():
    limiter = RateLimiter("execution_count", ["R:1"])
    with pytest.raises(ValueError, match="copies"):
        make_pool(limiter, "a", [("R", 2, False)])
    mixed = RateLimiter("execution_count")
    make_pool(mixed, "a", [("R", 1, True)])
    with pytest.raises(ValueError, match="global"):
        make_pool(mixed, "b", [("R", 1, False)])
    with pytest.raises(ValueError, match="--rate-limit"):
        RateLimiter("sometimes")


def test_priority_two_gets_half_the_chances_of_priority_one():
    async def body():
        limiter = RateLimiter("execution_count")
        high = make_pool(limiter, "high", [("R", 1, True)], priority=1)
        low = make_pool(limiter, "low", [("R", 1, True)], priority=2)
        blocker = make_pool(limiter, "blocker", [("R", 1, True)])
        held = blocker.try_acquire()
        order: list[str] = []

        async def worker(pool, name):
            inst = await pool.acquire()
            order.append(name)
            await asyncio.sleep(0)
            pool.release(inst)

        tasks = [asyncio.create_task(worker(high, "high")) for _ in range(40)]
        tasks += [asyncio.create_task(worker(low, "low")) for _ in range(40)]
        await settle()
        blocker.release(held)
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        first = order[:30]
        assert first.count("high") == 20 and first.count("low") == 10, first

    run(body())


def test_priority_zero_counts_as_one():
    assert InstanceLimits.from_group(group(priority=0), 0).priority == 1
    assert InstanceLimits.from_group(group(priority=3), 0).priority == 3


def test_cancelled_waiter_leaves_the_queue():
    async def body():
        limiter = RateLimiter("execution_count")
        a = make_pool(limiter, "a", [("R", 1, False)])
        b = make_pool(limiter, "b", [("R", 1, False)])
        held = a.try_acquire()
        waiting = asyncio.create_task(b.acquire())
        await settle()
        waiting.cancel()
        await settle()
        a.release(held)
        assert limiter.in_use("R", 0) == 0
        assert b.try_acquire() is not None

    run(body())


def test_flags():
    assert parse_resource_override("R:2") == ResourceOverride("R", 2, None)
    assert parse_resource_override("gpu_mem:4:1") == ResourceOverride("gpu_mem", 4, 1)
    for bad in ("R", "R:x", ":2", "R:1:2:3", "R:-1"):
        with pytest.raises(ValueError):
            parse_resource_override(bad)

    parser = argparse.ArgumentParser()
    add_serve_flags(parser)
    config = config_from_args(parser.parse_args(["--model-repository", "/m"]))
    assert config.rate_limit == "off" and config.rate_limit_resources == []
    args = parser.parse_args(["--model-repository", "/m", "--rate-limit=execution_count",
                              "--rate-limit-resource=R:2", "--rate-limit-resource", "S:1:0"])
    config = config_from_args(args)
    assert config.rate_limit == "execution_count"
    assert config.rate_limit_resources == ["R:2", "S:1:0"]
    with pytest.raises(SystemExit):
        config_from_args(parser.parse_args(["--model-repository", "/m", "--rate-limit-resource=R"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["--model-repository", "/m", "--rate-limit=sometimes"])
