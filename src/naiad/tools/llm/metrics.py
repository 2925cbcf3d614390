"""GenAI-Perf's metrics from timestamped requests: TTFT, inter-token latency, token and request throughput."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from naiad.tools.llm.client import RequestRecord
from naiad.tools.llm.prompts import Prompt

STAT_NAMES = ["avg", "min", "max", "p99", "p95", "p90", "p75", "p50", "p25", "std"]


def describe(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    array = np.asarray(values, dtype=np.float64)
    stats = {"avg": float(array.mean()), "min": float(array.min()), "max": float(array.max()),
             "std": float(array.std())}
    for p in (99, 95, 90, 75, 50, 25):
        stats[f"p{p}"] = float(np.percentile(array, p))
    return stats


@dataclass
class LlmMetrics:
    per_request: dict[str, dict[str, float]] = field(default_factory=dict)  # metric -> stats
    units: dict[str, str] = field(default_factory=dict)
    request_throughput: float = 0.0
    output_token_throughput: float = 0.0
    request_count: int = 0
    error_count: int = 0
    duration_s: float = 0.0
    first_error: str = ""


PER_REQUEST = [
    ("time_to_first_token", "Time To First Token", "ms"),
    ("time_to_second_token", "Time To Second Token", "ms"),
    ("inter_token_latency", "Inter Token Latency", "ms"),
    ("request_latency", "Request Latency", "ms"),
    ("output_token_throughput_per_user", "Output Token Throughput Per User", "tokens/sec/user"),
    ("output_sequence_length", "Output Sequence Length", "tokens"),
    ("input_sequence_length", "Input Sequence Length", "tokens"),
]


def compute_metrics(records: list[RequestRecord], prompts: list[Prompt], streaming: bool,
                    count_tokens: Callable[[str], int]) -> LlmMetrics:
    good = [r for r in records if not r.error]
    bad = [r for r in records if r.error]
    result = LlmMetrics(request_count=len(good), error_count=len(bad), first_error=bad[0].error if bad else "")
    result.units = {key: unit for key, _, unit in PER_REQUEST}
    if not good:
        return result
    values: dict[str, list[float]] = {key: [] for key, _, _ in PER_REQUEST}
    total_tokens = 0
    for r in good:
        latency_ms = (r.end_ns - r.start_ns) / 1e6
        osl = count_tokens(r.text)
        total_tokens += osl
        values["request_latency"].append(latency_ms)
        values["output_sequence_length"].append(osl)
        values["input_sequence_length"].append(prompts[r.prompt_index].input_tokens)
        if streaming and r.event_ns:
            ttft_ms = (r.event_ns[0] - r.start_ns) / 1e6
            values["time_to_first_token"].append(ttft_ms)
            if len(r.event_ns) > 1:
                values["time_to_second_token"].append((r.event_ns[1] - r.event_ns[0]) / 1e6)
            if osl > 1:
                generation_ms = (r.end_ns - r.event_ns[0]) / 1e6
                values["inter_token_latency"].append(generation_ms / (osl - 1))
                if generation_ms > 0:
                    values["output_token_throughput_per_user"].append((osl - 1) / (generation_ms / 1000.0))
    start = min(r.start_ns for r in good)
    end = max(r.end_ns for r in good)
    result.duration_s = max((end - start) / 1e9, 1e-9)
    result.request_throughput = len(good) / result.duration_s
    result.output_token_throughput = total_tokens / result.duration_s
    result.per_request = {key: describe(v) for key, v in values.items() if v}
    return result
