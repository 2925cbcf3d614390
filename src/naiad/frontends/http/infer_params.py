"""Typed reads of JSON parameter values in an infer request (request-level, per-input, per-output)."""

from __future__ import annotations

from typing import Any

from naiad.protocol.errors import invalid_arg
from naiad.protocol.types import InferenceRequest, SharedMemoryRef

_UINT64_MAX = (1 << 64) - 1
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
RESERVED_PREFIX_MESSAGE = (
    "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
)
SHM_KEYS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


def is_uint(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _UINT64_MAX


# What Triton's JSON reader adds after "Unable to parse 'key'" for a request-level parameter of the wrong type.
NOT_UINT = ": attempt to access JSON non-unsigned-integer as unsigned-integer"
NOT_BOOL = ": attempt to access JSON non-boolean as boolean"
NOT_STRING = ": attempt to access JSON non-string as string"


def as_uint(value: Any, what: str, verb: str = "parse", detail: str = "") -> int:
    if not is_uint(value):
        raise invalid_arg(f"Unable to {verb} '{what}'{detail}")
    return value


def as_bool(value: Any, what: str, detail: str = "") -> bool:
    if type(value) is not bool:
        raise invalid_arg(f"Unable to parse '{what}'{detail}")
    return value


def as_object(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid_arg(f"Unable to parse '{what}'")
    return value


def custom_parameter(key: str, value: Any) -> Any:
    """A user parameter must be a string, bool, int64 or double; an integer past int64 becomes a
    double, as Triton's JSON parser reads it."""
    if isinstance(value, (str, bool, float)):
        return value
    if type(value) is int:
        if _INT64_MIN <= value <= _INT64_MAX:
            return value
        try:
            return float(value)
        except OverflowError:
            pass  # beyond any double
    raise invalid_arg(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")


def apply_request_parameters(raw: Any, request: InferenceRequest) -> bool:
    """Decode request-level parameters into `request`; returns the default binary_data_output flag."""
    params = as_object(raw, "parameters")
    binary_output = False
    for key, value in params.items():
        if key == "sequence_id":
            if is_uint(value):
                request.sequence_id = value
            elif isinstance(value, str):
                request.sequence_id = value
            else:
                raise invalid_arg("Unable to parse 'sequence_id'" + NOT_STRING)
        elif key == "sequence_start":
            request.sequence_start = as_bool(value, key, NOT_BOOL)
        elif key == "sequence_end":
            request.sequence_end = as_bool(value, key, NOT_BOOL)
        elif key == "priority":
            request.priority = as_uint(value, key, detail=NOT_UINT)
        elif key == "timeout":
            request.timeout_us = as_uint(value, key, detail=NOT_UINT)
        elif key == "binary_data_output":
            binary_output = as_bool(value, key, NOT_BOOL)
        elif key.startswith("triton_"):
            raise invalid_arg(RESERVED_PREFIX_MESSAGE)
        else:
            request.parameters[key] = custom_parameter(key, value)
    return binary_output


def shared_memory_ref(params: dict[str, Any]) -> SharedMemoryRef:
    """The region/byte_size/offset triple of an input or output using shared memory."""
    region = params.get("shared_memory_region")
    if not isinstance(region, str):
        raise invalid_arg("Unable to parse 'shared_memory_region'")
    if "shared_memory_byte_size" not in params:
        raise invalid_arg(f"'shared_memory_byte_size' must be specified with 'shared_memory_region' '{region}'")
    byte_size = as_uint(params["shared_memory_byte_size"], "shared_memory_byte_size")
    offset = as_uint(params.get("shared_memory_offset", 0), "shared_memory_offset")
    return SharedMemoryRef(region=region, byte_size=byte_size, offset=offset)


def check_input_source(name: str, has_data: bool, has_binary: bool, has_shm: bool) -> None:
    """An input needs exactly one data source (Triton's wording)."""
    count = has_data + has_binary + has_shm
    if count == 1:
        return
    message = (
        f"Input '{name}' must set only one of the following fields: 'data', 'binary_data_size' in "
        "'parameters', 'shared_memory_region' in 'parameters'. But"
    )
    if count == 0:
        message += " no field is set"
    else:
        message += " set"
        if has_data:
            message += " 'data'"
        if has_binary:
            message += " 'binary_data_size'"
        if has_shm:
            message += " 'shared_memory_region'"
    raise invalid_arg(message)


def remaining_parameters(params: dict[str, Any], consumed: tuple[str, ...]) -> dict[str, Any]:
    """Tensor parameters minus the ones the frontend consumed itself."""
    if not params:
        return {}
    return {k: v for k, v in params.items() if k not in consumed}
