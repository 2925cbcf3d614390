"""pb_utils.Tensor and the datatype tables (config TYPE_* names, enum values, numpy dtypes)."""

from __future__ import annotations

from typing import Any

import numpy as np

from triton_python_backend_utils import _dlpack
from triton_python_backend_utils._errors import TritonModelException
from triton_python_backend_utils._text import text

# TYPE_* enum values of model_config.proto (also TRITONSERVER_DataType values).
TYPE_VALUES = {
    "TYPE_INVALID": 0, "TYPE_BOOL": 1, "TYPE_UINT8": 2, "TYPE_UINT16": 3, "TYPE_UINT32": 4, "TYPE_UINT64": 5,
    "TYPE_INT8": 6, "TYPE_INT16": 7, "TYPE_INT32": 8, "TYPE_INT64": 9, "TYPE_FP16": 10, "TYPE_FP32": 11,
    "TYPE_FP64": 12, "TYPE_STRING": 13, "TYPE_BF16": 14,
}
TRITON_STRING_TO_NUMPY = {
    "TYPE_BOOL": bool, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
_NUMPY_BY_VALUE = {
    1: np.bool_, 2: np.uint8, 3: np.uint16, 4: np.uint32, 5: np.uint64, 6: np.int8, 7: np.int16, 8: np.int32,
    9: np.int64, 10: np.float16, 11: np.float32, 12: np.float64, 13: np.object_,
}
_ndarray = np.ndarray
# protocol datatype <-> TYPE_* value
_PROTOCOL_VALUES = {
    "BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6, "INT16": 7, "INT32": 8, "INT64": 9,
    "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13, "BF16": 14,
}
_PROTOCOL_OF_NUMPY = {
    np.dtype(np.bool_): "BOOL", np.dtype(np.uint8): "UINT8", np.dtype(np.uint16): "UINT16",
    np.dtype(np.uint32): "UINT32", np.dtype(np.uint64): "UINT64", np.dtype(np.int8): "INT8",
    np.dtype(np.int16): "INT16", np.dtype(np.int32): "INT32", np.dtype(np.int64): "INT64",
    np.dtype(np.float16): "FP16", np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64",
}


def triton_to_numpy_type(data_type: int) -> Any:
    """numpy type of a TYPE_* enum value (None for unknown values and BF16)."""
    return _NUMPY_BY_VALUE.get(int(data_type))


def numpy_to_triton_type(data_type: Any) -> int | None:
    """TYPE_* enum value of a numpy dtype/type (object and bytes_ are TYPE_STRING)."""
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind in ("O", "S"):
        return 13
    name = _PROTOCOL_OF_NUMPY.get(dtype.newbyteorder("="))
    return _PROTOCOL_VALUES[name] if name else None


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def protocol_datatype(array: np.ndarray) -> str:
    dtype = array.dtype
    name = _PROTOCOL_OF_NUMPY.get(dtype)  # native byte order: found as is (newbyteorder makes a new dtype)
    if name is not None:
        return name
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    name = _PROTOCOL_OF_NUMPY.get(dtype.newbyteorder("="))
    if name is None:
        raise TritonModelException(f"unsupported numpy dtype {array.dtype} for a tensor")
    return name


class Tensor:
    """A named tensor backed by a numpy array (BYTES: object array of bytes; BF16: uint16 words)."""

    __slots__ = ("_name", "_array", "_datatype")

    def __init__(self, name: str, data: Any, dtype: str | None = None) -> None:
        if type(name) is not str:
            name = text(name, "Tensor name")
        if dtype is None and type(data) is _ndarray:
            # The usual call, Tensor(name, array) with an array of a native numeric dtype: set at once.
            found = _PROTOCOL_OF_NUMPY.get(data.dtype)
            if found is not None:
                self._name = name
                self._array = data
                self._datatype = found
                return
        array = data if isinstance(data, np.ndarray) else np.asarray(data)
        if dtype == "BF16":
            array = array.view(np.uint16) if array.dtype.itemsize == 2 else array.astype(np.uint16)
            datatype = "BF16"
        else:
            # Native-order numeric dtypes (nearly every tensor) are found at once, with nothing to convert.
            found = _PROTOCOL_OF_NUMPY.get(array.dtype)
            if found is None:
                found = protocol_datatype(array)
                if array.dtype.byteorder == ">":
                    array = array.astype(array.dtype.newbyteorder("="))
            datatype = found
        self._name = name
        self._array = array
        self._datatype = datatype

    @classmethod
    def _wrap(cls, name: str, array: np.ndarray, datatype: str) -> Tensor:
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        tensor._datatype = datatype
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if self._datatype == "BF16":
            raise TritonModelException(
                f"tensor '{self._name}' has datatype BF16, which numpy cannot represent: use to_dlpack()"
            )
        return self._array

    def triton_dtype(self) -> int:
        return _PROTOCOL_VALUES[self._datatype]

    def datatype(self) -> str:
        """The v2 protocol datatype name ("FP32", "BYTES", ...)."""
        return self._datatype

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def memory_type(self) -> int:
        return 0  # TRITONSERVER_MEMORY_CPU

    def memory_type_id(self) -> int:
        return 0

    def to_dlpack(self) -> Any:
        if self._datatype == "BYTES":
            raise TritonModelException("DLPack does not support BYTES tensors")
        if self._datatype == "BF16":
            return _dlpack.bf16_capsule(self._array)
        array = self._array
        if not array.flags.writeable or not array.flags.c_contiguous:
            array = np.array(array, copy=True)
        return array.__dlpack__()

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    @staticmethod
    def from_dlpack(name: str, tensor: Any) -> Tensor:
        """A Tensor from a DLPack capsule or an object with __dlpack__ (CPU memory)."""
        if _dlpack.is_capsule(tensor):
            capsule = tensor
        elif hasattr(tensor, "__dlpack__"):
            if hasattr(tensor, "__dlpack_device__"):
                device_type = tensor.__dlpack_device__()[0]
                if device_type not in (1, 3):  # kDLCPU, kDLCUDAHost
                    raise TritonModelException(
                        f"from_dlpack: tensor '{name}' is on a device this CPU server cannot read (type {device_type})"
                    )
            capsule = tensor.__dlpack__()
        else:
            raise TritonModelException("from_dlpack expects a DLPack capsule or an object implementing __dlpack__")
        code, bits, _ = _dlpack.capsule_dtype(capsule)
        if code == 4 and bits == 16:
            return Tensor._wrap(text(name, "Tensor name"), _dlpack.consume_bf16(capsule), "BF16")
        array = np.from_dlpack(_dlpack.CapsuleHolder(capsule))
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor(name={self._name!r}, datatype={self._datatype}, shape={list(self._array.shape)})"
