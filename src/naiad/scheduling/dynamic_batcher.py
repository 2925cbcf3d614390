"""Dynamic batcher: gathers queued requests into batches (preferred sizes, queue delay, priorities, timeouts)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import BackendResponse
from naiad.observability.statistics import ModelStatistics
from naiad.protocol.errors import unavailable
from naiad.runtime.precise_timer import PreciseTimer
from naiad.runtime.thread_instance import InstancePool
from naiad.scheduling.base import WorkItem, can_join, execute_batch
from naiad.scheduling.direct import DirectScheduler
from naiad.scheduling.execution_policy import InlinePolicy, runs_at_once
from naiad.scheduling.queue_policy import QUEUE_FULL_MESSAGE, TIMEOUT_MESSAGE, PriorityLevel, build_levels, level_index


class DynamicBatcher:
    """One batching loop per model version; each idle instance takes the next batch formed."""

    def __init__(
        self, pool: InstancePool, stats: ModelStatistics, max_batch_size: int, batching: mc.ModelDynamicBatching,
        timer: PreciseTimer | None = None, inline: InlinePolicy | None = None,
    ) -> None:
        self._pool = pool
        self._stats = stats
        self._max_rows = max(max_batch_size, 1)
        self._batching = max_batch_size > 0
        # As Triton: without preferred sizes, max_batch_size is the preferred size.
        self._preferred = {s for s in batching.preferred_batch_size if 0 < s <= self._max_rows} or {self._max_rows}
        self._max_preferred = max(self._preferred)
        self._delay_ns = batching.max_queue_delay_microseconds * 1000
        self._preserve_ordering = batching.preserve_ordering
        self._inline = inline or InlinePolicy()
        # The zero-delay policy (execution_policy.py): a request that finds nothing queued and an
        # instance idle runs at once, the way the default scheduler runs every request.
        self._at_once = runs_at_once(batching)
        self._direct = DirectScheduler(pool, stats, self._batching, self._inline)
        self._levels, self._default_level = build_levels(batching)
        self._arrived = asyncio.Event()
        self._running: set[asyncio.Task[None]] = set()
        self._inflight = 0
        self._release_tail: asyncio.Future[None] | None = None
        self._loop = asyncio.get_running_loop()
        # Queue delays and timeouts are often below a millisecond, finer than the loop's timers.
        self._own_timer = timer is None
        self._timer = timer if timer is not None else PreciseTimer(self._loop)
        self._loop_task = self._loop.create_task(self._run())

    # ------------------------------------------------------------ admission

    async def enqueue(self, item: WorkItem) -> BackendResponse:
        # First, as nothing is queued then (no queue can be full, no queue timeout applies): the zero-delay policy.
        if self._at_once and self.pending() == 0:
            instance = self._pool.try_acquire()
            if instance is not None:
                self._close("idle_instance")
                return await self._direct.run_on(instance, item)
        request = item.request
        level = self._levels[level_index(request.priority if request else 0, len(self._levels), self._default_level)]
        policy = level.policy
        if policy.max_queue_size and level.size() >= policy.max_queue_size:
            raise unavailable(QUEUE_FULL_MESSAGE)
        timeout_us = policy.timeout_us(request.timeout_us if request else 0)
        timer = None
        if timeout_us:
            timer = self._timer.call_later_ns(timeout_us * 1000, self._expire, item, level)
        level.queue.append(item)
        self._arrived.set()
        previous, own = self._ordering_slot()
        self._inflight += 1
        try:
            queued: BackendResponse = await item.future
            return queued
        finally:
            self._inflight -= 1
            if timer is not None:
                timer.cancel()
            if item.future.cancelled():
                self._withdraw(item, level)
            if own is not None:
                await self._release_in_order(previous, own)

    def _withdraw(self, item: WorkItem, level: PriorityLevel) -> None:
        """A cancelled request leaves the queue at once, in O(1) (pending counts and batch formation see it gone)."""
        if level.queue.discard(item) or level.delayed.discard(item):
            self._arrived.set()

    def _ordering_slot(self) -> tuple[asyncio.Future[None] | None, asyncio.Future[None] | None]:
        if not self._preserve_ordering:
            return None, None
        previous = self._release_tail
        own = self._loop.create_future()
        self._release_tail = own
        return previous, own

    async def _release_in_order(self, previous: asyncio.Future[None] | None, own: asyncio.Future[None]) -> None:
        """preserve_ordering: a response waits until every earlier request's response was released."""
        try:
            if previous is not None:
                await asyncio.shield(previous)
        finally:
            own.set_result(None)

    def _expire(self, item: WorkItem, level: PriorityLevel) -> None:
        """A queue timeout fired: REJECT fails the request now; DELAY moves it behind the others."""
        if item.future.done() or not level.queue.discard(item):
            return
        if level.policy.delay_on_timeout:
            level.delayed.append(item)
        else:
            item.fail(unavailable(TIMEOUT_MESSAGE))

    def _close(self, reason: str) -> None:
        self._stats.record_batch_closed(reason)

    def inflight(self) -> int:
        return self._inflight + self._direct.inflight()

    def pending(self) -> int:
        total = 0  # a plain loop: enqueue asks this for every request
        for level in self._levels:
            total += len(level.queue) + len(level.delayed)
        return total

    # ------------------------------------------------------------ batch formation

    def _candidates(self) -> Iterator[WorkItem]:
        """Queued requests in scheduling order: levels highest first, then the delayed ones."""
        for level in self._levels:
            yield from level.queue
        for level in self._levels:
            yield from level.delayed

    def _prefix(self) -> tuple[list[WorkItem], bool]:
        """The longest run of compatible, still-wanted requests that fits in one batch, and whether
        a queued request was left out (too many rows or another shape: the batch cannot grow)."""
        items: list[WorkItem] = []
        rows = 0
        for item in self._candidates():
            if item.future.done():
                continue
            if items and (not self._batching or not can_join(items[0], item) or rows + item.batch_size > self._max_rows):
                return items, True
            items.append(item)
            rows += item.batch_size
        return items, False

    def _cut(self, items: list[WorkItem], blocked: bool) -> tuple[int, str]:
        """How many of items to send now and what closed the batch; (0, "") to wait for more.

        Triton's rule: the largest prefix of a preferred size goes at once (or, when the queue holds
        more than the largest preferred size, the prefix below it), unless the oldest request has
        waited max_queue_delay: then everything that fits goes, up to max_batch_size. Without a
        delay, or when the batch cannot grow, what is there goes.
        """
        rows, best, best_rows = 0, 0, 0
        for index, item in enumerate(items):
            if not best and index and rows + item.batch_size > self._max_preferred:
                best, best_rows = index, rows
            rows += item.batch_size
            if rows in self._preferred:
                best, best_rows = index + 1, rows
        expired = self._delay_ns > 0 and time.perf_counter_ns() - items[0].enqueue_ns >= self._delay_ns
        if best and not expired:
            return best, "max" if best_rows >= self._max_rows else "preferred"
        if rows >= self._max_rows:
            return len(items), "max"
        if expired:
            return len(items), "delay"
        if blocked or rows >= self._max_preferred:
            return len(items), "preferred"
        if self._delay_ns == 0:
            return len(items), "no_delay"
        return 0, ""

    async def _next_batch(self) -> list[WorkItem]:
        while True:
            self._drop_finished()
            items, blocked = self._prefix()
            if not items:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            cut, reason = self._cut(items, blocked)
            if cut:
                self._close(reason)
                return items[:cut]
            # Wake on the next arrival or when the oldest request's delay is up, whichever is first.
            remaining = items[0].enqueue_ns + self._delay_ns - time.perf_counter_ns()
            self._arrived.clear()
            wake = self._timer.call_later_ns(remaining, self._arrived.set)
            try:
                await self._arrived.wait()
            finally:
                wake.cancel()

    def _drop_finished(self) -> None:
        for level in self._levels:
            for queue in (level.queue, level.delayed):
                while queue and queue.peek().future.done():
                    queue.popleft()

    def _take(self, items: list[WorkItem]) -> None:
        queues = [queue for level in self._levels for queue in (level.queue, level.delayed)]
        for item in items:
            for queue in queues:
                if queue.discard(item):
                    break

    async def _wait_for_requests(self) -> None:
        while True:
            self._drop_finished()
            if any(level.size() for level in self._levels):
                return
            self._arrived.clear()
            await self._arrived.wait()

    async def _run(self) -> None:
        # Wait for work first, then for an instance: while every instance is busy, requests keep
        # queueing and the next free instance takes a batch formed from all of them.
        while True:
            await self._wait_for_requests()
            instance = self._pool.try_acquire()
            try:
                if instance is None:
                    instance = await self._pool.acquire()
                    # An execution just ended and its answers went out in this loop turn: closed-loop
                    # clients send their next requests at once. One turn more lets the ones already
                    # here be read and join this batch, which would otherwise go with only the
                    # requests that queued during the execution (under load: batches of 1 and 31
                    # alternating instead of full ones).
                    await asyncio.sleep(0)
                items = await self._next_batch()
            except asyncio.CancelledError:
                if instance is not None:
                    self._pool.release(instance)
                raise
            self._take(items)
            task = self._pool.run(instance, execute_batch(instance, items, self._batching, self._stats, self._inline))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def stop(self) -> None:
        self._loop_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._loop_task
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        for item in list(self._candidates()):
            item.fail(unavailable("model is being unloaded"))
        for level in self._levels:
            level.queue.clear()
            level.delayed.clear()
        if self._own_timer:
            self._timer.close()
