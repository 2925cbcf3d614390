"""The default scheduler: each request runs alone on the first idle instance."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from naiad.backends.base import BackendResponse
from naiad.observability.statistics import ModelStatistics
from naiad.runtime.thread_instance import InstancePool
from naiad.scheduling.base import WorkItem, run_batch


class DirectScheduler:
    """No batching across requests; as many requests run at once as there are instances."""

    def __init__(self, pool: InstancePool, stats: ModelStatistics, batching: bool) -> None:
        self._pool = pool
        self._stats = stats
        self._batching = batching
        self._inflight = 0
        self._waiting = 0
        self._rescheduled: set[asyncio.Task[None]] = set()
        self._queued_at_instances: list[Callable[[], int]] = [
            inst.queued for inst in pool.instances
        ]

    async def enqueue(self, item: WorkItem) -> BackendResponse:
        self._inflight += 1
        item.reschedule = self._reschedule
        try:
            await self._run(item)
            return await item.future
        except asyncio.CancelledError:
            item.abandon()
            raise
        finally:
            self._inflight -= 1

    async def _run(self, item: WorkItem) -> None:
        self._waiting += 1
        try:
            instance = await self._pool.acquire()
        finally:
            self._waiting -= 1
        await run_batch(self._pool, instance, [item], self._batching, self._stats)

    def _reschedule(self, item: WorkItem) -> None:
        """The backend released the request with RESCHEDULE: it runs again on the next free instance.

        enqueue() still awaits the item's future, so the request stays in flight meanwhile.
        """
        task = asyncio.get_running_loop().create_task(self._run(item))
        self._rescheduled.add(task)
        task.add_done_callback(self._rescheduled.discard)

    def inflight(self) -> int:
        return self._inflight

    def pending(self) -> int:
        # Requests an instance took ahead of executing them (a pipelined Python worker) still wait.
        return self._waiting + sum(queued() for queued in self._queued_at_instances)

    async def stop(self) -> None:
        return None
