"""Triton's metric families, built at scrape time from the server's statistics (no shadow counters)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from naiad.observability.exposition import Family, render
from naiad.observability.statistics import FAILURE_REASONS, ModelStatistics
from naiad.observability.summary import (
    CACHE_SUMMARY_FAMILIES,
    SUMMARY_FAMILIES,
    parse_quantiles,
)
from naiad.observability.system_metrics import SystemMetrics

_DURATIONS = [
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds (includes cached requests)", "success"),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds (includes cached requests)", "queue"),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds (does not include cached requests)", "compute_input"),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds (does not include cached requests)", "compute_infer"),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds (does not include cached requests)", "compute_output"),
]


@dataclass
class MetricsSettings:
    """--metrics-config switches and --allow-*-metrics flags."""

    counter_latencies: bool = True
    histogram_latencies: bool = False
    summary_latencies: bool = False
    summary_quantiles: tuple[tuple[float, float], ...] = ()
    cpu_metrics: bool = True
    gpu_metrics: bool = True
    interval_ms: float = 2000.0  # --metrics-interval-ms: how often the per-interval families are sampled


@dataclass
class ModelSeries:
    """What the collector needs of one loaded model version."""

    stats: ModelStatistics
    pending: int
    tags: dict[str, str]
    cached: bool


class MetricsCollector:
    """Renders every family; `models` yields the loaded versions at scrape time."""

    def __init__(self, models: Callable[[], Iterable[ModelSeries]], settings: MetricsSettings) -> None:
        self._models = models
        self._settings = settings
        self.system = SystemMetrics(cpu_metrics=settings.cpu_metrics, gpu_metrics=settings.gpu_metrics)
        self.extra_families: list[Callable[[], list[Family]]] = []

    def families(self) -> list[Family]:
        series = list(self._models())
        success = Family("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes")
        failure = Family("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes")
        count = Family("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)")
        execs = Family("nv_inference_exec_count", "counter", "Number of model executions performed (does not include cached requests)")
        pending = Family("nv_inference_pending_request_count", "gauge", "Instantaneous number of pending requests awaiting execution per-model.")
        load = Family("nv_model_load_duration_secs", "gauge", "Model load time in seconds")
        durations = [Family(name, "counter", doc) for name, doc, _ in _DURATIONS]
        cache = [
            Family("nv_cache_num_hits_per_model", "counter", "Number of cache hits per model"),
            Family("nv_cache_num_misses_per_model", "counter", "Number of cache misses per model"),
            Family("nv_cache_hit_duration_per_model", "counter", "Total cache hit duration per model, in microseconds"),
            Family("nv_cache_miss_duration_per_model", "counter", "Total cache miss (insert+lookup) duration per model, in microseconds"),
        ]
        histogram = Family("nv_inference_first_response_histogram_ms", "histogram", "Duration from request to first response in milliseconds")
        summaries = [Family(name, "summary", doc) for name, doc, _ in SUMMARY_FAMILIES]
        cache_summaries = [Family(name, "summary", doc) for name, doc, _ in CACHE_SUMMARY_FAMILIES]
        for item in series:
            data = item.stats.as_dict()
            labels = {"model": data["name"], "version": data["version"], **{f"_{k}": v for k, v in item.tags.items()}}
            inference = data["inference_stats"]
            success.add(labels, inference["success"]["count"])
            for reason in FAILURE_REASONS:
                failure.add({**labels, "reason": reason}, item.stats.failures[reason])
            count.add(labels, data["inference_count"])
            execs.add(labels, data["execution_count"])
            pending.add(labels, item.pending)
            load.add(labels, item.stats.load_duration_secs)
            for family, (_, _, key) in zip(durations, _DURATIONS):
                family.add(labels, inference[key]["ns"] // 1000)
            if item.cached:
                for family, (field, unit) in zip(cache, (("cache_hit", "count"), ("cache_miss", "count"), ("cache_hit", "ns"), ("cache_miss", "ns"))):
                    value = inference[field][unit]
                    family.add(labels, value // 1000 if unit == "ns" else value)
            if self._settings.histogram_latencies:
                buckets, total_ms, observations = item.stats.first_response_histogram()
                for bound, cumulative in buckets:
                    le = "+Inf" if bound == float("inf") else _bound_text(bound)
                    histogram.add({**labels, "le": le}, cumulative, "_bucket")
                histogram.add(labels, total_ms, "_sum")
                histogram.add(labels, observations, "_count")
            if item.stats.summaries is not None:
                _add_summaries(summaries, SUMMARY_FAMILIES, item.stats, labels, skip="request" if item.cached else "")
                if item.cached:
                    _add_summaries(cache_summaries, CACHE_SUMMARY_FAMILIES, item.stats, labels)
        closed = Family("naiad_batches_closed", "counter", "Dynamic-batcher batches by what closed them")
        sizes = Family("naiad_batch_size_executions", "counter", "Executions per executed batch size")
        for item in series:
            labels = {"model": item.stats.name, "version": item.stats.version}
            for reason, value in sorted(item.stats.batches_closed.items()):
                closed.add({**labels, "reason": reason}, value)
            for size, value in sorted(item.stats.batch_sizes().items()):
                sizes.add({**labels, "batch_size": str(size)}, value)
        families = [success, failure, count, execs, pending, load, closed, sizes]
        if self._settings.counter_latencies:
            families += durations
        if self._settings.histogram_latencies:
            families.append(histogram)
        if self._settings.summary_latencies:
            families += summaries + [f for f in cache_summaries if f.samples]
        families += [f for f in cache if f.samples]
        families += self.system.families()
        for provider in self.extra_families:
            families += provider()
        return families

    def render(self) -> str:
        return render(self.families())

    async def sample_system(self) -> None:
        """The per-interval sampling loop (a task owned by the Server; cancelled at shutdown)."""
        await self.system.run(self._settings.interval_ms / 1000.0)


def _add_summaries(
    families: list[Family], specs: tuple[tuple[str, str, str], ...], stats: ModelStatistics, labels: dict[str, str], skip: str = "",
) -> None:
    """Triton's order: _count, _sum, then one sample per quantile. `skip`: the request summary of a
    model with the response cache on, which Triton does not report."""
    assert stats.summaries is not None
    for family, (_, _, key) in zip(families, specs):
        if key == skip:
            continue
        values, total_us, count = stats.summaries.snapshot(key)
        family.add(labels, count, "_count")
        family.add(labels, total_us, "_sum")
        for quantile, value in values:
            family.add({**labels, "quantile": repr(quantile)}, value)


def _bound_text(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else repr(bound)


def parse_metrics_config(entries: list[str]) -> dict[str, str]:
    """--metrics-config key=value (repeatable)."""
    result = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep:
            raise ValueError(f"--metrics-config expects <key>=<value>, got '{entry}'")
        result[key.strip()] = value.strip()
    if "summary_quantiles" in result:
        parse_quantiles(result["summary_quantiles"])  # a bad list is a start-up error
    return result
