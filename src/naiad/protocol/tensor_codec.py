"""Tensor encodings shared by the frontends: raw little-endian bytes, BYTES length prefixes, JSON lists.

Every decoder checks sizes with Python integers before allocating, so an absurd declared
shape is refused instead of exhausting memory.
"""

from __future__ import annotations

import array
import math
import struct
from typing import Any

import numpy as np
import orjson

from naiad.protocol.datatypes import (
    BYTE_SIZES,
    NUMPY_DTYPES,
    WIRE_DTYPES,
    is_valid_datatype,
    numpy_dtype,
)
from naiad.protocol.errors import NaiadError, invalid_arg
from naiad.protocol.request_json import json_preview

MAX_JSON_DEPTH = 100
_LEN = struct.Struct("<I")


def element_count(shape: tuple[int, ...] | list[int]) -> int:
    """Product of dims as an exact Python int (no overflow for hostile shapes)."""
    return math.prod(shape)


def parse_shape(raw: Any, input_name: str) -> tuple[int, ...]:
    """Validate a wire shape: a list of non-negative integers."""
    if not isinstance(raw, (list, tuple)):
        raise invalid_arg(f"shape of input '{input_name}' must be an array of non-negative integers")
    for dim in raw:
        if type(dim) is int and dim >= 0:
            continue  # the usual dimension, told apart in one test (a bool's type is not int)
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise invalid_arg(
                f"shape of input '{input_name}' must contain only non-negative integers, got {json_preview(list(raw))}"
            )
    return tuple(raw)


def check_datatype(datatype: Any, input_name: str) -> str:
    if not isinstance(datatype, str) or not is_valid_datatype(datatype):
        raise invalid_arg(f"invalid datatype '{datatype}' for input '{input_name}'")
    return datatype


def byte_size_of(datatype: str, shape: tuple[int, ...]) -> int | None:
    """Byte size of a fixed-size tensor; None for BYTES (variable)."""
    size = BYTE_SIZES.get(datatype)
    return None if size is None else size * element_count(shape)


# ---------------------------------------------------------------- raw bytes


def array_from_raw(datatype: str, shape: tuple[int, ...], buffer: bytes | memoryview, name: str) -> np.ndarray:
    """Decode raw wire bytes into an array of `shape` without copying fixed-size data."""
    if datatype == "BYTES":
        return deserialize_bytes(buffer, shape, name)
    expected = BYTE_SIZES[datatype] * element_count(shape)
    if len(buffer) != expected:
        raise invalid_arg(
            f"unexpected total byte size {len(buffer)} for input '{name}', expecting {expected}"
        )
    array = np.frombuffer(buffer, dtype=WIRE_DTYPES[datatype])
    native = numpy_dtype(datatype)
    if array.dtype != native:
        array = array.astype(native)
    return array.reshape(shape)


def deserialize_bytes(buffer: bytes | memoryview, shape: tuple[int, ...], name: str) -> np.ndarray:
    """Parse 4-byte-length-prefixed elements; the count must equal the shape's element count."""
    count = element_count(shape)
    view = memoryview(buffer)
    total = len(view)
    if count * 4 > total:
        raise invalid_arg(
            f"unexpected number of string elements for input '{name}', expecting {count} "
            f"but the {total} bytes of data cannot hold them"
        )
    items: list[bytes] = []
    offset = 0
    while offset < total:
        if offset + 4 > total:
            raise invalid_arg(f"element byte size indicator for input '{name}' is truncated")
        (length,) = _LEN.unpack_from(view, offset)
        offset += 4
        if offset + length > total:
            raise invalid_arg(
                f"element byte size {length} for input '{name}' exceeds the remaining {total - offset} bytes"
            )
        items.append(bytes(view[offset : offset + length]))
        offset += length
        if len(items) > count:
            break
    if len(items) != count:
        raise invalid_arg(
            f"unexpected number of string elements {len(items)} for input '{name}', expecting {count}"
        )
    array = np.empty(count, dtype=np.object_)
    array[:] = items
    return array.reshape(shape)


def _as_bytes(item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, np.bytes_):
        return bytes(item)
    return str(item).encode("utf-8")


