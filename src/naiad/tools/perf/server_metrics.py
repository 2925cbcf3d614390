"""`--collect-metrics`: the server's Prometheus endpoint read during the windows, aggregated as perf_analyzer does.

Per GPU: utilization and power averaged over the samples of the reported (stable) windows, used memory as
their maximum, total memory as the first value. CPU utilization and memory (which Triton and Naiad both
export as nv_cpu_*) are aggregated the same way, so a CPU-only server still reports something useful.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import TextIO

from prometheus_client.parser import text_string_to_metric_families

GPU_FAMILIES = {"nv_gpu_utilization": "util", "nv_gpu_power_usage": "power", "nv_gpu_memory_used_bytes": "used",
                "nv_gpu_memory_total_bytes": "total"}
CPU_FAMILIES = {"nv_cpu_utilization": "cpu_util", "nv_cpu_memory_used_bytes": "cpu_used",
                "nv_cpu_memory_total_bytes": "cpu_total"}
CSV_COLUMNS = ["Avg GPU Utilization", "Avg GPU Power Usage", "Max GPU Memory Usage", "Total GPU Memory",
               "Avg CPU Utilization", "Max CPU Memory Usage"]


@dataclass
class Sample:
    time_ns: int
    gpu: dict[str, dict[str, float]]  # kind (util/power/used/total) -> gpu uuid -> value
    cpu: dict[str, float]  # cpu_util / cpu_used / cpu_total


def parse_prometheus(text: str, time_ns: int = 0) -> Sample:
    """The GPU and CPU gauges of one scrape (other families ignored); ValueError if the text is not Prometheus."""
    sample = Sample(time_ns, {kind: {} for kind in GPU_FAMILIES.values()}, {})
    for family in text_string_to_metric_families(text):
        for point in family.samples:
            if point.name in GPU_FAMILIES:
                sample.gpu[GPU_FAMILIES[point.name]][point.labels.get("gpu_uuid", "gpu")] = point.value
            elif point.name in CPU_FAMILIES:
                sample.cpu[CPU_FAMILIES[point.name]] = point.value
    return sample


@dataclass
class ServerMetrics:
    """One load level's aggregate (the samples taken during its reported windows)."""

    samples: int = 0
    gpu_utilization: dict[str, float] = field(default_factory=dict)  # fraction 0..1, average
    gpu_power_watts: dict[str, float] = field(default_factory=dict)  # average
    gpu_memory_used: dict[str, float] = field(default_factory=dict)  # bytes, maximum
    gpu_memory_total: dict[str, float] = field(default_factory=dict)  # bytes, first
    cpu_utilization: float | None = None  # fraction, average
    cpu_memory_used: float | None = None  # bytes, maximum

    def csv_cells(self) -> list[str]:
        def per_gpu(values: dict[str, float], digits: int) -> str:
            return "".join(f"{uuid}:{value:.{digits}f};" for uuid, value in values.items())

        return [per_gpu(self.gpu_utilization, 3), per_gpu(self.gpu_power_watts, 1), per_gpu(self.gpu_memory_used, 0),
                per_gpu(self.gpu_memory_total, 0),
                "" if self.cpu_utilization is None else f"{self.cpu_utilization:.3f}",
                "" if self.cpu_memory_used is None else f"{self.cpu_memory_used:.0f}"]

    def to_json(self) -> dict[str, object]:
        return {"samples": self.samples, "gpu_utilization": self.gpu_utilization,
                "gpu_power_usage_watts": self.gpu_power_watts, "gpu_memory_used_bytes": self.gpu_memory_used,
                "gpu_memory_total_bytes": self.gpu_memory_total, "cpu_utilization": self.cpu_utilization,
                "cpu_memory_used_bytes": self.cpu_memory_used}

    def print(self, out: TextIO) -> None:
        print("  Server Prometheus Metrics:", file=out)
        if not self.samples:
            print("    no samples during the reported windows (raise the window or lower --metrics-interval)", file=out)
            return
        sections = [("Avg GPU Utilization", self.gpu_utilization, lambda v: f"{v * 100:.1f}%"),
                    ("Avg GPU Power Usage", self.gpu_power_watts, lambda v: f"{v:.1f} watts"),
                    ("Max GPU Memory Usage", self.gpu_memory_used, lambda v: f"{v:.0f} bytes"),
                    ("Total GPU Memory", self.gpu_memory_total, lambda v: f"{v:.0f} bytes")]
        if not self.gpu_utilization:
            print("    No GPU metrics (the server reports no GPU)", file=out)
        for title, values, fmt in sections:
            if values:
                print(f"    {title}:", file=out)
                for uuid, value in values.items():
                    print(f"      {uuid} : {fmt(value)}", file=out)
        if self.cpu_utilization is not None:
            print(f"    Avg CPU Utilization: {self.cpu_utilization * 100:.1f}%", file=out)
        if self.cpu_memory_used is not None:
            print(f"    Max CPU Memory Usage: {self.cpu_memory_used:.0f} bytes", file=out)


