"""A request cancelled while it executes alone: the execution still runs to its end on the instance,
which stays busy until then, and it is counted like any other execution; the result is dropped."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import (
    BackendRequest,
    BackendResponse,
    ExecutionBatch,
    InProcessRequestInstance,
    ResponseCallback,
)
from naiad.observability.statistics import ModelStatistics
from naiad.protocol.types import InferenceRequest
from naiad.runtime.thread_instance import InstancePool, ThreadInstance
from naiad.scheduling.base import Scheduler, WorkItem
from naiad.scheduling.direct import DirectScheduler
from naiad.scheduling.dynamic_batcher import DynamicBatcher
from naiad.scheduling.execution_policy import InlinePolicy, InlineSettings
from naiad.scheduling.sequence_batcher import SequenceBatcher
from tests.support.waiting import wait_until_async


class Executions:
    """What a model saw: when each execution ran, how many ran at once, which saw their request cancelled."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.spans: list[tuple[int, int]] = []
        self.cancelled_seen: list[bool] = []
        self.most_at_once = 0
        self._active = 0
        self._lock = threading.Lock()

    @property
    def active(self) -> int:
        return self._active

    def run(self, values: np.ndarray, is_cancelled: Callable[[], bool] = lambda: False) -> np.ndarray:
        with self._lock:
            self._active += 1
            self.most_at_once = max(self.most_at_once, self._active)
        start = time.perf_counter_ns()
        try:
            self.gate.wait(10)
            self.cancelled_seen.append(is_cancelled())
            return values * 2
        finally:
            with self._lock:
                self._active -= 1
            self.spans.append((start, time.perf_counter_ns()))


class ThreadModel:
    """A framework backend's instance: run on a ThreadInstance's own thread."""

    name = "thread_0"

    def __init__(self, executions: Executions) -> None:
        self.executions = executions

    def execute(self, batch: ExecutionBatch) -> dict[str, np.ndarray]:
        return {"Y": self.executions.run(batch.inputs["X"])}

    def close(self) -> None:
        pass


class WorkerModel(InProcessRequestInstance):
    """A request-level instance whose model runs elsewhere (as a Python-backend worker process does): the
    work goes on when the coroutine awaiting it is cancelled. Its threads would run two batches at once
    if the scheduler handed it a second one while the first is still running."""

    name = "worker_0"

    def __init__(self, executions: Executions) -> None:
        self.executions = executions
        self._threads = ThreadPoolExecutor(max_workers=2)

    async def execute_requests(self, requests: list[BackendRequest], respond: ResponseCallback) -> None:
        loop = asyncio.get_running_loop()
        for index, request in enumerate(requests):
            values = await loop.run_in_executor(self._threads, self.executions.run, request.inputs["X"], request.is_cancelled)
            respond(index, BackendResponse({"Y": values}))

    def healthy(self) -> bool:
        return True

    async def aclose(self) -> None:
        self._threads.shutdown(wait=True)


def _thread_instance(executions: Executions) -> ThreadInstance:
    return ThreadInstance(ThreadModel(executions))


ON_THREADS = InlinePolicy(InlineSettings(threshold_ns=0))  # a thread instance always executes on its thread


def _worker_instance(executions: Executions) -> WorkerModel:
    return WorkerModel(executions)


def _direct(pool: InstancePool, stats: ModelStatistics) -> DirectScheduler:
    return DirectScheduler(pool, stats, batching=True, inline=ON_THREADS)


def _dynamic(pool: InstancePool, stats: ModelStatistics) -> DynamicBatcher:
    # No queue delay: a lone request on an idle instance takes the batcher's shortcut.
    return DynamicBatcher(pool, stats, 8, mc.ModelDynamicBatching(), inline=ON_THREADS)


INSTANCES = {"thread": _thread_instance, "worker": _worker_instance}
SCHEDULERS = {"direct": _direct, "dynamic": _dynamic}


def _item(value: float) -> WorkItem:
    request = InferenceRequest(model_name="m", inputs=[])
    return WorkItem({"X": np.full((1, 1), value, np.float32)}, ["Y"], 1, request=request)


