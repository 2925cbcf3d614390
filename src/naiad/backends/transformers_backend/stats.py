"""Counters the engine keeps (TTFT, inter-token latency, tokens/s, batch occupancy, KV use) and their metric families."""

from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import dataclass, field

from naiad.observability.exposition import Family

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
RATE_WINDOW_SECS = 10.0


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self.buckets, value)
        if index < len(self.counts):
            self.counts[index] += 1
        self.total += value
        self.count += 1

    def add_to(self, family: Family, labels: dict[str, str]) -> None:
        cumulative = 0
        for bound, n in zip(self.buckets, self.counts):
            cumulative += n
            family.add({**labels, "le": _le(bound)}, cumulative, "_bucket")
        family.add({**labels, "le": "+Inf"}, self.count, "_bucket")
        family.add(labels, self.total, "_sum")
        family.add(labels, self.count, "_count")


def _le(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else repr(bound)


class EngineStats:
    """Updated on the event loop by the engine; read by metrics and tests."""

    def __init__(self) -> None:
        self.ttft = Histogram(LATENCY_BUCKETS)
        self.itl = Histogram(LATENCY_BUCKETS)
        self.e2e = Histogram(LATENCY_BUCKETS)
        self.decode_batch = Histogram(BATCH_BUCKETS)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.decode_steps = 0
        self.max_decode_batch = 0
        self.prefill_steps = 0
        self.max_prefill_batch = 0
        self.finished: dict[str, int] = {}
        self.running = 0
        self.waiting = 0
        self.kv_used_bytes = 0
        self.kv_reserved_bytes = 0
        self.kv_budget_bytes = 0
        self._recent: deque[tuple[float, int]] = deque()

    def record_decode(self, batch: int) -> None:
        self.decode_steps += 1
        self.decode_batch.observe(batch)
        self.max_decode_batch = max(self.max_decode_batch, batch)

    def record_prefill(self, batch: int) -> None:
        self.prefill_steps += 1
        self.max_prefill_batch = max(self.max_prefill_batch, batch)

    def record_tokens(self, count: int, now: float) -> None:
        self.generation_tokens += count
        self._recent.append((now, count))

    def tokens_per_second(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        while self._recent and now - self._recent[0][0] > RATE_WINDOW_SECS:
            self._recent.popleft()
        if not self._recent:
            return 0.0
        span = max(now - self._recent[0][0], 1.0)
        return sum(n for _, n in self._recent) / span

    def snapshot(self) -> dict[str, float]:
        return {
            "running": self.running, "waiting": self.waiting, "decode_steps": self.decode_steps,
            "max_decode_batch": self.max_decode_batch, "prefill_steps": self.prefill_steps,
            "max_prefill_batch": self.max_prefill_batch, "prompt_tokens": self.prompt_tokens,
            "generation_tokens": self.generation_tokens, "kv_used_bytes": self.kv_used_bytes,
            "kv_reserved_bytes": self.kv_reserved_bytes, "kv_budget_bytes": self.kv_budget_bytes,
        }


def families(entries: list[tuple[dict[str, str], EngineStats]]) -> list[Family]:
    """Prometheus families for every engine (labels model, version)."""
    fams = {
        "ttft": Family("naiad_llm_time_to_first_token_seconds", "histogram", "Time from arrival to the first generated token"),
        "itl": Family("naiad_llm_inter_token_latency_seconds", "histogram", "Time between consecutive generated tokens of a sequence"),
        "e2e": Family("naiad_llm_e2e_request_latency_seconds", "histogram", "Time from arrival to the last generated token"),
        "batch": Family("naiad_llm_decode_batch_size", "histogram", "Sequences sharing one decode step"),
        "prompt": Family("naiad_llm_prompt_tokens_total", "counter", "Prompt tokens processed"),
        "gen": Family("naiad_llm_generation_tokens_total", "counter", "Tokens generated"),
        "finished": Family("naiad_llm_requests_finished_total", "counter", "Sequences finished, by reason"),
        "tps": Family("naiad_llm_generation_tokens_per_second", "gauge", "Generated tokens per second over the last 10 seconds"),
        "running": Family("naiad_llm_num_requests_running", "gauge", "Sequences in the running batch"),
        "waiting": Family("naiad_llm_num_requests_waiting", "gauge", "Sequences waiting for KV cache space or a batch slot"),
        "kv_used": Family("naiad_llm_kv_cache_used_bytes", "gauge", "KV cache bytes holding tokens"),
        "kv_reserved": Family("naiad_llm_kv_cache_reserved_bytes", "gauge", "KV cache bytes reserved by admitted sequences"),
        "kv_budget": Family("naiad_llm_kv_cache_budget_bytes", "gauge", "The KV cache memory budget (model.json kv_cache_bytes)"),
        "kv_usage": Family("naiad_llm_kv_cache_usage_ratio", "gauge", "Reserved KV cache bytes over the budget"),
    }
    now = time.monotonic()
    for labels, s in entries:
        s.ttft.add_to(fams["ttft"], labels)
        s.itl.add_to(fams["itl"], labels)
        s.e2e.add_to(fams["e2e"], labels)
        s.decode_batch.add_to(fams["batch"], labels)
        fams["prompt"].add(labels, s.prompt_tokens)
        fams["gen"].add(labels, s.generation_tokens)
        for reason, n in sorted(s.finished.items()):
            fams["finished"].add({**labels, "reason": reason}, n)
        fams["tps"].add(labels, s.tokens_per_second(now))
        fams["running"].add(labels, s.running)
        fams["waiting"].add(labels, s.waiting)
        fams["kv_used"].add(labels, s.kv_used_bytes)
        fams["kv_reserved"].add(labels, s.kv_reserved_bytes)
        fams["kv_budget"].add(labels, s.kv_budget_bytes)
        fams["kv_usage"].add(labels, s.kv_reserved_bytes / s.kv_budget_bytes if s.kv_budget_bytes else 0.0)
    return list(fams.values())
