"""Measurement windows: per-request records -> window statistics, the stability rule, merging, percentiles."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from naiad.tools.v2client import StatsSnapshot

# Columns of a record array (one row per completed request), all int64 nanoseconds except counts.
START, END, SEND, RECV, FIRST, RESPONSES, LAG = range(7)
RECORD_WIDTH = 7
STABILITY_WINDOWS = 3


def empty_records() -> np.ndarray:
    return np.zeros((0, RECORD_WIDTH), dtype=np.int64)


def percentile_ns(latencies: np.ndarray, percent: float) -> float:
    """Nearest-rank percentile: the smallest value with at least `percent`% of values at or below it."""
    if latencies.size == 0:
        return 0.0
    ordered = np.sort(latencies)
    rank = max(1, math.ceil(percent / 100.0 * ordered.size))
    return float(ordered[min(rank, ordered.size) - 1])


@dataclass
class ServerBreakdown:
    """Per-request server averages (µs) from the difference of two statistics snapshots."""

    request_count: int = 0
    inference_count: int = 0
    execution_count: int = 0
    fail_count: int = 0
    cache_hit_count: int = 0
    latency_us: float = 0.0
    queue_us: float = 0.0
    compute_input_us: float = 0.0
    compute_infer_us: float = 0.0
    compute_output_us: float = 0.0

    @property
    def overhead_us(self) -> float:
        parts = self.queue_us + self.compute_input_us + self.compute_infer_us + self.compute_output_us
        return max(0.0, self.latency_us - parts)

    @classmethod
    def from_delta(cls, delta: StatsSnapshot) -> ServerBreakdown:
        def avg(ns: int, count: int) -> float:
            return ns / count / 1000.0 if count > 0 else 0.0

        return cls(
            request_count=delta.success_count,
            inference_count=delta.inference_count,
            execution_count=delta.execution_count,
            fail_count=delta.fail_count,
            cache_hit_count=delta.cache_hit_count,
            latency_us=avg(delta.success_ns, delta.success_count),
            queue_us=avg(delta.queue_ns, delta.queue_count),
            compute_input_us=avg(delta.compute_input_ns, delta.compute_input_count),
            compute_infer_us=avg(delta.compute_infer_ns, delta.compute_infer_count),
            compute_output_us=avg(delta.compute_output_ns, delta.compute_output_count),
        )


@dataclass
class WindowStats:
    """What one measurement window (or a merge of windows) saw."""

    duration_ns: int
    batch_size: int
    latencies_ns: np.ndarray
    send_ns_total: int = 0
    recv_ns_total: int = 0
    first_response_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    responses: int = 0
    delayed: int = 0
    server_delta: StatsSnapshot | None = None

    @property
    def count(self) -> int:
        return int(self.latencies_ns.size)

    @property
    def throughput(self) -> float:
        """Inferences per second: completed requests x batch size / window seconds."""
        return self.count * self.batch_size / (self.duration_ns / 1e9) if self.duration_ns > 0 else 0.0

    @property
    def response_throughput(self) -> float:
        """Responses per second (a decoupled model sends several per request), as perf_analyzer's column."""
        return self.responses * self.batch_size / (self.duration_ns / 1e9) if self.duration_ns > 0 else 0.0

    @property
    def request_rate(self) -> float:
        return self.count / (self.duration_ns / 1e9) if self.duration_ns > 0 else 0.0

    def avg_latency_us(self) -> float:
        return float(self.latencies_ns.mean()) / 1000.0 if self.count else 0.0

    def std_latency_us(self) -> float:
        return float(self.latencies_ns.std()) / 1000.0 if self.count else 0.0

    def percentile_us(self, percent: float) -> float:
        return percentile_ns(self.latencies_ns, percent) / 1000.0

    def latency_metric_us(self, percentile: float) -> float:
        """The latency used for stability and reports: average, or pN when a percentile was asked."""
        return self.avg_latency_us() if percentile <= 0 else self.percentile_us(percentile)

    def avg_send_us(self) -> float:
        return self.send_ns_total / self.count / 1000.0 if self.count else 0.0

    def avg_recv_us(self) -> float:
        return self.recv_ns_total / self.count / 1000.0 if self.count else 0.0

    def server(self) -> ServerBreakdown | None:
        return None if self.server_delta is None else ServerBreakdown.from_delta(self.server_delta)


def summarize_window(records: np.ndarray, t0: int, t1: int, batch_size: int,
                     server_delta: StatsSnapshot | None, delay_tolerance_ns: int = 1_000_000) -> WindowStats:
    """Requests that completed in [t0, t1) make the window."""
    inside = records[(records[:, END] >= t0) & (records[:, END] < t1)] if records.size else empty_records()
    first = inside[:, FIRST]
    return WindowStats(
        duration_ns=t1 - t0,
        batch_size=batch_size,
        latencies_ns=inside[:, END] - inside[:, START],
        send_ns_total=int(inside[:, SEND].sum()),
        recv_ns_total=int(inside[:, RECV].sum()),
        first_response_ns=np.where(first > 0, first - inside[:, START], 0),
        responses=int(inside[:, RESPONSES].sum()),
        delayed=int((inside[:, LAG] > delay_tolerance_ns).sum()),
        server_delta=server_delta,
    )


def _spread_ok(values: list[float], threshold: float) -> bool:
    low, high = min(values), max(values)
    if low <= 0:
        return high <= 0
    return high / low <= 1.0 + threshold


def is_stable(windows: list[WindowStats], stability_percent: float, percentile: float = -1,
              count: int = STABILITY_WINDOWS) -> bool:
    """perf_analyzer's rule: the last `count` windows all completed requests, and their throughputs and
    latencies (average or pN) each have max/min within stability_percent."""
    if len(windows) < count:
        return False
    last = windows[-count:]
    if any(w.count == 0 for w in last):
        return False
    threshold = stability_percent / 100.0
    return (_spread_ok([w.throughput for w in last], threshold)
            and _spread_ok([w.latency_metric_us(percentile) for w in last], threshold))


def merge_windows(windows: list[WindowStats]) -> WindowStats:
    """One WindowStats for several consecutive windows (the reported measurement)."""
    if not windows:
        raise ValueError("no windows to merge")
    deltas = [w.server_delta for w in windows]
    server = None
    if all(d is not None for d in deltas):
        server = StatsSnapshot()
        for d in deltas:
            server = StatsSnapshot(**{k: getattr(server, k) + getattr(d, k) for k in server.__dataclass_fields__})
    return WindowStats(
        duration_ns=sum(w.duration_ns for w in windows),
        batch_size=windows[0].batch_size,
        latencies_ns=np.concatenate([w.latencies_ns for w in windows]),
        send_ns_total=sum(w.send_ns_total for w in windows),
        recv_ns_total=sum(w.recv_ns_total for w in windows),
        first_response_ns=np.concatenate([w.first_response_ns for w in windows]),
        responses=sum(w.responses for w in windows),
        delayed=sum(w.delayed for w in windows),
        server_delta=server,
    )