def aggregate(samples: list[Sample]) -> ServerMetrics:
    result = ServerMetrics(samples=len(samples))

    def gpus(kind: str) -> dict[str, list[float]]:
        values: dict[str, list[float]] = {}
        for sample in samples:
            for uuid, value in sample.gpu[kind].items():
                values.setdefault(uuid, []).append(value)
        return values

    result.gpu_utilization = {u: sum(v) / len(v) for u, v in gpus("util").items()}
    result.gpu_power_watts = {u: sum(v) / len(v) for u, v in gpus("power").items()}
    result.gpu_memory_used = {u: max(v) for u, v in gpus("used").items()}
    result.gpu_memory_total = {u: v[0] for u, v in gpus("total").items()}
    cpu_util = [s.cpu["cpu_util"] for s in samples if "cpu_util" in s.cpu]
    cpu_used = [s.cpu["cpu_used"] for s in samples if "cpu_used" in s.cpu]
    result.cpu_utilization = sum(cpu_util) / len(cpu_util) if cpu_util else None
    result.cpu_memory_used = max(cpu_used) if cpu_used else None
    return result


def metrics_url(given: str, server_url: str) -> str:
    """--metrics-url as an http URL; by default the server's host on port 8002, path /metrics."""
    if not given:
        host = server_url.rsplit(":", 1)[0] if ":" in server_url else server_url
        given = f"{host or '127.0.0.1'}:8002/metrics"
    if "://" not in given:
        given = "http://" + given
    return given


class MetricsCollector:
    """Scrapes every `interval_ms` when polled; the coordinator polls while it waits out a window."""

    def __init__(self, url: str, interval_ms: float, err: TextIO, timeout_s: float = 2.0) -> None:
        self.url = url
        self.interval_ns = int(max(interval_ms, 1.0) * 1e6)
        self.err = err
        self.timeout_s = timeout_s
        self.samples: list[Sample] = []
        self.next_ns = 0
        self.failed = False

    def scrape(self) -> None:
        """Take one sample now; the first failure is reported and ends the collection."""
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as answer:
                sample = parse_prometheus(answer.read().decode("utf-8", "replace"), time.monotonic_ns())
        except (OSError, urllib.error.URLError, ValueError) as exc:
            self.failed = True
            print(f"Warning: cannot read server metrics from {self.url} ({exc}); --collect-metrics is off",
                  file=self.err)
            return
        self.samples.append(sample)

    def poll(self) -> None:
        now = time.monotonic_ns()
        if not self.failed and now >= self.next_ns:
            self.next_ns = now + self.interval_ns
            self.scrape()

    def level(self, start_ns: int, end_ns: int) -> ServerMetrics:
        return aggregate([s for s in self.samples if start_ns <= s.time_ns <= end_ns])
