"""DLPack capsules for what numpy cannot express: BF16 tensors in both directions (ctypes, CPU only)."""

from __future__ import annotations

import ctypes
import itertools
from typing import Any

import numpy as np

_KDL_CPU = 1
_KDL_BFLOAT = 4
_NAME = b"dltensor"
_USED_NAME = b"used_dltensor"


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
# Raw-pointer variants for the capsule destructor, which must not create references to the dying capsule.
_raw_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_raw_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))

# Keeps exported arrays (and their ctypes structs) alive until the consumer calls the deleter.
_exports: dict[int, tuple] = {}
_ids = itertools.count(1)


@_DELETER
def _delete(managed_ptr) -> None:
    key = managed_ptr.contents.manager_ctx
    _exports.pop(int(key or 0), None)


_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@_CAPSULE_DESTRUCTOR
def _destroy_capsule(capsule_ptr) -> None:
    if _raw_is_valid(capsule_ptr, _NAME):  # never consumed: release it ourselves
        pointer = _raw_get_pointer(capsule_ptr, _NAME)
        managed = ctypes.cast(pointer, ctypes.POINTER(_DLManagedTensor))
        _delete(managed)


def bf16_capsule(words: np.ndarray) -> Any:
    """A "dltensor" capsule describing a uint16 array of bfloat16 words as kDLBfloat/16 (zero-copy)."""
    array = np.ascontiguousarray(words, dtype=np.uint16)
    key = next(_ids)
    shape = (ctypes.c_int64 * max(array.ndim, 1))(*array.shape)
    managed = _DLManagedTensor()
    managed.dl_tensor.data = array.ctypes.data
    managed.dl_tensor.device = _DLDevice(_KDL_CPU, 0)
    managed.dl_tensor.ndim = array.ndim
    managed.dl_tensor.dtype = _DLDataType(_KDL_BFLOAT, 16, 1)
    managed.dl_tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    managed.dl_tensor.strides = None
    managed.dl_tensor.byte_offset = 0
    managed.manager_ctx = key
    managed.deleter = _delete
    _exports[key] = (array, shape, managed)
    return _api.PyCapsule_New(ctypes.addressof(managed), _NAME, ctypes.cast(_destroy_capsule, ctypes.c_void_p))


def is_capsule(obj: Any) -> bool:
    return type(obj).__name__ == "PyCapsule"


def capsule_dtype(capsule: Any) -> tuple[int, int, int]:
    """(code, bits, device_type) of an unconsumed "dltensor" capsule."""
    if not _api.PyCapsule_IsValid(capsule, _NAME):
        raise ValueError("expected an unconsumed DLPack capsule named 'dltensor'")
    managed = ctypes.cast(_api.PyCapsule_GetPointer(capsule, _NAME), ctypes.POINTER(_DLManagedTensor)).contents
    tensor = managed.dl_tensor
    return tensor.dtype.code, tensor.dtype.bits, tensor.device.device_type


def consume_bf16(capsule: Any) -> np.ndarray:
    """Copy a bfloat16 capsule's data out as uint16 words, then release the producer's tensor."""
    pointer = _api.PyCapsule_GetPointer(capsule, _NAME)
    managed_ptr = ctypes.cast(pointer, ctypes.POINTER(_DLManagedTensor))
    tensor = managed_ptr.contents.dl_tensor
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    count = int(np.prod(shape)) if shape else 1
    base = (tensor.data or 0) + tensor.byte_offset
    if tensor.strides:
        strides = tuple(tensor.strides[i] * 2 for i in range(tensor.ndim))
    else:
        strides = None
    if count == 0:
        result = np.zeros(shape, dtype=np.uint16)
    else:
        extent = 1 + sum((d - 1) * (s // 2) for d, s in zip(shape, strides)) if strides else count
        raw = np.ctypeslib.as_array(ctypes.cast(base, ctypes.POINTER(ctypes.c_uint16)), shape=(extent,))
        view = np.lib.stride_tricks.as_strided(raw, shape=shape, strides=strides) if strides else raw.reshape(shape)
        result = np.array(view, dtype=np.uint16, copy=True)
    _api.PyCapsule_SetName(capsule, _USED_NAME)
    deleter = managed_ptr.contents.deleter
    if deleter:
        deleter(managed_ptr)
    return result


class CapsuleHolder:
    """Lets numpy's from_dlpack consume a bare capsule (it expects an object with __dlpack__)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_KDL_CPU, 0)
