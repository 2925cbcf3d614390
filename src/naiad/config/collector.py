"""How every served process sets up Python's garbage collector once start-up is done."""

from __future__ import annotations

import gc

# Young-generation collections start after this many more container allocations than frees
# (CPython's default is 700). Requests waiting for a batch hold their objects for a while: with 32
# of them in flight the young generation passed 700 every ~9 requests and each collection walked
# every waiting request to free nothing (the request path makes no reference cycles): 5-15 us per
# request with dynamic batching at c=32 (benchmarks/README.md, "Garbage collection"). Cyclic
# garbage still gets collected, after at most this many allocations.
YOUNG_COLLECTION_THRESHOLD = 10_000


def freeze_startup_heap() -> None:
    """Keep the objects alive at the end of start-up out of every later garbage collection.

    A served process holds tens of thousands of long-lived objects after start-up (modules,
    model configs, protobuf descriptors); every full (oldest-generation) collection walks them
    all: 20-70 ms pauses of the event loop several times a second under load, which set the
    HTTP p99. Collect once, then freeze what survives: later collections walk only the objects
    created since. (What start-up left reachable stays alive in any case.) Young collections then
    wait for YOUNG_COLLECTION_THRESHOLD allocations.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *gc.get_threshold()[1:])
