"""The default scheduler: each request runs alone on the first idle instance."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from naiad.backends.base import BackendResponse, PoolInstance
from naiad.observability.statistics import ModelStatistics
from naiad.runtime.thread_instance import InstancePool
from naiad.scheduling.base import WorkItem, run_batch
from naiad.scheduling.execution_policy import InlinePolicy


class DirectScheduler:
    """No batching across requests; as many requests run at once as there are instances.

    Also the dynamic batcher's path for a request that runs at once (the zero-delay policy of
    naiad/scheduling/execution_policy.py): `run_on()`.
    """

    def __init__(self, pool: InstancePool, stats: ModelStatistics, batching: bool, inline: InlinePolicy | None = None) -> None:
        self._pool = pool
        self._stats = stats
        self._batching = batching
        self._inline = inline or InlinePolicy()
        self._inflight = 0
        self._waiting = 0
        self._rescheduled: set[asyncio.Task[None]] = set()
        self._run_again: Callable[[WorkItem], None] = self._reschedule  # bound once, not per request
        self._queued_at_instances: list[Callable[[], int]] = [
            inst.queued for inst in pool.instances
        ]

    def enqueue(self, item: WorkItem) -> Coroutine[Any, Any, BackendResponse]:
        item.reschedule = self._run_again
        return self.run_on(None, item)  # its coroutine, awaited by the caller: no extra frame per request

    async def run_on(self, instance: PoolInstance | None, item: WorkItem) -> BackendResponse:
        """Run item alone in the caller's task, on `instance` (acquired from the pool) or on the next
        idle one, and wait for its response."""
        self._inflight += 1
        try:
            if instance is None:
                instance = self._pool.try_acquire()  # what acquire() does first, without its coroutine
            if instance is None:
                await self._run(item)
            else:
                await run_batch(self._pool, instance, [item], self._batching, self._stats, self._inline)
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
        await run_batch(self._pool, instance, [item], self._batching, self._stats, self._inline)

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
