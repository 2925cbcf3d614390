"""Triton's `triton_python_backend_utils` API for model.py files running on Naiad's Python backend."""

from __future__ import annotations

from triton_python_backend_utils import _runtime
from triton_python_backend_utils._config import (
    ModelConfig,
    deserialize_bytes_tensor,
    get_input_config_by_name,
    get_input_tensor_by_name,
    get_output_config_by_name,
    get_output_tensor_by_name,
    serialize_byte_tensor,
    using_decoupled_model_transaction_policy,
)
from triton_python_backend_utils._errors import TritonError, TritonModelException
from triton_python_backend_utils._logger import Logger, LogLevel
from triton_python_backend_utils._metrics import Metric, MetricFamily, MetricKind
from triton_python_backend_utils._request import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_CPU_PINNED,
    TRITONSERVER_MEMORY_GPU,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceRequest,
    InferenceResponse,
    InferenceResponseSender,
    InferenceTrace,
    PreferredMemory,
    ResponseIterator,
)
from triton_python_backend_utils._tensor import (
    TRITON_STRING_TO_NUMPY,
    Tensor,
    numpy_to_triton_type,
    triton_string_to_numpy,
    triton_to_numpy_type,
)
from triton_python_backend_utils._text import text as _text

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2


class MemoryType:
    TRITONSERVER_MEMORY_CPU = TRITONSERVER_MEMORY_CPU
    TRITONSERVER_MEMORY_CPU_PINNED = TRITONSERVER_MEMORY_CPU_PINNED
    TRITONSERVER_MEMORY_GPU = TRITONSERVER_MEMORY_GPU


def _check_control_phase(what: str) -> None:
    if _runtime.phase() in ("auto_complete", "finalize"):
        raise TritonModelException(f"{what} is not allowed in auto_complete_config or finalize")


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) a model; the server must run with --model-control-mode=explicit."""
    _check_control_phase("load_model")
    if files is not None and not isinstance(files, dict):
        raise TritonModelException("files must be a dict of 'file:<path>' -> bytes")
    config = _text(config, "load_model config") if config else ""
    _runtime.current().model_control("load", _text(model_name, "model_name"), config or None, dict(files) if files else None)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload a model; the server must run with --model-control-mode=explicit."""
    _check_control_phase("unload_model")
    _runtime.current().model_control("unload", _text(model_name, "model_name"), bool(unload_dependents))


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """True when the model (version) is loaded and its instances are healthy."""
    _check_control_phase("is_model_ready")
    version = _text(model_version, "model_version") if model_version else ""
    return bool(_runtime.current().model_control("ready", _text(model_name, "model_name"), version))


__all__ = [
    "InferenceRequest", "InferenceResponse", "InferenceResponseSender", "InferenceTrace", "Logger", "LogLevel",
    "MemoryType", "Metric", "MetricFamily", "MetricKind", "ModelConfig", "PreferredMemory", "ResponseIterator",
    "Tensor", "TritonError", "TritonModelException", "TRITON_STRING_TO_NUMPY",
    "TRITONSERVER_MEMORY_CPU", "TRITONSERVER_MEMORY_CPU_PINNED", "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_RELEASE_ALL", "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL", "deserialize_bytes_tensor", "get_input_config_by_name",
    "get_input_tensor_by_name", "get_output_config_by_name", "get_output_tensor_by_name", "is_model_ready",
    "load_model", "numpy_to_triton_type", "serialize_byte_tensor", "triton_string_to_numpy",
    "triton_to_numpy_type", "unload_model", "using_decoupled_model_transaction_policy",
]

