"""The budget rule on its own: measured usage, high/low watermarks, LRU order, holds and pins."""

import asyncio

from naiad.core.model_residency import (
    HIGH_WATERMARK,
    LOW_WATERMARK,
    REGROWTH,
    ResidencyManager,
)

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


def test_an_eviction_that_frees_nothing_ends_the_round_and_later_rounds_wait_for_growth():
    usage = [0]
    sizes = {f"m{i}": 0 for i in range(10)}  # unloading frees nothing measurable (the allocator keeps it)
    manager, unloaded = _manager(usage, sizes)
    usage[0] = 100 * MB
    asyncio.run(manager.enforce())
    assert unloaded == ["m0"]  # one try, not the whole server
    for _ in range(5):  # the periodic checks that follow: usage has not grown, nothing more goes
        asyncio.run(manager.enforce())
    assert unloaded == ["m0"]
    assert REGROWTH == 0.10
    usage[0] = 109 * MB
    asyncio.run(manager.enforce())
    assert unloaded == ["m0"]
    usage[0] = 110 * MB  # grown by REGROWTH of the budget since: new pressure, one more try
    asyncio.run(manager.enforce())
    assert unloaded == ["m0", "m1"]
    assert manager.evictions["memory_budget"] == 2


def test_usage_back_under_the_high_watermark_lifts_the_wait():
    usage = [0]
    sizes = {f"m{i}": 0 for i in range(4)}
    manager, unloaded = _manager(usage, sizes)
    usage[0] = 100 * MB
    asyncio.run(manager.enforce())
    assert unloaded == ["m0"]
    usage[0] = 50 * MB  # e.g. requests ended and their buffers were trimmed
    asyncio.run(manager.enforce())
    usage[0] = 96 * MB  # a new pressure event, though smaller than REGROWTH above the stalled point
    asyncio.run(manager.enforce())
    assert unloaded == ["m0", "m1"]


def test_evictions_that_free_memory_go_on_past_one_that_frees_less():
    usage = [0]
    sizes = {"a": 1 * MB, "b": 4 * MB, "c": 4 * MB, "d": 4 * MB}
    manager, unloaded = _manager(usage, sizes)
    usage[0] = 96 * MB
    asyncio.run(manager.enforce())
    assert unloaded == ["a", "b", "c", "d"]  # each lowered usage, a little or more, until under the low watermark
    assert usage[0] == 83 * MB
