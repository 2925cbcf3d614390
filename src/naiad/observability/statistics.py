"""Per model-version inference statistics in the shape of Triton's statistics extension."""

from __future__ import annotations

import threading
import time
from bisect import bisect_left

from naiad.observability.summary import LatencySummaries


class _Duration:
    __slots__ = ("count", "ns")

    def __init__(self) -> None:
        self.count = 0
        self.ns = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict:
        return {"count": self.count, "ns": self.ns}


class _BatchStats:
    """The executions of one batch size: each adds one to the count of all three compute durations."""

    __slots__ = ("count", "input_ns", "infer_ns", "output_ns")

    def __init__(self) -> None:
        self.count = 0
        self.input_ns = 0
        self.infer_ns = 0
        self.output_ns = 0

    def as_dict(self, size: int) -> dict:
        return {
            "batch_size": size,
            "compute_input": {"count": self.count, "ns": self.input_ns},
            "compute_infer": {"count": self.count, "ns": self.infer_ns},
            "compute_output": {"count": self.count, "ns": self.output_ns},
        }


FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
DEFAULT_FIRST_RESPONSE_BUCKETS_MS = (100.0, 500.0, 2000.0, 5000.0)

# The inference_stats durations with a count of their own (the compute ones share one, see _compute).
_DURATION_KEYS = ("success", "fail", "queue", "cache_hit", "cache_miss")


