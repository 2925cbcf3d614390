"""Reading timings taken on a loaded machine."""

from __future__ import annotations

import statistics


def quietest_median(samples: list[int], window: int = 50) -> float:
    """The lowest median over consecutive windows of samples.

    Other work on the machine delays wake-ups for a while at times; the quietest stretch still
    shows what the code does (a timer rounded to milliseconds is late in every window).
    """
    return min(statistics.median(samples[i:i + window]) for i in range(0, len(samples), window))
