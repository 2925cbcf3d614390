"""Protobuf InferParameter maps <-> Python values, and the reserved request parameters of ModelInferRequest."""

from __future__ import annotations

from typing import Any

from tritonclient.grpc import service_pb2 as pb

from naiad.protocol.errors import invalid_arg
from naiad.protocol.types import InferenceRequest

RESERVED_PREFIX = "triton_"
RESERVED_PREFIX_MESSAGE = (
    "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
)
EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"
FINAL_RESPONSE = "triton_final_response"
# HTTP-only encoding hints: accepted and ignored on gRPC.
_IGNORED = frozenset(("binary_data_output", "binary_data", "binary_data_size", "headers"))
_INT64_MAX = (1 << 63) - 1


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


def _uint(param: pb.InferParameter, key: str, expected: str) -> int:
    choice = param.WhichOneof("parameter_choice")
    if choice not in ("int64_param", "uint64_param"):
        raise invalid_arg(f"invalid value type for '{key}' parameter, expected {expected}.")
    value = getattr(param, choice)
    if value < 0:
        raise invalid_arg(f"invalid value {value} for '{key}' parameter, expected a non-negative integer.")
    return value


def _sequence_id(param: pb.InferParameter) -> int | str:
    choice = param.WhichOneof("parameter_choice")
    if choice == "string_param":
        return param.string_param
    if choice in ("int64_param", "uint64_param"):
        value = getattr(param, choice)
        if value < 0:
            raise invalid_arg(f"invalid value {value} for 'sequence_id' parameter, expected a non-negative integer.")
        return value
    raise invalid_arg("invalid value type for 'sequence_id' parameter, expected int64_param or string_param.")


def apply_request_params(params: Any, request: InferenceRequest, allowed_reserved: frozenset[str]) -> None:
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
            request.priority = _uint(param, key, "int64_param or uint64_param")
        elif key == "timeout":
            request.timeout_us = _uint(param, key, "int64_param")
        elif key.startswith(RESERVED_PREFIX):
            if key not in allowed_reserved:
                raise invalid_arg(RESERVED_PREFIX_MESSAGE)
        elif key not in _IGNORED:
            value = param_value(param)
            if value is not None:
                custom[key] = value


def empty_final_response_flag(params: Any) -> bool:
    """The stream-only `triton_enable_empty_final_response` request flag (bool_param, default false)."""
    if EMPTY_FINAL_RESPONSE not in params:
        return False
    return _bool(params[EMPTY_FINAL_RESPONSE], EMPTY_FINAL_RESPONSE)
