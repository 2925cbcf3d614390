"""GenAI-Perf-style console table and exports (profile_export_genai_perf.json/.csv, inputs.json, raw timestamps)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import TextIO

from naiad.tools.llm.client import RequestRecord
from naiad.tools.llm.metrics import PER_REQUEST, LlmMetrics
from naiad.tools.llm.prompts import Prompt

TABLE_STATS = ["avg", "min", "max", "p99", "p90", "p75"]
CSV_STATS = ["avg", "min", "max", "p99", "p95", "p90", "p75", "p50", "p25"]


def _title(label: str, unit: str) -> str:
    return f"{label} ({unit})"


def print_table(metrics: LlmMetrics, title: str, out: TextIO) -> None:
    rows = [(_title(label, unit), metrics.per_request[key]) for key, label, unit in PER_REQUEST
            if key in metrics.per_request]
    width = max([len(r[0]) for r in rows] + [len("Statistic")]) + 2
    print(f"  {title}", file=out)
    print("Statistic".ljust(width) + "".join(s.rjust(12) for s in TABLE_STATS), file=out)
    for name, stats in rows:
        print(name.ljust(width) + "".join(f"{stats[s]:12.2f}" for s in TABLE_STATS), file=out)
    print(f"{'Output Token Throughput (tokens/sec)'.ljust(width)}{metrics.output_token_throughput:12.2f}", file=out)
    print(f"{'Request Throughput (per sec)'.ljust(width)}{metrics.request_throughput:12.2f}", file=out)
    print(f"{'Request Count (count)'.ljust(width)}{metrics.request_count:12d}", file=out)
    if metrics.error_count:
        print(f"{'Error Count (count)'.ljust(width)}{metrics.error_count:12d}   first: {metrics.first_error}", file=out)


def export(artifact_dir: Path, metrics: LlmMetrics, prompts: list[Prompt], records: list[RequestRecord],
           settings: dict[str, object]) -> dict[str, Path]:
    artifact_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": artifact_dir / "profile_export_genai_perf.json",
        "csv": artifact_dir / "profile_export_genai_perf.csv",
        "inputs": artifact_dir / "inputs.json",
        "raw": artifact_dir / "profile_export.json",
    }
    doc: dict[str, object] = {key: {"unit": metrics.units[key], **stats} for key, stats in metrics.per_request.items()}
    doc["output_token_throughput"] = {"unit": "tokens/sec", "avg": metrics.output_token_throughput}
    doc["request_throughput"] = {"unit": "requests/sec", "avg": metrics.request_throughput}
    doc["request_count"] = {"unit": "count", "avg": metrics.request_count}
    doc["error_count"] = {"unit": "count", "avg": metrics.error_count}
    doc["benchmark_duration"] = {"unit": "sec", "avg": metrics.duration_s}
    doc["input_config"] = settings
    paths["json"].write_text(json.dumps(doc, indent=2))
    with paths["csv"].open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["Metric", *CSV_STATS])
        for key, label, unit in PER_REQUEST:
            if key in metrics.per_request:
                stats = metrics.per_request[key]
                writer.writerow([_title(label, unit), *(f"{stats[s]:.2f}" for s in CSV_STATS)])
        writer.writerow([])
        writer.writerow(["Metric", "Value"])
        writer.writerow(["Output Token Throughput (tokens/sec)", f"{metrics.output_token_throughput:.2f}"])
        writer.writerow(["Request Throughput (per sec)", f"{metrics.request_throughput:.2f}"])
        writer.writerow(["Request Count (count)", metrics.request_count])
    paths["inputs"].write_text(json.dumps({"data": [{"text": p.text, "input_tokens": p.input_tokens,
                                                      "max_tokens": p.max_tokens} for p in prompts]}, indent=1))
    raw = [{"timestamp": r.start_ns, "prompt_index": r.prompt_index, "response_timestamps": r.event_ns,
            "end_timestamp": r.end_ns, "response_outputs": r.texts, "error": r.error} for r in records]
    paths["raw"].write_text(json.dumps({"requests": raw}))
    return paths
