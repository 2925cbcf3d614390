"""The v2 datatype table: protocol names, config enum names, numpy dtypes, byte sizes."""

from __future__ import annotations

import sys

import numpy as np

# protocol datatype -> numpy dtype. BF16 has no numpy type: it travels as raw uint16 words.
NUMPY_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
    "BF16": np.dtype(np.uint16),
}

# Little-endian wire dtypes (the binary extension is little-endian whatever the host). On a little-endian
# host they are the native dtype objects themselves: arrays made from wire bytes then pass the `is` checks
# of the fast paths (a `newbyteorder("<")` copy is equal but not the same object, and sent every binary
# HTTP and gRPC input of a Python model down the general worker message path).
WIRE_DTYPES: dict[str, np.dtype] = {
    name: (dt.newbyteorder("<") if dt.kind in "iuf" and sys.byteorder != "little" else dt)
    for name, dt in NUMPY_DTYPES.items()
    if name != "BYTES"
}

# Datatypes whose wire bytes are an array of the native dtype as they are (every one but BYTES on a
# little-endian host): the binary header memo and the binary encoder's fast path.
NATIVE_WIRE_DTYPES: dict[str, np.dtype] = {name: dt for name, dt in WIRE_DTYPES.items() if dt is NUMPY_DTYPES[name]}

BYTE_SIZES: dict[str, int] = {name: dt.itemsize for name, dt in WIRE_DTYPES.items()}

# config enum (TYPE_*) <-> protocol name
CONFIG_TO_PROTOCOL: dict[str, str] = {
    "TYPE_BOOL": "BOOL",
    "TYPE_UINT8": "UINT8",
    "TYPE_UINT16": "UINT16",
    "TYPE_UINT32": "UINT32",
    "TYPE_UINT64": "UINT64",
    "TYPE_INT8": "INT8",
    "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_FP16": "FP16",
    "TYPE_FP32": "FP32",
    "TYPE_FP64": "FP64",
    "TYPE_STRING": "BYTES",
    "TYPE_BF16": "BF16",
}
PROTOCOL_TO_CONFIG: dict[str, str] = {v: k for k, v in CONFIG_TO_PROTOCOL.items()}

_NUMPY_TO_PROTOCOL: dict[np.dtype, str] = {
    dt: name for name, dt in NUMPY_DTYPES.items() if name not in ("BF16",)
}


def is_valid_datatype(datatype: str) -> bool:
    """True for every datatype name the v2 protocol defines."""
    return datatype in NUMPY_DTYPES


def numpy_dtype(datatype: str) -> np.dtype:
    """numpy dtype used in memory for a protocol datatype."""
    return NUMPY_DTYPES[datatype]


def datatype_of_array(array: np.ndarray) -> str:
    """Protocol datatype for a numpy array (str/bytes arrays count as BYTES)."""
    if array.dtype.kind in ("S", "U", "O"):
        return "BYTES"
    try:
        return _NUMPY_TO_PROTOCOL[array.dtype.newbyteorder("=")]
    except KeyError:
        raise ValueError(f"no v2 datatype for numpy dtype {array.dtype}") from None