class ModelStatistics:
    """Counters of one model version; updated from the event loop and instance threads."""

    def __init__(
        self, name: str, version: str, first_response_buckets_ms: tuple[float, ...] = DEFAULT_FIRST_RESPONSE_BUCKETS_MS,
        summary_quantiles: tuple[tuple[float, float], ...] | None = None,
    ) -> None:
        self.name = name
        # per-request latency summaries, only with --metrics-config summary_latencies=true
        self.summaries = LatencySummaries(summary_quantiles) if summary_quantiles else None
        self.version = version
        self.failures = {reason: 0 for reason in FAILURE_REASONS}
        # How the dynamic batcher closed each batch: preferred size, max size, queue delay, no
        # delay configured, or an idle instance taking a lone request straight away.
        self.batches_closed: dict[str, int] = {}
        self.load_duration_secs = 0.0
        self.first_response_buckets_ms = tuple(sorted(first_response_buckets_ms))
        self.first_response_counts = [0] * (len(self.first_response_buckets_ms) + 1)
        self.first_response_sum_ms = 0.0
        self._lock = threading.Lock()
        self._inference = {key: _Duration() for key in _DURATION_KEYS}
        # the durations every request updates, without a dict lookup each
        self._success, self._fail, self._queue = (self._inference[k] for k in ("success", "fail", "queue"))
        # The three compute durations of all executions: every execution adds its request count to all three,
        # so they share one count (as a batch size's do).
        self._compute = _BatchStats()
        self._batches: dict[int, _BatchStats] = {}
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0

    def record_request(self, success: bool, duration_ns: int, queue_ns: int | None, reason: str = "BACKEND") -> None:
        with self._lock:
            if success:
                self._success.add(duration_ns)
                if queue_ns is not None:  # Triton counts queue time of successes only
                    self._queue.add(queue_ns)
            else:
                self._fail.add(duration_ns)
                self.failures[reason if reason in self.failures else "OTHER"] += 1
            self.last_inference_ms = time.time_ns() // 1_000_000
        if self.summaries is not None and success:
            self.summaries.observe("request", duration_ns)
            if queue_ns is not None:
                self.summaries.observe("queue", queue_ns)

    def record_answered(self, duration_ns: int, queue_ns: int) -> None:
        """A request answered with its one response: record_first_response and a successful
        record_request together, under one hold of the lock."""
        ms = duration_ns / 1e6
        success, queue = self._success, self._queue
        lock = self._lock
        lock.acquire()  # not `with`: no __enter__/__exit__ looked up and called (~1.1k instructions less)
        try:
            self._count_first_response(ms)
            # in place rather than through _Duration.add: two calls fewer per request
            success.count += 1
            success.ns += duration_ns
            queue.count += 1
            queue.ns += queue_ns
            self.last_inference_ms = time.time_ns() // 1_000_000
        finally:
            lock.release()
        if self.summaries is not None:
            self.summaries.observe("request", duration_ns)
            self.summaries.observe("queue", queue_ns)

    def record_first_response(self, duration_ns: int) -> None:
        """Time from request start to its first response (TTFT for streaming models)."""
        ms = duration_ns / 1e6
        with self._lock:
            self._count_first_response(ms)

    def _count_first_response(self, ms: float) -> None:
        self.first_response_sum_ms += ms
        # the first bucket whose bound is >= ms; past the last bound, the +Inf bucket
        self.first_response_counts[bisect_left(self.first_response_buckets_ms, ms)] += 1

    def first_response_histogram(self) -> tuple[list[tuple[float, int]], float, int]:
        """Cumulative (upper bound, count) pairs ending with +Inf, the sum in ms and the count."""
        with self._lock:
            cumulative, total = [], 0
            for bound, count in zip(list(self.first_response_buckets_ms) + [float("inf")], self.first_response_counts):
                total += count
                cumulative.append((bound, total))
            return cumulative, self.first_response_sum_ms, total

    def record_batch_closed(self, reason: str) -> None:
        with self._lock:
            self.batches_closed[reason] = self.batches_closed.get(reason, 0) + 1

    def batch_sizes(self) -> dict[int, int]:
        """Executions per batch size."""
        with self._lock:
            return {size: b.count for size, b in self._batches.items()}

    def record_cache(self, hit: bool, ns: int) -> None:
        with self._lock:
            self._inference["cache_hit" if hit else "cache_miss"].add(ns)
        if self.summaries is not None:
            self.summaries.observe("cache_hit" if hit else "cache_miss", ns)

    def record_execution(self, batch_size: int, request_count: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One executed batch of `request_count` requests totalling `batch_size` rows."""
        compute = self._compute
        lock = self._lock
        lock.acquire()  # not `with`, as in record_answered
        try:
            self.inference_count += batch_size
            self.execution_count += 1
            compute.count += request_count
            compute.infer_ns += infer_ns * request_count
            batch = self._batches.get(batch_size)
            if batch is None:
                batch = self._batches[batch_size] = _BatchStats()
            batch.count += 1
            batch.infer_ns += infer_ns
            # A backend that times only its whole execution (a Python model) has nothing to add here: four
            # updates fewer (with the one count: ~1.5k instructions less per execution).
            if input_ns or output_ns:
                compute.input_ns += input_ns * request_count
                compute.output_ns += output_ns * request_count
                batch.input_ns += input_ns
                batch.output_ns += output_ns
        finally:
            lock.release()
        if self.summaries is not None:
            for key, ns in (("compute_input", input_ns), ("compute_infer", infer_ns), ("compute_output", output_ns)):
                self.summaries.observe(key, ns, request_count)

    def _inference_stats(self) -> dict:
        """inference_stats in Triton's order (call with the lock held)."""
        inference = self._inference
        compute = self._compute
        stats = {key: inference[key].as_dict() for key in ("success", "fail", "queue")}
        stats["compute_input"] = {"count": compute.count, "ns": compute.input_ns}
        stats["compute_infer"] = {"count": compute.count, "ns": compute.infer_ns}
        stats["compute_output"] = {"count": compute.count, "ns": compute.output_ns}
        for key in ("cache_hit", "cache_miss"):
            stats[key] = inference[key].as_dict()
        return stats

    def as_dict(self) -> dict:
        with self._lock:
            return {
                "name": self.name,
                "version": self.version,
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": self._inference_stats(),
                "response_stats": {},
                "batch_stats": [b.as_dict(size) for size, b in sorted(self._batches.items())],
                "memory_usage": [],
            }
