"""Protobuf InferParameter maps <-> Python values, and the reserved request parameters of ModelInferRequest."""

from __future__ import annotations

from typing import Any

from tritonclient.grpc import service_pb2 as pb

from naiad.protocol.errors import invalid_arg
from naiad.protocol.types import InferenceRequest

RESERVED_PREFIX = "triton_"
EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"
FINAL_RESPONSE = "triton_final_response"
# The one `triton_` key a client may send, on ModelInfer as on ModelStreamInfer (Triton 2.51 accepts it on
# both; perf_analyzer sends it on every request). Any other key with the prefix is refused with this text.
ALLOWED_RESERVED = (EMPTY_FINAL_RESPONSE,)
RESERVED_PREFIX_MESSAGE = (
    "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys starting "
    "with 'triton_' are allowed: " + " ".join(ALLOWED_RESERVED)
)
# HTTP-only encoding hints: accepted and ignored on gRPC.
_IGNORED = frozenset(("binary_data_output", "binary_data", "binary_data_size", "headers"))
# Request parameters that, once checked, leave a unary request's decoding as if they were absent: the
# ignored encoding hints and the reserved flags only a stream acts on (infer_memo remembers such requests).
NO_EFFECT_ON_UNARY = _IGNORED | frozenset(ALLOWED_RESERVED)
_INT64_MAX = (1 << 63) - 1
_UINT64_MASK = (1 << 64) - 1


def param_value(param: pb.InferParameter) -> Any:
    """The Python value held by an InferParameter / ModelRepositoryParameter (None when unset)."""
    choice = param.WhichOneof("parameter_choice")
    return None if choice is None else getattr(param, choice)


def params_to_dict(params: Any) -> dict[str, Any]:
    """A protobuf parameter map as a plain dict (unset entries dropped)."""
    out: dict[str, Any] = {}
    for key, param in params.items():
        value = param_value(param)
        if value is not None:
            out[key] = value
    return out


def set_param(target: pb.InferParameter, value: Any) -> None:
    """Store a Python value in the matching oneof field of an InferParameter."""
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        if value > _INT64_MAX:
            target.uint64_param = value
        else:
            target.int64_param = value
    elif isinstance(value, float):
        target.double_param = value
    elif isinstance(value, str):
        target.string_param = value
    elif isinstance(value, bytes):
        target.string_param = value.decode("utf-8", errors="replace")
    elif hasattr(value, "item"):  # numpy scalar
        set_param(target, value.item())
    else:
        target.string_param = str(value)


def fill_params(target: Any, values: dict[str, Any]) -> None:
    """Copy a dict of Python values into a protobuf parameter map."""
    for key, value in values.items():
        set_param(target[key], value)


def _bool(param: pb.InferParameter, key: str) -> bool:
    if param.WhichOneof("parameter_choice") != "bool_param":
        raise invalid_arg(f"invalid value type for '{key}' parameter, expected bool_param.")
    return param.bool_param


def _priority(param: pb.InferParameter) -> int:
    choice = param.WhichOneof("parameter_choice")
    if choice not in ("int64_param", "uint64_param"):
        raise invalid_arg("invalid value type for 'priority' parameter, expected int64_param or uint64_param.")
    value = getattr(param, choice)
    if value < 0:
        raise invalid_arg("invalid value for 'priority', expected value >= 0.")
    return value


def _timeout(param: pb.InferParameter) -> int:
    if param.WhichOneof("parameter_choice") != "int64_param":
        raise invalid_arg("invalid value type for 'timeout' parameter, expected int64_param.")
    # Triton reads the int64 as an unsigned count of microseconds: a negative one never expires.
    return max(param.int64_param, 0)


def _sequence_id(param: pb.InferParameter) -> int | str:
    choice = param.WhichOneof("parameter_choice")
    if choice == "string_param":
        return param.string_param
    if choice == "int64_param":
        return param.int64_param & _UINT64_MASK  # Triton stores the int64 as an unsigned correlation ID
    raise invalid_arg("invalid value type for 'sequence_id' parameter, expected int64_param or string_param.")


def _custom(param: pb.InferParameter, key: str) -> Any:
    choice = param.WhichOneof("parameter_choice")
    if choice not in ("int64_param", "bool_param", "string_param", "double_param"):
        raise invalid_arg(f"invalid value type for '{key}' parameter, expected int64_param, bool_param, or string_param.")
    return getattr(param, choice)


def apply_request_params(params: Any, request: InferenceRequest) -> None:
    """Decode ModelInferRequest.parameters into the request's fields; custom keys go to request.parameters."""
    custom = request.parameters
    for key, param in params.items():
        if key == "sequence_id":
            request.sequence_id = _sequence_id(param)
        elif key == "sequence_start":
            request.sequence_start = _bool(param, key)
        elif key == "sequence_end":
            request.sequence_end = _bool(param, key)
        elif key == "priority":
            request.priority = _priority(param)
        elif key == "timeout":
            request.timeout_us = _timeout(param)
        elif key.startswith(RESERVED_PREFIX):
            if key not in ALLOWED_RESERVED:
                raise invalid_arg(RESERVED_PREFIX_MESSAGE)
            _bool(param, key)  # its value is read by the stream; a unary call has one response anyway
        elif key not in _IGNORED:
            custom[key] = _custom(param, key)


def empty_final_response_flag(params: Any) -> bool:
    """The `triton_enable_empty_final_response` request flag (bool_param, default false); streams act on it."""
    if EMPTY_FINAL_RESPONSE not in params:
        return False
    return _bool(params[EMPTY_FINAL_RESPONSE], EMPTY_FINAL_RESPONSE)
