"""Custom metrics: MetricFamily / Metric, kept in the worker and forwarded to the server's metrics endpoint."""

from __future__ import annotations

import bisect
import re
import threading
from typing import Any

from triton_python_backend_utils import _runtime
from triton_python_backend_utils._errors import TritonModelException

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_families: dict[str, MetricFamily] = {}
_lock = threading.Lock()


class MetricKind:
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


class MetricFamily:
    """A named family of metrics of one kind; create metrics with labels from it."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM
    _kind: int

    def __init__(self, name: str, description: str, kind: int) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise TritonModelException(f"invalid metric family name {name!r}")
        if kind not in (MetricKind.COUNTER, MetricKind.GAUGE, MetricKind.HISTOGRAM):
            raise TritonModelException(f"unknown metric kind {kind!r}")
        with _lock:
            existing = _families.get(name)
            if existing is not None and existing._kind != kind:
                raise TritonModelException(f"metric family '{name}' already exists with a different kind")
            _families[name] = self
        self._name = name
        self._description = str(description)
        self._kind = kind
        self._metrics: dict[tuple, Metric] = {}
        runtime = _runtime.optional()
        if runtime is not None:
            runtime.metric("family", name, self._description, kind)

    def Metric(self, labels: dict | None = None, buckets: list | None = None) -> Metric:  # Triton's name
        labels = {str(k): str(v) for k, v in (labels or {}).items()}
        if self._kind == MetricKind.HISTOGRAM:
            if not buckets:
                raise TritonModelException("histogram metrics need a list of buckets")
            buckets = sorted(float(b) for b in buckets)
        elif buckets:
            raise TritonModelException("only histogram metrics take buckets")
        key = tuple(sorted(labels.items()))
        metric = Metric(self, labels, buckets)
        self._metrics[key] = metric
        runtime = _runtime.optional()
        if runtime is not None:
            runtime.metric("metric", self._name, labels, buckets)
        return metric


class Metric:
    """One labelled metric: increment/set for counters and gauges, observe for histograms."""

    def __init__(self, family: MetricFamily, labels: dict, buckets: list | None) -> None:
        self._family = family
        self._labels = labels
        self._buckets: list[float] = buckets or []  # empty unless a histogram
        self._value = 0.0
        self._sum = 0.0
        self._count = 0
        self._bucket_counts = [0] * (len(buckets) + 1) if buckets else []
        self._lock = threading.Lock()

    def _forward(self, op: str, value: float) -> None:
        runtime = _runtime.optional()
        if runtime is not None:
            runtime.metric(op, self._family._name, self._labels, value)

    def increment(self, value: float) -> None:
        if self._family._kind == MetricKind.HISTOGRAM:
            raise TritonModelException("histogram metrics support observe() only")
        if self._family._kind == MetricKind.COUNTER and value < 0:
            raise TritonModelException("a counter cannot be incremented by a negative value")
        with self._lock:
            self._value += float(value)
        self._forward("increment", float(value))

    def set(self, value: float) -> None:
        if self._family._kind != MetricKind.GAUGE:
            raise TritonModelException("only gauge metrics support set()")
        with self._lock:
            self._value = float(value)
        self._forward("set", float(value))

    def observe(self, value: float) -> None:
        if self._family._kind != MetricKind.HISTOGRAM:
            raise TritonModelException("only histogram metrics support observe()")
        with self._lock:
            self._sum += float(value)
            self._count += 1
            self._bucket_counts[bisect.bisect_left(self._buckets, float(value))] += 1
        self._forward("observe", float(value))

    def value(self) -> Any:
        if self._family._kind == MetricKind.HISTOGRAM:
            with self._lock:
                return {"sum": self._sum, "count": self._count, "buckets": list(self._bucket_counts)}
        return self._value
