"""Which models stay loaded: last use, measured memory, a memory budget and idle unloading."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from naiad.runtime.memory import rss_bytes

log = logging.getLogger("naiad.residency")

# Past HIGH_WATERMARK of the budget, evict down to LOW_WATERMARK of it: what requests and first
# executions allocate between two checks then fits under the budget, and evictions come in batches.
HIGH_WATERMARK, LOW_WATERMARK = 0.95, 0.85
# After an eviction that did not lower the measured usage, the budget evicts again only once usage
# has grown by this share of the budget since (new pressure), or has fallen under HIGH_WATERMARK.
REGROWTH = 0.10
# How often the rules are checked between loads (more often when the idle time is short).
CHECK_SECS = 1.0


class WorkerProcess(Protocol):
    """An instance that runs in its own process (pid 0 once it has none)."""

    @property
    def pid(self) -> int: ...


@dataclass
class Resident:
    """What residency knows of one loaded model."""

    memory_bytes: int = 0
    last_used: float = 0.0
    in_flight: int = 0
    workers: tuple[WorkerProcess, ...] = ()  # its instances that run in their own process


class ResidencyManager:
    """Evicts least-recently-used idle models to stay under a budget, and models idle too long.

    The budget bounds what the server and its models' worker processes grew by since it started
    (`measure()`, by default their RSS, minus the base read at construction), or the sum of the
    models' load-time measurements if that is larger: a small model's load barely moves RSS
    (freed heap is reused) while its first requests, and a backend's one-time start-up, do.
    Pinned models (named by --load-model) are never evicted. `unload(name, reason)` is the
    lifecycle's unload; evictions are counted per reason for the metrics.
    """

    def __init__(
        self,
        budget_bytes: int | None,
        idle_unload_secs: float | None,
        pinned: set[str],
        unload: Callable[[str, str], Awaitable[None]],
        measure: Callable[[], int] | None = None,
    ) -> None:
        self.budget_bytes = budget_bytes
        self.idle_unload_secs = idle_unload_secs
        self.pinned = pinned
        self._unload = unload
        self.residents: dict[str, Resident] = {}
        self._holds: dict[str, int] = {}  # models requests are waiting to load: not evicted meanwhile
        self._measure = measure or self.resident_set_bytes
        self.base_bytes = self._measure() if budget_bytes is not None else 0
        self.evictions: dict[str, int] = {"memory_budget": 0, "idle": 0}
        self._stalled_at: int | None = None  # usage after the last eviction that did not lower it
        self.loads = 0
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        # Whether anything is ever evicted: only then does a request's begin_use/end_use matter.
        self.active = budget_bytes is not None or idle_unload_secs is not None

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

    def loaded(self, name: str, memory_bytes: int, workers: tuple[WorkerProcess, ...] = ()) -> None:
        self.loads += 1
        resident = self.residents.setdefault(name, Resident())
        resident.memory_bytes = memory_bytes
        resident.workers = workers
        resident.last_used = time.monotonic()

    def unloaded(self, name: str) -> None:
        self.residents.pop(name, None)

    def hold(self, name: str) -> None:
        """A request waits for `name` to load: keep it from eviction until it runs (`release`)."""
        self._holds[name] = self._holds.get(name, 0) + 1

    def release(self, name: str) -> None:
        count = self._holds.get(name, 0) - 1
        if count > 0:
            self._holds[name] = count
        else:
            self._holds.pop(name, None)

    def begin_use(self, name: str) -> None:
        # last_used is only read for residents with nothing in flight: end_use sets it, not this
        resident = self.residents.get(name)
        if resident is not None:
            resident.in_flight += 1

    def end_use(self, name: str) -> None:
        resident = self.residents.get(name)
        if resident is not None:
            resident.in_flight -= 1
            resident.last_used = time.monotonic()

    def resident_set_bytes(self) -> int:
        """RSS of this process plus that of the loaded models' worker processes."""
        workers = sum(rss_bytes(w.pid) for r in self.residents.values() for w in r.workers if w.pid)
        return rss_bytes() + workers

    def used_bytes(self) -> int:
        """What counts against the budget: measured growth since start, at least the models' sum."""
        attributed = sum(r.memory_bytes for r in self.residents.values())
        if self.budget_bytes is None:
            return attributed
        return max(attributed, self._measure() - self.base_bytes)

    # ------------------------------------------------------------ eviction

    def _evictable(self, keep: str) -> list[str]:
        """Idle, unpinned residents, least recently used first."""
        idle = [
            (r.last_used, name) for name, r in self.residents.items()
            if name not in self.pinned and name != keep and r.in_flight == 0 and name not in self._holds
        ]
        return [name for _, name in sorted(idle)]

    async def _evict(self, name: str, reason: str) -> None:
        log.info("evicting model '%s' (%s)", name, reason.replace("_", " "))
        self.evictions[reason] += 1
        await self._unload(name, f"unloaded (evicted: {reason.replace('_', ' ')})")

    async def enforce(self, keep: str = "") -> None:
        """Unload what the idle and budget rules call for (never `keep`, the model just loaded)."""
        async with self._lock:
            if self.idle_unload_secs is not None:
                now = time.monotonic()
                for name in self._evictable(keep):
                    resident = self.residents.get(name)
                    if resident is not None and now - resident.last_used >= self.idle_unload_secs:
                        await self._evict(name, "idle")
            if self.budget_bytes is not None:
                await self._enforce_budget(self.budget_bytes, keep)

    async def _enforce_budget(self, budget: int, keep: str) -> None:
        """Past HIGH_WATERMARK of the budget, evict least recently used idle models one at a time.

        Usage is measured again after each unload (which has handed freed heap back with
        malloc_trim); the round goes on until usage is under LOW_WATERMARK, nothing idle is left,
        or an eviction did not lower usage. Then what is over the budget is not the models' (a
        request's buffers, memory the allocator keeps): evicting more would empty the server and
        free nothing, so later rounds wait until usage has grown by REGROWTH of the budget.
        """
        used = self.used_bytes()
        if used <= budget * HIGH_WATERMARK:
            self._stalled_at = None
            return
        if self._stalled_at is not None and used < self._stalled_at + budget * REGROWTH:
            return
        self._stalled_at = None
        tried: set[str] = set()
        while used > budget * LOW_WATERMARK:
            victims = [n for n in self._evictable(keep) if n not in tried]
            if not victims:
                return
            tried.add(victims[0])
            await self._evict(victims[0], "memory_budget")
            after = self.used_bytes()
            if after >= used:
                self._stalled_at = after
                log.warning(
                    "evicting model '%s' did not lower memory use (%d MB of the %d MB budget): "
                    "no more evictions until it grows", victims[0], after // 10**6, budget // 10**6,
                )
                return
            used = after

    async def _watch(self) -> None:
        period = CHECK_SECS if self.idle_unload_secs is None else max(min(self.idle_unload_secs / 4, CHECK_SECS), 0.05)
        while True:
            await asyncio.sleep(period)
            try:
                await self.enforce()
            except Exception:  # eviction must keep running whatever one unload did
                log.exception("model eviction failed")
