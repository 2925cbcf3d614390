"""Runs one model instance on its own thread so a blocking framework call never blocks the event loop."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

import numpy as np

from naiad.backends.base import ChatTemplate, ExecutionBatch, ModelInstance, PoolInstance
from naiad.runtime.removable_queue import RemovableQueue


class ThreadInstance:
    """A ModelInstance plus the single thread it executes on (one batch at a time): the thread adapter,
    a TensorInstance (naiad.backends.base).

    The scheduler chooses, per execution, between this thread (`execute()`) and the caller's
    thread (`execute_inline()`): see `InlinePolicy` in naiad/scheduling/execution_policy.py.
    """

    executes: Final = "tensors"
    tracks_unfinished = True
    in_worker_process = False
    pid = 0

    def __init__(self, instance: ModelInstance) -> None:
        self.instance = instance
        self.name = instance.name
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"naiad-{instance.name}")
        self._unfinished: concurrent.futures.Future[dict[str, np.ndarray]] | None = None
        # CPU time of the thread in the last execute() (read once it returned).
        self.last_thread_ns = 0

    def execute_inline(self, batch: ExecutionBatch) -> dict[str, np.ndarray]:
        """Run batch on the caller's thread: the event loop waits for it."""
        return self.instance.execute(batch)

    async def execute(self, batch: ExecutionBatch) -> dict[str, np.ndarray]:
        """Run batch on the instance's thread."""
        running = self._executor.submit(self._timed, batch)
        try:
            return await asyncio.wrap_future(running)
        except asyncio.CancelledError:
            # The caller gave up; the thread cannot be stopped. The instance stays busy until it ends
            # (a submission not started yet is cancelled with the awaited future and ends at once).
            self._unfinished = running
            raise

    def take_unfinished(self) -> concurrent.futures.Future[dict[str, np.ndarray]] | None:
        """After a cancelled execute: the execution still running on the thread (None if none)."""
        running, self._unfinished = self._unfinished, None
        return running

    def _timed(self, batch: ExecutionBatch) -> dict[str, np.ndarray]:
        # CPU time of this thread, not wall time: the thread also waits for the core (which the event
        # loop may hold) and for the GIL, and counting those waits kept small models (a 33 us MLP) off
        # the loop forever.
        start = time.thread_time_ns()
        try:
            return self.instance.execute(batch)
        finally:
            self.last_thread_ns = time.thread_time_ns() - start

    def queued(self) -> int:
        return 0

    def takes_at_once(self) -> int:
        return 1  # one thread, one execution at a time

    def restarts(self) -> int:
        return 0  # the thread's model lives as long as the instance

    def memory_bytes(self) -> int:
        return 0  # the model lives in the server process, measured with it

    def chat_template(self) -> ChatTemplate | None:
        return None

    def healthy(self) -> bool:
        return True

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.instance.close()

    async def aclose(self) -> None:
        self.close()


