"""The budget rule on its own: measured usage, high/low watermarks, LRU order, holds and pins."""

import asyncio

from naiad.core.model_residency import HIGH_WATERMARK, LOW_WATERMARK, ResidencyManager

MB = 10**6


def _manager(usage: list[int], sizes: dict[str, int], pinned: set[str] = frozenset()) -> tuple[ResidencyManager, list[str]]:
    """A manager over fake models: unloading one lowers the measured usage by its size."""
    unloaded: list[str] = []

    async def unload(name: str, reason: str) -> None:
        unloaded.append(name)
        usage[0] -= sizes[name]
        manager.unloaded(name)

    manager = ResidencyManager(100 * MB, None, set(pinned), unload, measure=lambda: usage[0])
    for name in sizes:  # loaded (and last used) in this order
        manager.loaded(name, 1)
    return manager, unloaded


def test_measured_usage_past_the_high_watermark_evicts_lru_down_to_the_low_one():
    usage = [0]  # the base, read at construction
    sizes = {f"m{i}": 10 * MB for i in range(10)}
    manager, unloaded = _manager(usage, sizes)
    usage[0] = int(100 * MB * HIGH_WATERMARK)  # at the high watermark: nothing happens yet
    asyncio.run(manager.enforce())
    assert unloaded == []
    usage[0] = 100 * MB  # load-time measurements say 10 bytes; the measured growth is what counts
    asyncio.run(manager.enforce(keep="m9"))
    assert unloaded == ["m0", "m1"]  # least recently used first, until under the low watermark
    assert usage[0] <= 100 * MB * LOW_WATERMARK
    assert manager.evictions["memory_budget"] == 2


def test_held_in_flight_pinned_and_kept_models_are_not_evicted():
    usage = [0]
    sizes = {name: 30 * MB for name in ("pinned", "held", "busy", "kept", "free")}
    manager, unloaded = _manager(usage, sizes, pinned={"pinned"})
    manager.hold("held")
    manager.begin_use("busy")
    usage[0] = 150 * MB
    asyncio.run(manager.enforce(keep="kept"))
    assert unloaded == ["free"]  # the only candidate; still over budget, nothing else may go
    manager.release("held")
    asyncio.run(manager.enforce(keep="kept"))
    assert unloaded == ["free", "held"]
