"""Prometheus metrics with Triton's family names, collected from the server's statistics on scrape."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

_COUNTERS = [
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes", ("success", "count"), 1),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", ("fail", "count"), 1),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds (includes cached requests)", ("success", "ns"), 1000),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds (includes cached requests)", ("queue", "ns"), 1000),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds (does not include cached requests)", ("compute_input", "ns"), 1000),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds (does not include cached requests)", ("compute_infer", "ns"), 1000),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds (does not include cached requests)", ("compute_output", "ns"), 1000),
]


class StatisticsCollector:
    """Reads the server's per-model statistics at scrape time; no shadow counters to keep in sync."""

    def __init__(self, statistics: Callable[[], dict], pending: Callable[[], dict[tuple[str, str], int]]) -> None:
        self._statistics = statistics
        self._pending = pending

    def collect(self) -> Iterator[Metric]:
        stats = self._statistics()["model_stats"]
        labels = ["model", "version"]
        families = {name: CounterMetricFamily(name, doc, labels=labels) for name, doc, _, _ in _COUNTERS}
        count = CounterMetricFamily("nv_inference_count", "Number of inferences performed (does not include cached requests)", labels=labels)
        execs = CounterMetricFamily("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)", labels=labels)
        for entry in stats:
            key = [entry["name"], entry["version"]]
            inference = entry["inference_stats"]
            for name, _, (field, unit), divisor in _COUNTERS:
                families[name].add_metric(key, inference[field][unit] // divisor)
            count.add_metric(key, entry["inference_count"])
            execs.add_metric(key, entry["execution_count"])
        hits = CounterMetricFamily("nv_cache_num_hits_per_model", "Number of cache hits per model", labels=labels)
        misses = CounterMetricFamily("nv_cache_num_misses_per_model", "Number of cache misses per model", labels=labels)
        hit_us = CounterMetricFamily("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds", labels=labels)
        miss_us = CounterMetricFamily("nv_cache_miss_duration_per_model", "Total cache miss (insert + lookup) duration per model, in microseconds", labels=labels)
        for entry in stats:
            key = [entry["name"], entry["version"]]
            inference = entry["inference_stats"]
            hits.add_metric(key, inference["cache_hit"]["count"])
            misses.add_metric(key, inference["cache_miss"]["count"])
            hit_us.add_metric(key, inference["cache_hit"]["ns"] // 1000)
            miss_us.add_metric(key, inference["cache_miss"]["ns"] // 1000)
        yield from families.values()
        yield from (hits, misses, hit_us, miss_us)
        yield count
        yield execs
        pending = GaugeMetricFamily("nv_inference_pending_request_count", "Instantaneous number of pending requests awaiting execution per-model.", labels=labels)
        for (model, version), value in sorted(self._pending().items()):
            pending.add_metric([model, version], value)
        yield pending


def build_registry(statistics: Callable[[], dict], pending: Callable[[], dict[tuple[str, str], int]]) -> CollectorRegistry:
    """A registry owned by one server (never the process-global one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatisticsCollector(statistics, pending))
    return registry