def serialize_bytes(array: np.ndarray) -> bytes:
    """Length-prefixed row-major serialization of a BYTES tensor."""
    parts: list[bytes] = []
    for item in array.ravel(order="C"):
        data = _as_bytes(item)
        parts.append(_LEN.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def array_to_raw(array: np.ndarray, datatype: str) -> bytes | memoryview:
    """Encode an array as raw wire bytes (a view of it when already little-endian and contiguous)."""
    if datatype == "BYTES":
        return serialize_bytes(array)
    wire = WIRE_DTYPES[datatype]
    if array.dtype != wire:
        array = array.astype(wire)
    array = np.ascontiguousarray(array)
    return array.data.cast("B") if array.size else b""


# ---------------------------------------------------------------- JSON


def _flatten(data: list[Any], name: str) -> list[Any]:
    """Flatten nested JSON lists row-major, refusing nesting deeper than MAX_JSON_DEPTH."""
    if not data or not isinstance(data[0], list):
        if any(isinstance(x, list) for x in data):
            raise invalid_arg(f"unable to parse 'data' of input '{name}': ragged nested arrays")
        return data
    flat: list[Any] = []
    stack: list[tuple[list[Any], int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise invalid_arg(f"'data' of input '{name}' is nested deeper than {MAX_JSON_DEPTH} levels")
        if node and isinstance(node[0], list):
            for child in reversed(node):
                if not isinstance(child, list):
                    raise invalid_arg(f"unable to parse 'data' of input '{name}': ragged nested arrays")
                stack.append((child, depth + 1))
        else:
            for x in node:
                if isinstance(x, list):
                    raise invalid_arg(f"unable to parse 'data' of input '{name}': ragged nested arrays")
            flat.extend(node)
    return flat


_FLOAT_CODES = {"FP32": "f", "FP64": "d"}  # struct / array module type codes of the float datatypes
PACKED_MAX = 1024  # longer float lists go to the array module (a struct holds a code per element)
# datatype -> {element count: the struct packing that many native floats}, for the few counts a server sees
_PACKERS: dict[str, dict[int, struct.Struct]] = {datatype: {} for datatype in _FLOAT_CODES}
_KIND_OK = {
    "b": ("b",),
    "i": ("i", "u"),
    "u": ("i", "u"),
    "f": ("i", "u", "f"),
}


def _new_packer(datatype: str, count: int) -> struct.Struct:
    packers = _PACKERS[datatype]
    if len(packers) >= 64:
        packers.clear()
    packer = packers[count] = struct.Struct(f"={count}{_FLOAT_CODES[datatype]}")
    return packer


def _struct_packed(datatype: str, shape: Any, data: list[Any], count: int) -> np.ndarray | None:
    """`count` (<= PACKED_MAX) floats of `data` packed by a struct straight into a new `shape` array, or None
    when the struct refuses them (not a number, or +-inf in FP32: the array module's way decides)."""
    packers = _PACKERS[datatype]
    packed = np.empty(shape, NUMPY_DTYPES[datatype])
    try:
        # (an ndarray is a writable buffer; numpy's stubs declare __buffer__ only for Python >= 3.12)
        (packers.get(count) or _new_packer(datatype, count)).pack_into(packed, 0, *data)  # type: ignore[arg-type]
    except (struct.error, OverflowError):
        return None
    return packed


def usual_float_array(datatype: str, raw_shape: Any, data: Any) -> np.ndarray | None:
    """The usual JSON input of a float datatype, in one call: a shape of non-negative integers and a
    flat list led by a float, as many as the shape holds (at most PACKED_MAX), packed as
    array_from_json packs it. None for anything else, and for any doubt (then parse_shape and
    array_from_json decide, and word the errors): this never raises. Its array's shape is
    tuple(raw_shape). One call instead of parse_shape's and array_from_json's, and their checks
    done once: ~5k instructions fewer per input."""
    if datatype not in _PACKERS or type(raw_shape) is not list or type(data) is not list:
        return None
    count = 1
    for dim in raw_shape:
        if type(dim) is not int or dim < 0:  # (a bool's type is not int)
            return None
        count *= dim
    if not 0 < count <= PACKED_MAX or len(data) != count or type(data[0]) is not float:
        return None
    return _struct_packed(datatype, raw_shape, data, count)


def array_from_json(datatype: str, shape: tuple[int, ...], data: Any, name: str) -> np.ndarray:
    """Decode a JSON `data` field (flat or nested, row-major) into an array of `shape`."""
    if datatype in _PACKERS and type(data) is list and data and type(data[0]) is float:
        # The usual float input, a flat list led by a float: packed in one pass with numpy's values
        # (each number as a double, then rounded to the type), where numpy would first build a float64
        # array. A struct packs it straight into the new array (~4k instructions fewer than the array
        # module for 16 FP32); it refuses what the array module makes +-inf (FP32 past its range), which
        # then packs it. Anything both refuse (a nested list, a string, ...) takes the general path below.
        count = len(data)
        if count == math.prod(shape):
            if count <= PACKED_MAX:
                packed = _struct_packed(datatype, shape, data, count)
                if packed is not None:
                    return packed
            try:
                floats = array.array(_FLOAT_CODES[datatype], data)
            except (TypeError, OverflowError):
                pass
            else:
                return np.ndarray(shape, NUMPY_DTYPES[datatype], floats)
    if datatype in ("FP16", "BF16"):
        raise invalid_arg(
            f"receiving {datatype} data via JSON is not supported. Please use the binary data format for input"
        )
    if not isinstance(data, list):
        data = [data]
    if datatype != "BYTES":
        regular = _regular_numbers(data, datatype, shape, name)
        if regular is not None:
            return regular
    flat = _flatten(data, name)
    expected = element_count(shape)
    if len(flat) != expected:
        raise invalid_arg(
            f"unable to parse 'data' of input '{name}': Shape does not match true shape of 'data' field "
            f"(expected {expected} elements, got {len(flat)})"
        )
    if datatype == "BYTES":
        strings = np.empty(len(flat), dtype=np.object_)
        for i, item in enumerate(flat):
            if not isinstance(item, str):
                raise invalid_arg(f"unable to parse 'data' of input '{name}': expected string elements for BYTES")
            strings[i] = item.encode("utf-8")
        return strings.reshape(shape)
    return _numbers_from_json(flat, datatype, name).reshape(shape)


def _regular_numbers(data: list[Any], datatype: str, shape: tuple[int, ...], name: str) -> np.ndarray | None:
    """The usual `data` in one numpy call: a flat or evenly nested list of numbers of a kind that
    suits `datatype`, as many as `shape` holds. None for anything else (ragged, mixed, too deep,
    empty, wrong count, ...): the element-by-element path then decides and words the error.
    Checking each element in Python first cost more than numpy's whole conversion."""
    if not data:
        return None
    try:
        parsed = np.asarray(data)
    except (ValueError, TypeError, OverflowError):
        return None
    dtype = NUMPY_DTYPES[datatype]
    kind = parsed.dtype.kind
    # (numpy nests at most 64 levels, within MAX_JSON_DEPTH)
    if kind not in _KIND_OK[dtype.kind] or parsed.size != math.prod(shape):
        return None
    if kind in "iu" and dtype.kind in "iu":
        _check_range(int(parsed.min()), int(parsed.max()), datatype, dtype, name)
    elif kind == "f" and parsed.dtype != dtype:
        with np.errstate(over="ignore"):  # FP32 past its range becomes +-inf, as in Triton
            return parsed.astype(dtype).reshape(shape)
    return parsed.astype(dtype, copy=False).reshape(shape)


def _numbers_from_json(flat: list[Any], datatype: str, name: str) -> np.ndarray:
    """A flat list of JSON numbers (or booleans for BOOL) as a `datatype` array.

    Integers must fit the type (a clear 400 where Triton would wrap them); floats round to
    the type as IEEE conversion does (FP32 past its range becomes +-inf, as in Triton).
    """
    dtype = numpy_dtype(datatype)
    if not flat:
        return np.empty(0, dtype=dtype)
    try:
        parsed = np.asarray(flat)
    except (ValueError, TypeError, OverflowError):
        parsed = np.asarray(flat, dtype=np.object_)
    if parsed.dtype.kind == "O" or (dtype.kind in "iu" and parsed.dtype.kind == "f"):
        # numpy found no integer type for all of them: Python ints beyond int64 (UINT64's upper
        # half) next to other ints, or a genuine mix of types. Decide element by element.
        parsed = _python_numbers(flat, datatype, dtype, name)
    elif parsed.dtype.kind not in _KIND_OK[dtype.kind]:
        raise _not_valid(datatype, name)
    if parsed.dtype.kind in "iu" and dtype.kind in "iu":
        _check_range(int(parsed.min()), int(parsed.max()), datatype, dtype, name)
    with np.errstate(over="ignore"):
        return parsed.astype(dtype, copy=False)


def _python_numbers(flat: list[Any], datatype: str, dtype: np.dtype, name: str) -> np.ndarray:
    if dtype.kind in "iu":
        if not all(type(x) is int for x in flat):
            raise _not_valid(datatype, name)
        _check_range(min(flat), max(flat), datatype, dtype, name)
        return np.array(flat, dtype=dtype)
    if dtype.kind == "f" and all(type(x) in (int, float) for x in flat):
        try:
            return np.array(flat, dtype=np.float64)
        except OverflowError:  # an integer too large even for a double
            raise invalid_arg(f"unable to parse 'data' of input '{name}': value out of range for {datatype}") from None
    raise _not_valid(datatype, name)


def _check_range(low: int, high: int, datatype: str, dtype: np.dtype, name: str) -> None:
    info = np.iinfo(dtype)
    if low < info.min or high > info.max:
        bad = low if low < info.min else high
        raise invalid_arg(
            f"unable to parse 'data' of input '{name}': value {bad} is out of range for {datatype} "
            f"[{info.min}, {info.max}]"
        )


def _not_valid(datatype: str, name: str) -> NaiadError:
    return invalid_arg(f"unable to parse 'data' of input '{name}': elements are not valid {datatype} values")


def has_non_finite(flat: np.ndarray) -> bool:
    """True when a float array holds NaN or +-inf (which JSON proper cannot spell)."""
    return flat.dtype.kind == "f" and not bool(np.isfinite(flat).all())


def _non_finite_token(value: float) -> bytes:
    return b"NaN" if value != value else (b"Infinity" if value > 0 else b"-Infinity")


def non_finite_json(flat: np.ndarray) -> list[Any]:
    """Elements ready for orjson, with NaN / Infinity / -Infinity spelled as Triton writes them
    (orjson alone would write null). Finite elements stay numpy scalars, written at their precision."""
    return [x if np.isfinite(x) else orjson.Fragment(_non_finite_token(x)) for x in flat]


def non_finite_json_array(flat: np.ndarray) -> orjson.Fragment:
    """The whole JSON array of a 1-D float array holding NaN or +-inf, as one orjson Fragment: the
    finite runs between those elements are written by orjson from numpy (fast, at the array's
    precision), the others as NaN / Infinity / -Infinity."""
    parts: list[bytes] = []
    start = 0
    for index in np.flatnonzero(~np.isfinite(flat)).tolist():
        if index > start:
            parts.append(orjson.dumps(flat[start:index], option=orjson.OPT_SERIALIZE_NUMPY)[1:-1])
        parts.append(_non_finite_token(flat[index]))
        start = index + 1
    if start < len(flat):
        parts.append(orjson.dumps(flat[start:], option=orjson.OPT_SERIALIZE_NUMPY)[1:-1])
    return orjson.Fragment(b"[" + b",".join(parts) + b"]")


def array_to_json(array: np.ndarray, datatype: str) -> list[Any]:
    """Flat row-major list of an output tensor, for orjson (non-finite floats are orjson Fragments)."""
    if datatype in ("FP16", "BF16"):
        raise NaiadError(
            invalid_arg("").code,
            f"sending {datatype} data via JSON is not supported. Please use the binary data format for output",
        )
    flat = array.ravel(order="C")
    if datatype == "BYTES":
        return [_as_bytes(x).decode("utf-8", errors="replace") for x in flat]
    if has_non_finite(flat):
        return non_finite_json(flat)
    return flat.tolist()