async def _cancel_executing(scheduler: Scheduler, executions: Executions) -> WorkItem:
    """Start a request, cancel its caller while the model executes it; the model is still held at the gate."""
    item = _item(1)
    caller = asyncio.ensure_future(scheduler.enqueue(item))
    await wait_until_async(lambda: executions.active == 1, "the first execution started")
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    return item


@pytest.mark.parametrize("instance_kind", sorted(INSTANCES))
@pytest.mark.parametrize("scheduler_kind", sorted(SCHEDULERS))
def test_cancelled_execution_keeps_its_instance_until_it_ends(scheduler_kind: str, instance_kind: str) -> None:
    async def body() -> None:
        executions = Executions()
        pool = InstancePool([INSTANCES[instance_kind](executions)])
        stats = ModelStatistics("m", "1")
        scheduler = SCHEDULERS[scheduler_kind](pool, stats)
        try:
            cancelled = await _cancel_executing(scheduler, executions)
            second = _item(2)
            waiting = asyncio.ensure_future(scheduler.enqueue(second))
            await asyncio.sleep(0.1)
            assert not waiting.done() and second.dispatch_ns == 0, "the second request was handed to the busy instance"
            assert scheduler.pending() == 1
            executions.gate.set()
            response = await waiting
        finally:
            executions.gate.set()
            await scheduler.stop()
            await pool.close()
        assert response.outputs["Y"].tolist() == [[4.0]]
        first_end = executions.spans[0][1]
        assert second.dispatch_ns >= first_end
        assert executions.most_at_once == 1
        assert cancelled.future.cancelled()  # its result was dropped, not delivered
        # Both executions are counted; the cancelled request's failure is the server's to count.
        assert (stats.execution_count, stats.inference_count) == (2, 2)
        assert stats.batch_sizes() == {1: 2}

    asyncio.run(body())


@pytest.mark.parametrize("scheduler_kind", sorted(SCHEDULERS))
def test_the_model_sees_the_executing_request_cancelled(scheduler_kind: str) -> None:
    async def body() -> list[bool]:
        executions = Executions()
        pool = InstancePool([_worker_instance(executions)])
        scheduler = SCHEDULERS[scheduler_kind](pool, ModelStatistics("m", "1"))
        try:
            await _cancel_executing(scheduler, executions)
            executions.gate.set()
            await wait_until_async(lambda: len(executions.spans) == 1, "the cancelled execution ended")
        finally:
            executions.gate.set()
            await scheduler.stop()
            await pool.close()
        return executions.cancelled_seen

    assert asyncio.run(body()) == [True]


def test_closing_the_pool_waits_for_an_orphaned_execution() -> None:
    async def body() -> None:
        executions = Executions()
        instance = _worker_instance(executions)
        pool = InstancePool([instance])
        scheduler = _direct(pool, ModelStatistics("m", "1"))
        await _cancel_executing(scheduler, executions)
        await scheduler.stop()
        closing = asyncio.ensure_future(pool.close())
        await asyncio.sleep(0.05)
        assert not closing.done(), "the pool closed its instance while it was still executing"
        executions.gate.set()
        await closing
        assert len(executions.spans) == 1

    asyncio.run(body())


def test_sequence_batcher_stopped_mid_execution_releases_the_instance_when_it_ends() -> None:
    config = mc.ModelConfig(name="m", max_batch_size=0)
    config.sequence_batching.SetInParent()

    async def body() -> None:
        executions = Executions()
        pool = InstancePool([_thread_instance(executions)])
        batcher = SequenceBatcher(pool, ModelStatistics("m", "1"), config, None, ON_THREADS)
        item = _item(1)
        item.request.sequence_id, item.request.sequence_start = 7, True
        caller = asyncio.ensure_future(batcher.enqueue(item))
        await wait_until_async(lambda: executions.active == 1, "the sequence request started")
        caller.cancel()
        await batcher.stop()
        assert pool.try_acquire() is None, "the instance is idle while its thread still executes"
        executions.gate.set()
        pool.release(await asyncio.wait_for(pool.acquire(), 5))
        await pool.close()

    asyncio.run(body())
