"""Dynamic batcher: gathers queued requests into batches up to max_batch_size within a queue delay."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time

from naiad.backends.base import BackendResponse
from naiad.observability.statistics import ModelStatistics
from naiad.protocol.errors import unavailable
from naiad.runtime.thread_instance import InstancePool
from naiad.scheduling.base import Instance, WorkItem, can_join, execute_batch


class DynamicBatcher:
    """One batching loop per model version; each idle instance takes the next batch formed."""

    def __init__(
        self,
        pool: InstancePool,
        stats: ModelStatistics,
        max_batch_size: int,
        preferred_batch_sizes: list[int],
        max_queue_delay_us: int,
    ) -> None:
        self._pool = pool
        self._stats = stats
        self._max_rows = max(max_batch_size, 1)
        self._batching = max_batch_size > 0
        # Batch as soon as the largest preferred size is reached; otherwise wait out the delay.
        preferred = [s for s in preferred_batch_sizes if 0 < s <= self._max_rows]
        self._target_rows = max(preferred) if preferred else self._max_rows
        self._delay_ns = max_queue_delay_us * 1000
        self._queue: collections.deque[WorkItem] = collections.deque()
        self._arrived = asyncio.Event()
        self._running: set[asyncio.Task] = set()
        self._inflight = 0
        self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def enqueue(self, item: WorkItem) -> BackendResponse:
        self._inflight += 1
        try:
            self._queue.append(item)
            self._arrived.set()
            return await item.future
        finally:
            self._inflight -= 1

    def inflight(self) -> int:
        return self._inflight

    def _prefix(self) -> tuple[list[WorkItem], int]:
        """The longest run of compatible, still-wanted requests from the head that fits in a batch."""
        while self._queue and self._queue[0].future.done():
            self._queue.popleft()
        items: list[WorkItem] = []
        rows = 0
        for item in self._queue:
            if item.future.done():
                continue
            if items and (not self._batching or not can_join(items[0], item)):
                break
            if rows + item.batch_size > self._max_rows and items:
                break
            items.append(item)
            rows += item.batch_size
            if not self._batching:
                break
        return items, rows

    async def _wait_for_batch(self) -> list[WorkItem]:
        while True:
            items, rows = self._prefix()
            if not items:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            if rows >= self._target_rows or self._delay_ns == 0:
                return items
            remaining = items[0].enqueue_ns + self._delay_ns - time.perf_counter_ns()
            if remaining <= 0:
                return items
            self._arrived.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining / 1e9)

    async def _run(self) -> None:
        while True:
            instance = await self._pool.acquire()
            try:
                items = await self._wait_for_batch()
            except asyncio.CancelledError:
                self._pool.release(instance)
                raise
            chosen = set(map(id, items))
            self._queue = collections.deque(it for it in self._queue if id(it) not in chosen)
            task = asyncio.get_running_loop().create_task(self._execute(instance, items))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _execute(self, instance: Instance, items: list[WorkItem]) -> None:
        try:
            await execute_batch(instance, items, self._batching, self._stats)
        finally:
            self._pool.release(instance)

    async def stop(self) -> None:
        self._loop_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._loop_task
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        while self._queue:
            item = self._queue.popleft()
            item.fail(unavailable("model is being unloaded"))
