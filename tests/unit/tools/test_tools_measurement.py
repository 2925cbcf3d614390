"""perf's measurement windows: percentiles, window cutting, the stability rule, merging, server breakdown."""

import numpy as np
import pytest

from naiad.tools.perf.measurement import (
    ServerBreakdown,
    WindowStats,
    is_stable,
    merge_windows,
    percentile_ns,
    summarize_window,
)
from naiad.tools.v2client import StatsSnapshot

SECOND = 1_000_000_000


def window(throughput: float, latency_us: float, seconds: float = 1.0, spread: float = 0.0) -> WindowStats:
    """A synthetic window: `throughput` requests/s for `seconds`, latencies around latency_us."""
    count = int(round(throughput * seconds))
    lat = np.full(count, latency_us * 1000.0)
    if spread and count:
        lat = lat + np.linspace(-spread, spread, count) * 1000.0
    return WindowStats(duration_ns=int(seconds * SECOND), batch_size=1, latencies_ns=lat.astype(np.int64))


def test_percentile_is_nearest_rank():
    values = np.arange(1, 101, dtype=np.int64)
    assert percentile_ns(values, 50) == 50
    assert percentile_ns(values, 99) == 99
    assert percentile_ns(values, 100) == 100
    assert percentile_ns(np.array([7]), 99) == 7
    assert percentile_ns(np.array([], dtype=np.int64), 99) == 0


def test_stable_when_last_three_windows_agree():
    windows = [window(500, 900), window(1000, 1000), window(1040, 1010), window(990, 1030)]
    assert is_stable(windows, 10)
    assert not is_stable(windows[:3], 10)  # the first window ramps up


def test_needs_three_windows():
    assert not is_stable([window(1000, 1000), window(1000, 1000)], 10)


def test_throughput_spread_beyond_threshold_is_unstable():
    windows = [window(1000, 1000), window(1150, 1000), window(1000, 1000)]
    assert not is_stable(windows, 10)
    assert is_stable(windows, 20)


def test_latency_spread_beyond_threshold_is_unstable():
    windows = [window(1000, 1000), window(1000, 1200), window(1000, 1000)]
    assert not is_stable(windows, 10)
    assert is_stable(windows, 25)


def test_window_without_requests_is_never_stable():
    windows = [window(1000, 1000), window(0, 0), window(1000, 1000)]
    assert not is_stable(windows, 1000)


def test_percentile_stability_uses_the_tail():
    # about the same average latency, but one window has a slow 2% tail: only p99 notices
    calm = window(1000, 1000)
    tail = window(1000, 900)
    tail.latencies_ns = tail.latencies_ns.copy()
    tail.latencies_ns[-20:] = 6_000_000
    assert abs(tail.avg_latency_us() / calm.avg_latency_us() - 1) < 0.01
    windows = [calm, tail, calm]
    assert is_stable(windows, 10, percentile=-1)
    assert not is_stable(windows, 10, percentile=99)


def test_summarize_counts_requests_completed_inside_the_window():
    # rows: start, end, send, recv, first, responses, lag
    records = np.array([
        [0, 50, 1, 2, 40, 1, 0],        # before the window
        [90, 110, 1, 2, 105, 1, 0],     # completes inside
        [150, 180, 3, 4, 170, 1, 2_000_000],  # inside, delayed
        [190, 200, 1, 2, 195, 1, 0],    # ends exactly at t1: next window
    ], dtype=np.int64)
    stats = summarize_window(records, 100, 200, batch_size=4, server_delta=None)
    assert stats.count == 2
    assert list(stats.latencies_ns) == [20, 30]
    assert stats.send_ns_total == 4 and stats.recv_ns_total == 6
    assert stats.delayed == 1
    assert stats.throughput == pytest.approx(2 * 4 / (100 / SECOND))


def test_merge_adds_durations_counts_and_server_deltas():
    a, b = window(100, 1000), window(300, 2000)
    a.server_delta = StatsSnapshot(success_count=100, success_ns=100 * 900_000, queue_count=100, queue_ns=100 * 100_000)
    b.server_delta = StatsSnapshot(success_count=300, success_ns=300 * 900_000, queue_count=300, queue_ns=300 * 100_000)
    merged = merge_windows([a, b])
    assert merged.count == 400
    assert merged.throughput == pytest.approx(200.0)
    assert merged.avg_latency_us() == pytest.approx(1750.0)
    server = merged.server()
    assert server.request_count == 400 and server.latency_us == pytest.approx(900.0)
    assert server.queue_us == pytest.approx(100.0) and server.overhead_us == pytest.approx(800.0)


def test_server_breakdown_from_statistics_json():
    entry = {"name": "m", "version": "1", "inference_count": "40", "execution_count": 10, "inference_stats": {
        "success": {"count": 20, "ns": 20_000_000}, "fail": {"count": 1, "ns": 5},
        "queue": {"count": 20, "ns": 2_000_000}, "compute_input": {"count": 20, "ns": 1_000_000},
        "compute_infer": {"count": 20, "ns": 10_000_000}, "compute_output": {"count": 20, "ns": 1_000_000}}}
    snap = StatsSnapshot.from_json([entry])
    breakdown = ServerBreakdown.from_delta(snap.minus(StatsSnapshot()))
    assert breakdown.request_count == 20 and breakdown.inference_count == 40 and breakdown.execution_count == 10
    assert breakdown.fail_count == 1
    assert (breakdown.latency_us, breakdown.queue_us, breakdown.compute_infer_us) == (1000.0, 100.0, 500.0)
    assert breakdown.overhead_us == pytest.approx(300.0)
