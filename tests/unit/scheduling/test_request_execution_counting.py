"""A request-level execution is counted in the statistics exactly once, with the backend's own timing,
whichever way the backend reports its end: responses carrying the execution's (start, end), the timing
returned by execute_requests, or a handed-over future that ends later."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from naiad.backends.base import BackendRequest, BackendResponse, InProcessRequestInstance, ResponseCallback
from naiad.observability.statistics import ModelStatistics
from naiad.runtime.thread_instance import InstancePool
from naiad.scheduling.base import WorkItem, run_batch
from naiad.scheduling.execution_policy import InlinePolicy

TIMING = (1_000, 51_000)  # the backend's own (start, end) of the execution: 50 us


class HandingOver(InProcessRequestInstance):
    """Sends the requests away and returns a future of the execution's end, as a worker-process instance does;
    the test answers them (`answer`) and ends the execution (`end`) when it wants."""

    tracks_unfinished = True  # run in the caller, as a worker-process instance does

    def __init__(self, return_timing: bool = False) -> None:
        self.name = "handing_over_0"
        self.return_timing = return_timing
        self.respond: ResponseCallback | None = None
        self.done: asyncio.Future[Any] | None = None

    async def execute_requests(self, requests: list[BackendRequest], respond: ResponseCallback) -> Any:
        self.respond = respond
        self.done = asyncio.get_running_loop().create_future()
        if self.return_timing:  # answered while execute_requests ran, which then returns the timing
            for index in range(len(requests)):
                respond(index, BackendResponse({"Y": np.zeros(1)}, execution_ns=TIMING))
            return TIMING
        return self.done

    def answer(self, index: int, timed: bool) -> None:
        assert self.respond is not None
        self.respond(index, BackendResponse({"Y": np.zeros(1)}, execution_ns=TIMING if timed else None))

    def end(self) -> None:
        assert self.done is not None
        self.done.set_result(TIMING)

    def take_unfinished(self) -> None:
        return None

    def healthy(self) -> bool:
        return True

    async def aclose(self) -> None:
        pass


def _items(count: int) -> list[WorkItem]:
    return [WorkItem({"X": np.zeros((1, 1), np.float32)}, ["Y"], 1) for _ in range(count)]


async def _run(instance: HandingOver, items: list[WorkItem], stats: ModelStatistics) -> None:
    pool = InstancePool([instance])
    granted = pool.try_acquire()
    assert granted is instance
    await run_batch(pool, instance, items, True, stats, InlinePolicy())


def _executions(stats: ModelStatistics) -> tuple[int, int, int]:
    data = stats.as_dict()
    infer = data["inference_stats"]["compute_infer"]
    return data["execution_count"], infer["count"], infer["ns"]


def test_answered_with_its_timing_it_is_counted_then_and_once() -> None:
    async def body() -> None:
        stats, instance, items = ModelStatistics("m", "1"), HandingOver(), _items(2)
        await _run(instance, items, stats)
        assert _executions(stats) == (0, 0, 0)  # handed over: not ended yet
        instance.answer(0, timed=True)
        assert _executions(stats) == (0, 0, 0)  # one request of two answered
        instance.answer(1, timed=True)
        assert _executions(stats) == (1, 2, 2 * 50_000)  # both answered by the ended execution: counted
        instance.end()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert _executions(stats) == (1, 2, 2 * 50_000)  # its end does not count it again
        assert all(item.future.done() for item in items)

    asyncio.run(body())


def test_streamed_responses_leave_the_count_to_the_execution_end() -> None:
    async def body() -> None:
        stats, instance, items = ModelStatistics("m", "1"), HandingOver(), _items(2)
        await _run(instance, items, stats)
        instance.answer(0, timed=True)
        instance.answer(1, timed=False)  # a response without the execution's timing (a streamed one)
        assert _executions(stats) == (0, 0, 0)
        instance.end()
        await asyncio.sleep(0)
        assert _executions(stats) == (1, 2, 2 * 50_000)

    asyncio.run(body())


def test_a_returned_timing_after_timed_answers_counts_once() -> None:
    async def body() -> None:
        stats, items = ModelStatistics("m", "1"), _items(1)
        await _run(HandingOver(return_timing=True), items, stats)
        assert _executions(stats) == (1, 1, 50_000)
        assert items[0].future.result().outputs is not None

    asyncio.run(body())
