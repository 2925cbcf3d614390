"""Requests and responses as flat tuples of builtins for the worker channel.

Pickling the dataclasses themselves costs the core about 3x more (each slotted object goes through
`__reduce_ex__`); the core's CPU per request bounds the whole server, so the infer messages are
flattened: tensors of a plain numeric dtype in native byte order travel as (dtype string, shape,
bytes) and come back as read-only numpy views over those bytes (as the HTTP decoder's views over a
body are); any other array (BYTES object arrays, extension dtypes) is pickled as it is. An input
sent by shared-memory reference travels as its reference: the core reads the region.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from naiad.protocol.types import (
    InferenceRequest,
    InferenceResponse,
    InferInput,
    OutputTensor,
    RequestedOutput,
)

Tensor = tuple[str, tuple[int, ...], bytes] | np.ndarray


def tensor_to_wire(array: np.ndarray) -> Tensor:
    dtype = array.dtype
    # isnative, not isbuiltin: the decoders' little-endian dtypes (np.frombuffer over a body or a
    # protobuf field) are native but not "builtin", and pickling the array costs 5x the flat form
    if dtype.kind in "biuf" and dtype.isnative:
        return dtype.str, array.shape, array.tobytes()
    return array


_DTYPES: dict[str, np.dtype] = {}  # dtype string -> dtype: np.dtype(str) parses it on every call


def tensor_from_wire(value: Tensor) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value  # pickled as it is
    dtype, shape, raw = value
    parsed = _DTYPES.get(dtype)
    if parsed is None:
        parsed = _DTYPES[dtype] = np.dtype(dtype)
    return np.ndarray(shape, parsed, raw)  # (read-only: a view over the bytes object)


def request_to_wire(request: InferenceRequest) -> tuple[Any, ...]:
    return (request.model_name, request.model_version, request.id,
            [(i.name, i.datatype, i.shape, None if i.data is None else tensor_to_wire(i.data), i.parameters or None,
              i.shared_memory) for i in request.inputs],
            [(o.name, o.parameters or None, o.classification, o.shared_memory) for o in request.outputs],
            request.parameters or None, request.priority, request.timeout_us,
            request.sequence_id, request.sequence_start, request.sequence_end)


def request_from_wire(wire: tuple[Any, ...]) -> InferenceRequest:
    model, version, request_id, inputs, outputs, parameters, priority, timeout_us, sequence_id, start, end = wire
    return InferenceRequest(
        model,
        [InferInput(name, datatype, shape, None if data is None else tensor_from_wire(data), params or {}, shm)
         for name, datatype, shape, data, params, shm in inputs],
        version, request_id,
        [RequestedOutput(name, params or {}, classification, shm) for name, params, classification, shm in outputs]
        if outputs else [],
        parameters or {}, priority, timeout_us, sequence_id, start, end)


def response_to_wire(response: InferenceResponse) -> tuple[Any, ...]:
    return (response.model_name, response.model_version, response.id, response.parameters or None,
            [(o.name, o.datatype, o.shape, None if o.data is None else tensor_to_wire(o.data), o.parameters or None)
             for o in response.outputs])


def response_from_wire(wire: tuple[Any, ...]) -> InferenceResponse:
    model, version, response_id, parameters, outputs = wire
    return InferenceResponse(
        model, version,
        [OutputTensor(name, datatype, shape, None if data is None else tensor_from_wire(data), params or {})
         for name, datatype, shape, data, params in outputs],
        response_id, parameters or {})
