"""The default scheduler: each request runs alone on the first idle instance."""

from __future__ import annotations

from naiad.backends.base import BackendResponse
from naiad.observability.statistics import ModelStatistics
from naiad.runtime.thread_instance import InstancePool
from naiad.scheduling.base import WorkItem, execute_batch


class DirectScheduler:
    """No batching across requests; as many requests run at once as there are instances."""

    def __init__(self, pool: InstancePool, stats: ModelStatistics, batching: bool) -> None:
        self._pool = pool
        self._stats = stats
        self._batching = batching
        self._inflight = 0
        self._waiting = 0

    async def enqueue(self, item: WorkItem) -> BackendResponse:
        self._inflight += 1
        self._waiting += 1
        try:
            try:
                instance = await self._pool.acquire()
            finally:
                self._waiting -= 1
            try:
                await execute_batch(instance, [item], self._batching, self._stats)
            finally:
                self._pool.release(instance)
            return await item.future
        finally:
            self._inflight -= 1

    def inflight(self) -> int:
        return self._inflight

    def pending(self) -> int:
        return self._waiting

    async def stop(self) -> None:
        return None
