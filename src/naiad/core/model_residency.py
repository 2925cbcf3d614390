"""Which models stay loaded: last use, measured memory, a memory budget and idle unloading."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger("naiad.residency")


@dataclass
class Resident:
    """What residency knows of one loaded model."""

    memory_bytes: int = 0
    last_used: float = 0.0
    in_flight: int = 0


class ResidencyManager:
    """Evicts least-recently-used idle models to stay under a budget, and models idle too long.

    Pinned models (named by --load-model) are never evicted. `unload(name, reason)` is the
    lifecycle's unload; evictions are counted per reason for the metrics.
    """

    def __init__(
        self,
        budget_bytes: int | None,
        idle_unload_secs: float | None,
        pinned: set[str],
        unload: Callable[[str, str], Awaitable[None]],
    ) -> None:
        self.budget_bytes = budget_bytes
        self.idle_unload_secs = idle_unload_secs
        self.pinned = pinned
        self._unload = unload
        self.residents: dict[str, Resident] = {}
        self.evictions: dict[str, int] = {"memory_budget": 0, "idle": 0}
        self.loads = 0
        self._task: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    @property
    def active(self) -> bool:
        return self.budget_bytes is not None or self.idle_unload_secs is not None

    def start(self) -> None:
        if self.active and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    # ------------------------------------------------------------ bookkeeping

    def loaded(self, name: str, memory_bytes: int) -> None:
        self.loads += 1
        resident = self.residents.setdefault(name, Resident())
        resident.memory_bytes = memory_bytes
        resident.last_used = time.monotonic()

    def unloaded(self, name: str) -> None:
        self.residents.pop(name, None)

    def begin_use(self, name: str) -> None:
        resident = self.residents.get(name)
        if resident is not None:
            resident.in_flight += 1
            resident.last_used = time.monotonic()

    def end_use(self, name: str) -> None:
        resident = self.residents.get(name)
        if resident is not None:
            resident.in_flight -= 1
            resident.last_used = time.monotonic()

    def used_bytes(self) -> int:
        return sum(r.memory_bytes for r in self.residents.values())

    # ------------------------------------------------------------ eviction

    def _victims(self, now: float) -> list[tuple[str, str]]:
        idle = [
            (r.last_used, name) for name, r in self.residents.items()
            if name not in self.pinned and r.in_flight == 0
        ]
        idle.sort()
        chosen: list[tuple[str, str]] = []
        if self.idle_unload_secs is not None:
            for last_used, name in idle:
                if now - last_used >= self.idle_unload_secs:
                    chosen.append((name, "idle"))
        if self.budget_bytes is not None:
            excess = self.used_bytes() - self.budget_bytes - sum(self.residents[n].memory_bytes for n, _ in chosen)
            for _, name in idle:
                if excess <= 0:
                    break
                if any(n == name for n, _ in chosen):
                    continue
                chosen.append((name, "memory_budget"))
                excess -= self.residents[name].memory_bytes
        return chosen

    async def enforce(self, keep: str = "") -> None:
        """Unload what the budget and idle rules call for (never `keep`, the model just loaded)."""
        async with self._lock:
            for name, reason in self._victims(time.monotonic()):
                if name == keep:
                    continue
                log.info("evicting model '%s' (%s)", name, reason.replace("_", " "))
                self.evictions[reason] += 1
                await self._unload(name, f"unloaded (evicted: {reason.replace('_', ' ')})")

    async def _watch(self) -> None:
        period = 1.0 if self.idle_unload_secs is None else max(min(self.idle_unload_secs / 4, 1.0), 0.05)
        while True:
            await asyncio.sleep(period)
            try:
                await self.enforce()
            except Exception:  # eviction must keep running whatever one unload did
                log.exception("model eviction failed")
