"""The `vllm:*` metric families of Triton's vLLM backend, filled from the stats vLLM's engine reports.

vLLM hands its stat loggers a SchedulerStats (requests running/waiting, KV cache use) and an
IterationStats (tokens, first-token and inter-token times, finished requests) after every engine
step. VllmStats reads those objects by attribute name only (no vLLM import here), so a field a
vLLM release drops reads as absent instead of failing, and tests can pass plain namespaces.
"""

from __future__ import annotations

from typing import Any

from naiad.backends.transformers_backend.stats import Histogram
from naiad.observability.exposition import Family

# Bucket bounds as Triton's vLLM backend publishes them (seconds, then token counts).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
N_BUCKETS = (1, 2, 5, 10, 20)


def token_buckets(max_model_len: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to max_model_len (the token-count histograms' bounds)."""
    bounds: list[int] = []
    scale = 1
    while True:
        for step in (1, 2, 5):
            value = step * scale
            if value > max_model_len:
                return tuple(bounds)
            bounds.append(value)
        scale *= 10


class VllmStats:
    """Counters, gauges and histograms of one engine; updated on the event loop by record()."""

    def __init__(self, max_model_len: int = 2048) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.finished: dict[str, int] = {}
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage = 0.0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.request_prompt_tokens = Histogram(token_buckets(max_model_len))
        self.request_generation_tokens = Histogram(token_buckets(max_model_len))
        self.params_n = Histogram(N_BUCKETS)

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        """One engine step's SchedulerStats and IterationStats (either may be None)."""
        if scheduler_stats is not None:
            self.running = int(getattr(scheduler_stats, "num_running_reqs", self.running))
            self.waiting = int(getattr(scheduler_stats, "num_waiting_reqs", self.waiting))
            self.kv_cache_usage = float(getattr(scheduler_stats, "kv_cache_usage", self.kv_cache_usage))
        if iteration_stats is None:
            return
        self.prompt_tokens += int(getattr(iteration_stats, "num_prompt_tokens", 0))
        self.generation_tokens += int(getattr(iteration_stats, "num_generation_tokens", 0))
        self.preemptions += int(getattr(iteration_stats, "num_preempted_reqs", 0))
        for value in getattr(iteration_stats, "time_to_first_tokens_iter", ()):
            self.ttft.observe(value)
        for value in getattr(iteration_stats, "inter_token_latencies_iter", ()):
            self.tpot.observe(value)
        for value in getattr(iteration_stats, "n_params_iter", ()):
            self.params_n.observe(value)
        for done in getattr(iteration_stats, "finished_requests", ()):
            reason = str(getattr(done, "finish_reason", "stop")).lower().rsplit(".", 1)[-1]
            self.finished[reason] = self.finished.get(reason, 0) + 1
            self.e2e.observe(float(getattr(done, "e2e_latency", 0.0)))
            self.request_prompt_tokens.observe(int(getattr(done, "num_prompt_tokens", 0)))
            self.request_generation_tokens.observe(int(getattr(done, "num_generation_tokens", 0)))


def families(labels: dict[str, str], stats: VllmStats) -> list[Family]:
    """The families Triton's vLLM backend reports (labels model, version), plus its request gauges."""
    scalars = [
        ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", stats.prompt_tokens),
        ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", stats.generation_tokens),
        ("vllm:num_preemptions_total", "counter", "Number of requests preempted by the engine.", stats.preemptions),
        ("vllm:num_requests_running", "gauge", "Number of requests currently running on the engine.", stats.running),
        ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", stats.waiting),
        ("vllm:kv_cache_usage_perc", "gauge", "KV cache usage (1 means 100 percent usage).", stats.kv_cache_usage),
    ]
    counters, gauges = [], []
    for name, kind, help_text, value in scalars:
        family = Family(name, kind, help_text)
        family.add(labels, value)
        (counters if kind == "counter" else gauges).append(family)
    success = Family("vllm:request_success_total", "counter", "Count of successfully processed requests.")
    for reason, count in sorted(stats.finished.items()):
        success.add({**labels, "finished_reason": reason}, count)
    histograms = [
        (Family("vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds."),
         stats.ttft),
        (Family("vllm:time_per_output_token_seconds", "histogram", "Histogram of time per output token in seconds."),
         stats.tpot),
        (Family("vllm:e2e_request_latency_seconds", "histogram", "Histogram of end to end request latency in seconds."),
         stats.e2e),
        (Family("vllm:request_prompt_tokens", "histogram", "Number of prefill tokens processed."),
         stats.request_prompt_tokens),
        (Family("vllm:request_generation_tokens", "histogram", "Number of generation tokens processed."),
         stats.request_generation_tokens),
        (Family("vllm:request_params_n", "histogram", "Histogram of the n request parameter."), stats.params_n),
    ]
    for family, histogram in histograms:
        histogram.add_to(family, labels)
    return [*counters, success, *gauges, *(family for family, _ in histograms)]
