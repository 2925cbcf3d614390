"""Per model-version inference statistics in the shape of Triton's statistics extension."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class _Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict:
        return {"count": self.count, "ns": self.ns}


@dataclass
class _BatchStats:
    compute_input: _Duration = field(default_factory=_Duration)
    compute_infer: _Duration = field(default_factory=_Duration)
    compute_output: _Duration = field(default_factory=_Duration)


_INFERENCE_KEYS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")


class ModelStatistics:
    """Counters of one model version; updated from the event loop and instance threads."""

    def __init__(self, name: str, version: str) -> None:
        self.name = name
        self.version = version
        self._lock = threading.Lock()
        self._inference = {key: _Duration() for key in _INFERENCE_KEYS}
        self._batches: dict[int, _BatchStats] = {}
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0

    def record_request(self, success: bool, duration_ns: int, queue_ns: int | None) -> None:
        with self._lock:
            self._inference["success" if success else "fail"].add(duration_ns)
            if queue_ns is not None:
                self._inference["queue"].add(queue_ns)
            self.last_inference_ms = int(time.time() * 1000)

    def record_cache(self, hit: bool, ns: int) -> None:
        with self._lock:
            self._inference["cache_hit" if hit else "cache_miss"].add(ns)

    def record_execution(self, batch_size: int, request_count: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One executed batch of `request_count` requests totalling `batch_size` rows."""
        with self._lock:
            self.inference_count += batch_size
            self.execution_count += 1
            for key, ns in (("compute_input", input_ns), ("compute_infer", infer_ns), ("compute_output", output_ns)):
                self._inference[key].add(ns * request_count, request_count)
            batch = self._batches.setdefault(batch_size, _BatchStats())
            batch.compute_input.add(input_ns)
            batch.compute_infer.add(infer_ns)
            batch.compute_output.add(output_ns)

    def as_dict(self) -> dict:
        with self._lock:
            return {
                "name": self.name,
                "version": self.version,
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": {key: d.as_dict() for key, d in self._inference.items()},
                "response_stats": {},
                "batch_stats": [
                    {
                        "batch_size": size,
                        "compute_input": b.compute_input.as_dict(),
                        "compute_infer": b.compute_infer.as_dict(),
                        "compute_output": b.compute_output.as_dict(),
                    }
                    for size, b in sorted(self._batches.items())
                ],
                "memory_usage": [],
            }
