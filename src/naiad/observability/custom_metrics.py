"""Metric families created by model code (pb_utils.MetricFamily), kept per server and exported with ours."""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import Any

from naiad.observability.exposition import Family

_KINDS = {0: "counter", 1: "gauge", 2: "histogram"}


@dataclass
class _Series:
    value: float = 0.0
    buckets: list[float] = field(default_factory=list)
    bucket_counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0


@dataclass
class _CustomFamily:
    name: str
    description: str
    kind: str
    series: dict[tuple, _Series] = field(default_factory=dict)


class CustomMetrics:
    """Receives (op, *args) updates from model workers: family, metric, increment, set, observe."""

    def __init__(self) -> None:
        self._families: dict[str, _CustomFamily] = {}
        self._lock = threading.Lock()

    def update(self, op: str, *args: Any) -> None:  # decoded from a worker's message
        with self._lock:
            if op == "family":
                name, description, kind = args
                self._families.setdefault(str(name), _CustomFamily(str(name), str(description), _KINDS.get(int(kind), "gauge")))
                return
            family = self._families.get(str(args[0]))
            if family is None:
                return
            key = tuple(sorted(dict(args[1]).items()))
            if op == "metric":
                buckets = sorted(float(b) for b in (args[2] or []))
                family.series.setdefault(key, _Series(buckets=buckets, bucket_counts=[0] * (len(buckets) + 1)))
                return
            series = family.series.setdefault(key, _Series())
            value = float(args[2])
            if op == "increment":
                series.value += value
            elif op == "set":
                series.value = value
            elif op == "observe":
                series.total += value
                series.count += 1
                if series.bucket_counts:
                    series.bucket_counts[bisect.bisect_left(series.buckets, value)] += 1

    def families(self) -> list[Family]:
        result = []
        with self._lock:
            for custom in self._families.values():
                family = Family(custom.name, custom.kind, custom.description)
                for key, series in custom.series.items():
                    labels = dict(key)
                    if custom.kind != "histogram":
                        family.add(labels, series.value)
                        continue
                    cumulative = 0
                    for bound, count in zip(series.buckets + [float("inf")], series.bucket_counts):
                        cumulative += count
                        le = "+Inf" if bound == float("inf") else repr(bound)
                        family.add({**labels, "le": le}, cumulative, "_bucket")
                    family.add(labels, series.total, "_sum")
                    family.add(labels, series.count, "_count")
                result.append(family)
        return result
