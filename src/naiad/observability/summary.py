"""Latency summaries (`--metrics-config summary_latencies=true`): Prometheus summaries over a sliding window.

Triton's summaries (prometheus-cpp) keep a 60 s window in 5 age buckets and estimate each
quantile within its configured error. Here the window keeps the observations themselves, so a
quantile is exact while a bucket holds fewer than `_BUCKET_CAP` samples (past that, a uniform
reservoir keeps its estimate well inside the usual 0.1%-5% errors).
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable

DEFAULT_QUANTILES: tuple[tuple[float, float], ...] = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))
MAX_AGE_SECS = 60.0
AGE_BUCKETS = 5
_BUCKET_CAP = 10_000

# family name, HELP text (Triton 2.51's texts, compute ones shared with the counters), statistics key
SUMMARY_FAMILIES = (
    ("nv_inference_request_summary_us", "Summary of inference request duration in microseconds (includes cached requests)", "request"),
    ("nv_inference_queue_summary_us", "Summary of inference queuing duration in microseconds (includes cached requests)", "queue"),
    ("nv_inference_compute_input_summary_us", "Cumulative compute input duration in microseconds (does not include cached requests)", "compute_input"),
    ("nv_inference_compute_infer_summary_us", "Cumulative compute inference duration in microseconds (does not include cached requests)", "compute_infer"),
    ("nv_inference_compute_output_summary_us", "Cumulative inference compute output duration in microseconds (does not include cached requests)", "compute_output"),
)
# only for models with the response cache enabled
CACHE_SUMMARY_FAMILIES = (
    ("nv_cache_hit_summary_per_model", "Summary of cache hit duration per model, in microseconds", "cache_hit"),
    ("nv_cache_miss_summary_per_model", "Summary of cache miss duration per model, in microseconds", "cache_miss"),
)


def parse_quantiles(text: str | None) -> tuple[tuple[float, float], ...]:
    """`0.5:0.05,0.9:0.01,...` (quantile:error pairs, spaces and quotes allowed) → sorted pairs."""
    if text is None or not text.strip().strip('"'):
        return DEFAULT_QUANTILES
    pairs = []
    for item in text.strip().strip('"').split(","):
        quantile, sep, error = item.strip().partition(":")
        try:
            q, e = float(quantile), float(error)
        except ValueError:
            raise ValueError(f"summary_quantiles expects <quantile>:<error> pairs, got '{item.strip()}'") from None
        if not sep or not 0.0 <= q <= 1.0 or not 0.0 <= e <= 1.0:
            raise ValueError(f"summary_quantiles expects <quantile>:<error> pairs within [0, 1], got '{item.strip()}'")
        pairs.append((q, e))
    return tuple(sorted(pairs))


class WindowSummary:
    """Count and sum since creation; quantiles over the last MAX_AGE_SECS of observations."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._span = MAX_AGE_SECS / AGE_BUCKETS
        self._buckets: list[tuple[float, list[int], list[int]]] = []  # (start, samples, seen)
        self.count = 0
        self.sum = 0

    def observe(self, value: int, amount: int | None = None) -> None:
        """Add `value` to the window and `amount` (default: the value) to the sum."""
        now = self._clock()
        with self._lock:
            self.count += 1
            self.sum += value if amount is None else amount
            if not self._buckets or now - self._buckets[-1][0] >= self._span:
                self._buckets.append((now, [], [0]))
                self._expire(now)
            _, samples, seen = self._buckets[-1]
            seen[0] += 1
            if len(samples) < _BUCKET_CAP:
                samples.append(value)
            else:
                slot = random.randrange(seen[0])
                if slot < _BUCKET_CAP:
                    samples[slot] = value

    def _expire(self, now: float) -> None:
        while self._buckets and now - self._buckets[0][0] >= MAX_AGE_SECS:
            self._buckets.pop(0)

    def snapshot(self, quantiles: tuple[tuple[float, float], ...]) -> tuple[list[tuple[float, float]], int, int]:
        """([(quantile, value)], sum, count); a quantile is NaN when the window is empty, as in Triton."""
        with self._lock:
            self._expire(self._clock())
            window = sorted(v for _, samples, _ in self._buckets for v in samples)
            total, count = self.sum, self.count
        values = []
        for q, _ in quantiles:
            if not window:
                values.append((q, math.nan))
                continue
            rank = min(max(math.ceil(q * len(window)) - 1, 0), len(window) - 1)
            values.append((q, float(window[rank])))
        return values, total, count


class LatencySummaries:
    """The five per-model summaries, fed in nanoseconds and reported in microseconds.

    Sums are kept in nanoseconds so `_sum` equals the matching `*_duration_us` counter exactly."""

    def __init__(self, quantiles: tuple[tuple[float, float], ...], clock: Callable[[], float] = time.monotonic) -> None:
        self.quantiles = quantiles
        self.series = {key: WindowSummary(clock) for _, _, key in SUMMARY_FAMILIES + CACHE_SUMMARY_FAMILIES}

    def observe(self, key: str, ns: int, times: int = 1) -> None:
        summary = self.series[key]
        for _ in range(times):
            summary.observe(ns // 1000, ns)

    def snapshot(self, key: str) -> tuple[list[tuple[float, float]], int, int]:
        """([(quantile, µs)], sum in µs, count) of one summary."""
        values, total_ns, count = self.series[key].snapshot(self.quantiles)
        return values, total_ns // 1000, count
