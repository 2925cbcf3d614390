"""Cancelling queued requests costs O(1) each, whatever the queue length, in every scheduler.

A flood of requests cancelled while queued (an HTTP/2 rapid reset, clients timing out) must not
cost time quadratic in the queue length. Each case queues N requests behind a blocked instance,
cancels them all newest first (the worst order for a list or deque: each one is at the far end),
and checks that the time spent grows about linearly with N, that the scheduler's pending count
(nv_inference_pending_request_count) drops to 0, and that a normal request is served afterwards.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import BackendRequest, BackendResponse, InProcessRequestInstance, ResponseCallback
from naiad.observability.statistics import ModelStatistics
from naiad.protocol.errors import NaiadError
from naiad.protocol.types import InferenceRequest
from naiad.runtime.thread_instance import InstancePool
from naiad.scheduling.base import Scheduler, WorkItem
from naiad.scheduling.direct import DirectScheduler
from naiad.scheduling.dynamic_batcher import DynamicBatcher
from naiad.scheduling.rate_limiter import InstanceLimits, RateLimiter
from naiad.scheduling.sequence_batcher import SequenceBatcher
from tests.support.waiting import wait_until_async

SMALL, LARGE = 2_000, 40_000


class GatedInstance(InProcessRequestInstance):
    """A request-level instance that answers Y = X * 2 once its gate is open."""

    name = "gated_0"

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.executions = 0

    async def execute_requests(self, requests: list[BackendRequest], respond: ResponseCallback) -> None:
        self.executions += 1
        await self.gate.wait()
        for index, request in enumerate(requests):
            respond(index, BackendResponse({"Y": request.inputs["X"] * 2}))

    def healthy(self) -> bool:
        return True

    async def aclose(self) -> None:
        pass


def _sequence_config() -> mc.ModelConfig:
    config = mc.ModelConfig(name="m", max_batch_size=0)
    config.sequence_batching.max_sequence_idle_microseconds = 600_000_000
    return config


# name -> (scheduler factory, pool factory, how each queued request is addressed)
def _plain_pool(instance: GatedInstance) -> InstancePool:
    return InstancePool([instance])


def _limited_pool(instance: GatedInstance) -> InstancePool:
    return RateLimiter("execution_count").pool([instance], [InstanceLimits()])


CASES: dict[str, tuple[Callable[[InstancePool], Scheduler], Callable[[GatedInstance], InstancePool], str]] = {
    "direct": (lambda pool: DirectScheduler(pool, ModelStatistics("m", "1"), batching=False), _plain_pool, "plain"),
    "direct_rate_limited": (lambda pool: DirectScheduler(pool, ModelStatistics("m", "1"), batching=False), _limited_pool, "plain"),
    "dynamic": (lambda pool: DynamicBatcher(pool, ModelStatistics("m", "1"), 0, mc.ModelDynamicBatching(max_queue_delay_microseconds=0)),
                _plain_pool, "plain"),
    "dynamic_bounded": (lambda pool: DynamicBatcher(pool, ModelStatistics("m", "1"), 0, mc.ModelDynamicBatching(
        default_queue_policy=mc.ModelQueuePolicy(max_queue_size=LARGE, default_timeout_microseconds=600_000_000))),
                        _plain_pool, "plain"),
    # Every request in the one sequence holding the only slot: they queue inside the sequence.
    "sequence_queue": (lambda pool: SequenceBatcher(pool, ModelStatistics("m", "1"), _sequence_config(), None), _plain_pool, "same"),
    # Every request starts its own sequence: they wait in the backlog for a slot.
    "sequence_backlog": (lambda pool: SequenceBatcher(pool, ModelStatistics("m", "1"), _sequence_config(), None), _plain_pool, "new"),
}


def _item(value: float, addressing: str, index: int) -> WorkItem:
    request = InferenceRequest(model_name="m", inputs=[])
    if addressing == "same":
        request.sequence_id, request.sequence_start = 1, index == 0
    elif addressing == "new":  # a whole sequence in one request
        request.sequence_id, request.sequence_start, request.sequence_end = index + 1, True, True
    return WorkItem({"X": np.full((1,), value, np.float32)}, ["Y"], 1, request=request)


async def _cancel_queued(case: str, count: int) -> float:
    """Seconds spent cancelling `count` queued requests (and letting them leave their queues)."""
    make_scheduler, make_pool, addressing = CASES[case]
    instance = GatedInstance()
    pool = make_pool(instance)
    scheduler = make_scheduler(pool)
    try:
        first = asyncio.ensure_future(scheduler.enqueue(_item(0, addressing, 0)))
        await wait_until_async(lambda: instance.executions == 1, "the first request runs (and blocks the instance)")
        callers = [asyncio.ensure_future(scheduler.enqueue(_item(1, addressing, k + 1))) for k in range(count)]
        await wait_until_async(lambda: scheduler.pending() == count, f"{count} requests queued")
        if case == "dynamic_bounded" and count == LARGE:  # the queue is full: one more is refused
            with pytest.raises(NaiadError, match="Exceeds maximum queue size"):
                await scheduler.enqueue(_item(2, addressing, count + 1))
        gc.collect()
        gc.disable()  # a collection during the measurement would be noise
        try:
            began = time.perf_counter()
            for caller in reversed(callers):
                caller.cancel()
            await asyncio.gather(*callers, return_exceptions=True)
            elapsed = time.perf_counter() - began
        finally:
            gc.enable()
        assert all(caller.cancelled() for caller in callers)
        assert scheduler.pending() == 0, "cancelled requests are still counted as pending"
        if case == "dynamic_bounded" and count == LARGE:  # and the cancelled ones no longer fill it
            refill = [asyncio.ensure_future(scheduler.enqueue(_item(1, addressing, 0))) for _ in range(count)]
            await wait_until_async(lambda: scheduler.pending() == count, "the queue refilled")
            for caller in refill:
                caller.cancel()
            await asyncio.gather(*refill, return_exceptions=True)
        # Still serving: the blocked request, then a fresh one.
        instance.gate.set()
        assert (await asyncio.wait_for(first, 10)).outputs["Y"].tolist() == [0.0]
        fresh = _item(3, addressing, count + 1)
        assert (await asyncio.wait_for(scheduler.enqueue(fresh), 10)).outputs["Y"].tolist() == [6.0]
        assert instance.executions == 2, "a cancelled request reached the model"
        assert scheduler.pending() == 0
    finally:
        instance.gate.set()
        await scheduler.stop()
        await pool.close()
    return elapsed


@pytest.mark.parametrize("case", sorted(CASES))
def test_cancelling_queued_requests_costs_linear_time(case: str) -> None:
    small = min(asyncio.run(_cancel_queued(case, SMALL)) for _ in range(3))
    large = asyncio.run(_cancel_queued(case, LARGE))
    # 20x the requests: about 20x the time when each cancel is O(1) (up to 60x measured:
    # caches hold less of the larger queue), about 400x when it is O(queue).
    # The wide margin absorbs a loaded machine and cache effects; 0.1 s covers a tiny small-case time.
    assert large < 150 * small + 0.1, f"{SMALL} cancels took {small:.3f}s, {LARGE} took {large:.3f}s"