class InstancePool:
    """The instances of one model version (tensor or request-level); idle ones are handed out first-come.

    A caller may ask for one particular instance (the sequence batcher keeps each sequence on the
    instance it started on); such callers are served before those taking any instance. A waiter
    whose caller is cancelled leaves its queue in O(1), however many wait.

    An instance released while callers wait for any instance goes to as many of them as it takes at
    once (`takes_at_once`: a Python model's worker with room in its pipeline), and is idle again when
    the last of them released it. Handed to one waiter at a time, each hand-over costs a turn of the
    event loop: at c=32 a Python model's requests then queued here in a convoy, one handed over per
    turn however fast the worker was, at ~20% more CPU per request (unpinned, wrk JSON add_sub).
    """

    def __init__(self, instances: list[PoolInstance]) -> None:
        self.instances = instances
        self._idle: collections.deque[PoolInstance] = collections.deque(instances)
        self._waiters: RemovableQueue[asyncio.Future[PoolInstance]] = RemovableQueue()  # callers taking any instance
        self._wanted: dict[int, RemovableQueue[asyncio.Future[PoolInstance]]] = {
            id(inst): RemovableQueue() for inst in instances
        }
        self._executions: set[asyncio.Future[None]] = set()  # executions the pool waits for before closing
        self._shared: dict[int, int] = {}  # id(instance) -> its holders beyond the first, when handed to several
        # Callers in _waiters, and in any queue: counted, so that acquiring and releasing while nobody
        # waits (every request at low concurrency) looks into no queue.
        self._waiting_any = 0
        self._waiting = 0

    async def acquire(self, instance: PoolInstance | None = None) -> PoolInstance:
        """An idle instance (that one, when given), waiting for it as long as needed."""
        granted = self.try_acquire(instance)
        if granted is not None:
            return granted
        anyone = instance is None
        waiters = self._waiters if anyone else self._wanted[id(instance)]
        future: asyncio.Future[PoolInstance] = asyncio.get_running_loop().create_future()
        waiters.append(future)
        self._count_waiter(anyone, 1)
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(future.result())  # granted, but the caller went away
            elif waiters.discard(future):
                self._count_waiter(anyone, -1)
            raise

    def _count_waiter(self, anyone: bool, change: int) -> None:
        self._waiting += change
        if anyone:
            self._waiting_any += change

    def try_acquire(self, instance: PoolInstance | None = None) -> PoolInstance | None:
        """An idle instance (that one, when given) right now, or None; earlier waiters go first."""
        if instance is None:
            if self._waiting_any or not self._idle:
                return None
            return self._idle.popleft()
        if self._wanted[id(instance)] or instance not in self._idle:
            return None
        self._idle.remove(instance)  # a handful of instances: linear is fine
        return instance

    def release(self, instance: PoolInstance) -> None:
        key = id(instance)
        shared = self._shared
        if shared:
            others = shared.get(key)
            if others:  # another holder still has it
                if others == 1:
                    del shared[key]
                else:
                    shared[key] = others - 1
                return
        if self._waiting:
            wanted = self._wanted.get(key)
            while wanted:
                future = wanted.popleft()
                self._count_waiter(False, -1)
                if not future.done():  # a cancelled caller may not have withdrawn yet
                    future.set_result(instance)
                    return
            waiters = self._waiters
            if waiters:
                room = instance.takes_at_once() if len(waiters) > 1 else 1
                granted = 0
                while waiters and granted < room:
                    future = waiters.popleft()
                    self._count_waiter(True, -1)
                    if not future.done():
                        future.set_result(instance)
                        granted += 1
                if granted:
                    if granted > 1:
                        shared[key] = granted - 1
                    return
        self._idle.append(instance)

    def run(self, instance: PoolInstance, execution: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run an execution on an acquired instance as a task of its own, then release the instance.

        Whoever awaits the task may stop waiting (its request was cancelled): the execution goes on,
        and the instance becomes idle only once it has really ended, never while its thread or worker
        is still busy with it.
        """
        task = asyncio.get_running_loop().create_task(self._hold(instance, execution))
        self._executions.add(task)
        task.add_done_callback(self._executions.discard)
        return task

    async def _hold(self, instance: PoolInstance, execution: Coroutine[Any, Any, None]) -> None:
        try:
            await execution
        finally:
            self.release(instance)

    def release_when_finished(self, instance: PoolInstance,
                              unfinished: asyncio.Future[Any] | concurrent.futures.Future[Any] | None,
                              on_finished: Callable[[], None]) -> None:
        """An execution's caller was cancelled: release the instance (and call on_finished) only once the
        execution still running on its thread or worker has ended; at once when nothing is running."""
        if unfinished is None or unfinished.done():
            self.release(instance)
            return
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()
        self._executions.add(ended)

        def finished() -> None:
            self._executions.discard(ended)
            try:
                on_finished()
            finally:
                self.release(instance)
                if not ended.done():
                    ended.set_result(None)

        if isinstance(unfinished, concurrent.futures.Future):
            unfinished.add_done_callback(lambda _: loop.call_soon_threadsafe(finished))
        else:
            unfinished.add_done_callback(lambda _: finished())

    async def _wait_for_executions(self) -> None:
        """Executions whose requests were all cancelled may outlive their scheduler: close waits for them."""
        while self._executions:
            await asyncio.gather(*self._executions, return_exceptions=True)

    def healthy(self) -> bool:
        return all(inst.healthy() for inst in self.instances)

    async def close(self) -> None:
        await self._wait_for_executions()
        for inst in self.instances:
            await inst.aclose()
