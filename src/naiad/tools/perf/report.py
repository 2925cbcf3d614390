"""perf_analyzer-style console report, CSV file (its column names, µs) and a JSON dump of every level."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from typing import TextIO

import numpy as np

from naiad.tools.perf.measurement import WindowStats
from naiad.tools.perf.server_metrics import CSV_COLUMNS as METRICS_COLUMNS
from naiad.tools.perf.server_metrics import ServerMetrics

CSV_TAIL = ["Client Send", "Network+Server Send/Recv", "Server Queue", "Server Compute Input",
            "Server Compute Infer", "Server Compute Output", "Client Recv",
            "p50 latency", "p90 latency", "p95 latency", "p99 latency"]
VERBOSE_COLUMNS = ["Avg latency", "request/response", "response wait", "Request Count", "Server Request Count",
                   "Server Inference Count", "Server Execution Count", "Server Overhead", "Delayed Requests", "Stable"]


@dataclass
class LevelResult:
    mode: str  # concurrency | rate
    value: float  # concurrency count or requests/s (0 for a request-intervals file)
    measurement: WindowStats
    windows: list[WindowStats]
    stable: bool
    metrics: ServerMetrics | None = None  # --collect-metrics

    @property
    def label(self) -> str:
        if self.mode == "concurrency":
            return f"Request concurrency: {int(self.value)}"
        return "Request intervals file" if self.value == 0 else f"Request rate: {self.value:g}"

    def csv_value(self) -> str:
        return str(int(self.value)) if self.mode == "concurrency" else f"{self.value:g}"

    def breakdown_us(self) -> dict[str, float]:
        """The latency split that the CSV columns carry (they add up to the average latency)."""
        m = self.measurement
        server = m.server()
        send, recv, avg = m.avg_send_us(), m.avg_recv_us(), m.avg_latency_us()
        parts = {"queue": 0.0, "input": 0.0, "infer": 0.0, "output": 0.0}
        if server is not None:
            parts = {"queue": server.queue_us, "input": server.compute_input_us,
                     "infer": server.compute_infer_us, "output": server.compute_output_us}
        network = max(0.0, avg - send - recv - sum(parts.values()))
        return {"send": send, "network": network, **parts, "recv": recv, "avg": avg}


def _us(value: float) -> int:
    return int(round(value))


def print_level(result: LevelResult, percentile: float, out: TextIO) -> None:
    m = result.measurement
    print(result.label, file=out)
    print("  Client: ", file=out)
    print(f"    Request count: {m.count}", file=out)
    print(f"    Throughput: {m.throughput:.2f} infer/sec", file=out)
    if m.responses != m.count:
        print(f"    Response Throughput: {m.response_throughput:.2f} infer/sec", file=out)
    if percentile > 0:
        print(f"    p{percentile:g} latency: {_us(m.percentile_us(percentile))} usec", file=out)
    print(f"    Avg latency: {_us(m.avg_latency_us())} usec (standard deviation {_us(m.std_latency_us())} usec)", file=out)
    for p in (50, 90, 95, 99):
        print(f"    p{p} latency: {_us(m.percentile_us(p))} usec", file=out)
    if m.responses != m.count and m.first_response_ns.size:
        first = m.first_response_ns / 1000.0
        print(f"    First response latency: avg {_us(float(first.mean()))} usec, p50 {_us(float(np.percentile(first, 50)))} "
              f"usec, p99 {_us(float(np.percentile(first, 99)))} usec", file=out)
    if result.mode == "rate" and m.count:
        print(f"    Delayed requests: {m.delayed} ({100.0 * m.delayed / m.count:.1f}%)", file=out)
    server = m.server()
    if server is not None:
        print("  Server: ", file=out)
        print(f"    Inference count: {server.inference_count}", file=out)
        print(f"    Execution count: {server.execution_count}", file=out)
        print(f"    Successful request count: {server.request_count}", file=out)
        if server.cache_hit_count:
            print(f"    Cache hit count: {server.cache_hit_count}", file=out)
        print(f"    Avg request latency: {_us(server.latency_us)} usec (overhead {_us(server.overhead_us)} usec + "
              f"queue {_us(server.queue_us)} usec + compute input {_us(server.compute_input_us)} usec + "
              f"compute infer {_us(server.compute_infer_us)} usec + compute output {_us(server.compute_output_us)} usec)",
              file=out)
    if result.metrics is not None:
        result.metrics.print(out)
    if not result.stable:
        print(f"  Warning: no stable measurement within {len(result.windows)} windows; "
              f"the last {min(3, len(result.windows))} are reported (try a longer --measurement-interval)", file=out)
    print(file=out)


def print_summary(results: list[LevelResult], percentile: float, out: TextIO) -> None:
    kind = "Average" if percentile <= 0 else f"p{percentile:g}"
    print(f"Inferences/Second vs. Client {kind} Batch Latency", file=out)
    for r in results:
        m = r.measurement
        name = "Concurrency" if r.mode == "concurrency" else "Request Rate"
        print(f"{name}: {r.csv_value()}, throughput: {m.throughput:.2f} infer/sec, "
              f"latency {_us(m.latency_metric_us(percentile))} usec", file=out)


def csv_rows(results: list[LevelResult], verbose: bool, decoupled: bool = False) -> tuple[list[str], list[list[str]]]:
    """perf_analyzer's columns; a decoupled model adds "Response Throughput" (responses/s) after the throughput."""
    first = "Concurrency" if not results or results[0].mode == "concurrency" else "Request Rate"
    with_metrics = verbose and any(r.metrics is not None for r in results)
    header = [first, "Inferences/Second", *(["Response Throughput"] if decoupled else []), *CSV_TAIL]
    header += VERBOSE_COLUMNS if verbose else []
    header += METRICS_COLUMNS if with_metrics else []
    rows = []
    for r in sorted(results, key=lambda r: r.measurement.throughput):
        m, b = r.measurement, r.breakdown_us()
        row = [r.csv_value(), f"{m.throughput:.3f}", *([f"{m.response_throughput:.3f}"] if decoupled else []),
               str(_us(b["send"])), str(_us(b["network"])), str(_us(b["queue"])),
               str(_us(b["input"])), str(_us(b["infer"])), str(_us(b["output"])), str(_us(b["recv"]))]
        row += [str(_us(m.percentile_us(p))) for p in (50, 90, 95, 99)]
        if verbose:
            server = m.server()
            first_us = float(m.first_response_ns.mean()) / 1000.0 if m.first_response_ns.size else 0.0
            row += [str(_us(b["avg"])), str(_us(first_us)), str(_us(max(0.0, b["avg"] - first_us))), str(m.count),
                    str(server.request_count if server else ""), str(server.inference_count if server else ""),
                    str(server.execution_count if server else ""), str(_us(server.overhead_us) if server else ""),
                    str(m.delayed), "yes" if r.stable else "no"]
        if with_metrics:
            row += (r.metrics or ServerMetrics()).csv_cells()
        rows.append(row)
    return header, rows


