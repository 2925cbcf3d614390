"""What the Server reports about itself: traces of sampled requests, failure reasons, residency metrics."""

from __future__ import annotations

import numpy as np

from naiad.config.model_config import parse_bool
from naiad.config.server_config import ServerConfig
from naiad.core.model_residency import ResidencyManager
from naiad.core.model_version import ModelVersion
from naiad.observability.exposition import Family
from naiad.observability.metrics import MetricsSettings
from naiad.observability.tracing import Tracer
from naiad.protocol.errors import ErrorCode, NaiadError
from naiad.protocol.types import InferenceRequest, InferenceResponse
from naiad.scheduling.base import WorkItem


def record_trace(
    tracer: Tracer, model: ModelVersion, request: InferenceRequest, item: WorkItem,
    response: InferenceResponse, start: int, end: int,
) -> None:
    """Write the timestamps (and tensors, at TENSORS level) of a request the tracer samples."""
    trace = tracer.sample(model.name, model.version_str, request.id)
    if trace is None:
        return
    for inp in request.inputs:
        trace.tensor("TENSOR_QUEUE_INPUT", inp.name, inp.datatype, inp.shape, tensor_text(inp.data))
    for name, ns in (("REQUEST_START", start), ("QUEUE_START", item.enqueue_ns), ("COMPUTE_START", item.dispatch_ns),
                     ("COMPUTE_INPUT_END", item.input_end_ns), ("COMPUTE_OUTPUT_START", item.output_start_ns),
                     ("COMPUTE_END", item.compute_end_ns), ("REQUEST_END", end)):
        if ns:
            trace.timestamp(name, ns)
    for out in response.outputs:
        if out.data is not None:
            trace.tensor("TENSOR_BACKEND_OUTPUT", out.name, out.datatype, out.shape, tensor_text(out.data))
    tracer.finish(trace, model.name)


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
        families.append(budget)
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
    return MetricsSettings(
        counter_latencies=parse_bool(options.get("counter_latencies"), True),
        histogram_latencies=parse_bool(options.get("histogram_latencies"), False),
        cpu_metrics=config.allow_cpu_metrics,
        gpu_metrics=config.allow_gpu_metrics,
    )
