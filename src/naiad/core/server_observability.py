"""What the Server reports about itself: traces of sampled requests, failure reasons, residency metrics."""

from __future__ import annotations

import numpy as np

from naiad.config.model_config import parse_bool
from naiad.config.server_config import ServerConfig
from naiad.core.model_residency import ResidencyManager
from naiad.core.model_version import ModelVersion
from naiad.observability.exposition import Family
from naiad.observability.metrics import MetricsSettings
from naiad.observability.otel import OtelRequest
from naiad.observability.summary import parse_quantiles
from naiad.observability.trace_context import (
    ACTIVE_SPAN,
    NOT_TRACED,
    REMOTE_TRACEPARENT,
    valid_traceparent,
)
from naiad.observability.tracing import Trace, Tracer
from naiad.protocol.errors import ErrorCode, NaiadError
from naiad.protocol.types import InferenceRequest, InferenceResponse
from naiad.scheduling.base import WorkItem


def residency_families(residency: ResidencyManager) -> list[Family]:
    """Loads, evictions and measured model memory (Naiad's own families)."""
    loads = Family("naiad_model_loads", "counter", "Number of model loads performed")
    loads.add({}, residency.loads)
    evictions = Family("naiad_model_evictions", "counter", "Number of models unloaded by the memory budget or idle timeout")
    for reason, count in residency.evictions.items():
        evictions.add({"reason": reason}, count)
    memory = Family("naiad_model_memory_bytes", "gauge", "Memory measured when the model loaded, in bytes")
    for name, resident in sorted(residency.residents.items()):
        memory.add({"model": name}, resident.memory_bytes)
    families = [loads, evictions, memory]
    if residency.budget_bytes is not None:
        budget = Family("naiad_model_memory_budget_bytes", "gauge", "The --model-memory-budget")
        budget.add({}, residency.budget_bytes)
        used = Family("naiad_model_memory_used_bytes", "gauge",
                      "What counts against the budget: growth of the server and its workers since start")
        used.add({}, residency.used_bytes())
        families += [budget, used]
    return families


def tensor_text(array: np.ndarray) -> str:
    """Tensor data as Triton's trace writes it: comma-separated values, row-major."""
    flat = np.asarray(array).ravel()
    if flat.dtype == np.object_:
        return ",".join(x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in flat)
    return ",".join(str(x) for x in flat.tolist())


def failure_reason(error: NaiadError, model: ModelVersion) -> str:
    """Triton's failure reasons: queue refusals, cancellations, model errors, the rest."""
    if error.code is ErrorCode.UNAVAILABLE:
        return "REJECTED"
    if error.code is ErrorCode.CANCELLED:
        return "CANCELED"
    return "OTHER" if model.config.platform == "ensemble" else "BACKEND"


def metrics_settings(config: ServerConfig) -> MetricsSettings:
    """--metrics-config switches and the --allow-*-metrics flags."""
    options = config.metrics_config
    summaries = parse_bool(options.get("summary_latencies"), False)
    return MetricsSettings(
        counter_latencies=parse_bool(options.get("counter_latencies"), True),
        histogram_latencies=parse_bool(options.get("histogram_latencies"), False),
        summary_latencies=summaries,
        summary_quantiles=parse_quantiles(options.get("summary_quantiles")) if summaries else (),
        cpu_metrics=config.allow_cpu_metrics,
        gpu_metrics=config.allow_gpu_metrics,
        interval_ms=config.metrics_interval_ms,
    )


class RequestTrace:
    """A traced request: its OpenTelemetry spans or its Triton-mode records, finished when it ends.

    While the request runs, its trace is the active one of this task tree, so the requests it makes
    (ensemble steps) are traced as its children: child spans, or records whose parent_id is its id.
    An untraced request marks its tree too, so that its steps are not traced on their own.
    """

    __slots__ = ("_tracer", "_model", "_otel", "_trace", "_token")

    def __init__(self, tracer: Tracer, model: ModelVersion, otel: OtelRequest | None = None, trace: Trace | None = None) -> None:
        self._tracer = tracer
        self._model = model
        self._otel = otel
        self._trace = trace
        active = otel if otel is not None else trace
        self._token = ACTIVE_SPAN.set(NOT_TRACED if active is None else active)

    def finish(self, request: InferenceRequest, item: WorkItem, start: int, end: int, response: InferenceResponse | None) -> None:
        ACTIVE_SPAN.reset(self._token)
        queued = max(item.enqueue_ns, start) if item.enqueue_ns else 0
        compute = [(name, ns) for name, ns in (
            ("COMPUTE_START", item.dispatch_ns), ("COMPUTE_INPUT_END", item.input_end_ns),
            ("COMPUTE_OUTPUT_START", item.output_start_ns), ("COMPUTE_END", item.compute_end_ns)) if ns] if item.dispatch_ns else []
        if self._otel is not None:
            assert self._tracer.otel is not None
            events = [("REQUEST_START", start)] + ([("QUEUE_START", queued)] if queued else [])
            self._tracer.otel.finish(self._otel, events, compute, end)
        elif self._trace is not None:
            trace = self._trace
            for inp in request.inputs:
                if inp.data is not None:  # always, once validated (shared-memory inputs read)
                    trace.tensor("TENSOR_QUEUE_INPUT", inp.name, inp.datatype, inp.shape, tensor_text(inp.data))
            for name, ns in [("REQUEST_START", start), ("QUEUE_START", queued), *compute, ("REQUEST_END", end)]:
                if ns:
                    trace.timestamp(name, ns)
            for out in response.outputs if response is not None else ():
                if out.data is not None:
                    trace.tensor("TENSOR_BACKEND_OUTPUT", out.name, out.datatype, out.shape, tensor_text(out.data))
            self._tracer.finish(trace, self._model.name)


def start_trace(tracer: Tracer, model: ModelVersion, request: InferenceRequest, start: int) -> RequestTrace | None:
    """Decide whether the request is traced and open its trace. Traced: the request that made it is
    traced, or (OpenTelemetry) it carries a valid W3C traceparent (always traced, as in Triton),
    or the rate samples it. None inside an untraced request."""
    parent = ACTIVE_SPAN.get()
    if parent is NOT_TRACED:
        return None
    exporter = tracer.otel
    if exporter is None:
        trace = tracer.sample(model.name, model.version_str, request.id, parent if isinstance(parent, Trace) else None)
        return RequestTrace(tracer, model, trace=trace)
    if isinstance(parent, OtelRequest):
        traced = exporter.start(model.name, model.version_str, request.id, tracer.next_id(), parent.trace_id, start, parent.span)
    else:
        traceparent = REMOTE_TRACEPARENT.get() or str(request.parameters.get("traceparent", ""))
        forced = bool(traceparent) and valid_traceparent(traceparent)
        decided = tracer.decide(model.name, force=forced)
        if decided is None:
            return RequestTrace(tracer, model)
        traced = exporter.start(model.name, model.version_str, request.id, decided[0], 0, start,
                                traceparent=traceparent if forced else "")
    traced.compute = model.config.platform != "ensemble"
    return RequestTrace(tracer, model, otel=traced)