def write_csv(path: str, results: list[LevelResult], verbose: bool, decoupled: bool = False) -> None:
    header, rows = csv_rows(results, verbose, decoupled)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


def level_json(result: LevelResult, percentile: float) -> dict[str, object]:
    m = result.measurement
    server = m.server()
    doc: dict[str, object] = {
        "mode": result.mode, "value": result.value, "stable": result.stable, "windows": len(result.windows),
        "request_count": m.count, "response_count": m.responses, "duration_s": m.duration_ns / 1e9,
        "throughput_infer_per_sec": m.throughput, "avg_latency_us": m.avg_latency_us(),
        "std_latency_us": m.std_latency_us(), "latency_metric_us": m.latency_metric_us(percentile),
        **{f"p{p}_latency_us": m.percentile_us(p) for p in (50, 90, 95, 99)},
        "client_send_us": m.avg_send_us(), "client_recv_us": m.avg_recv_us(), "delayed_requests": m.delayed,
    }
    if result.metrics is not None:
        doc["metrics"] = result.metrics.to_json()
    if server is not None:
        doc["server"] = {
            "request_count": server.request_count, "inference_count": server.inference_count,
            "execution_count": server.execution_count, "fail_count": server.fail_count,
            "latency_us": server.latency_us, "queue_us": server.queue_us,
            "compute_input_us": server.compute_input_us, "compute_infer_us": server.compute_infer_us,
            "compute_output_us": server.compute_output_us, "overhead_us": server.overhead_us,
        }
    return doc


def write_json(path: str, results: list[LevelResult], percentile: float, totals: dict[str, int]) -> None:
    doc = {"levels": [level_json(r, percentile) for r in results], "totals": totals}
    with open(path, "w") as handle:
        json.dump(doc, handle, indent=2)
