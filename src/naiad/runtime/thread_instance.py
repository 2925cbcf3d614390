"""Runs one model instance on its own thread so a blocking framework call never blocks the event loop."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from naiad.backends.base import ExecutionBatch, ModelInstance


class ThreadInstance:
    """A ModelInstance plus the single thread it executes on (one batch at a time)."""

    def __init__(self, instance: ModelInstance) -> None:
        self.instance = instance
        self.name = instance.name
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"naiad-{instance.name}")

    async def execute(self, batch: ExecutionBatch) -> dict[str, np.ndarray]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.instance.execute, batch)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.instance.close()


class InstancePool:
    """The instances of one model version (thread-run or request-level); idle ones are handed out first-come."""

    def __init__(self, instances: list) -> None:
        self.instances = instances
        self._idle: asyncio.Queue[ThreadInstance] = asyncio.Queue()
        for inst in instances:
            self._idle.put_nowait(inst)

    async def acquire(self):  # -> ThreadInstance | RequestModelInstance
        return await self._idle.get()

    def release(self, instance) -> None:
        self._idle.put_nowait(instance)

    def healthy(self) -> bool:
        return all(getattr(inst, "healthy", lambda: True)() for inst in self.instances)

    async def close(self) -> None:
        for inst in self.instances:
            if isinstance(inst, ThreadInstance):
                inst.close()
            else:
                await inst.aclose()
