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
    """(request_to_wire and response_to_wire inline this rule.)"""
    dtype = array.dtype
    # isnative, not isbuiltin: the decoders' little-endian dtypes (np.frombuffer over a body or a
    # protobuf field) are native but not "builtin", and pickling the array costs 5x the flat form
    if dtype.kind in "biuf" and dtype.isnative:
        return dtype.str, array.shape, array.tobytes()
    return array


class _Dtypes(dict[str, np.dtype]):
    """dtype string -> dtype: np.dtype(str) parses it on every call."""

    def __missing__(self, key: str) -> np.dtype:
        parsed = self[key] = np.dtype(key)
        return parsed


_DTYPES = _Dtypes()


def tensor_from_wire(value: Tensor) -> np.ndarray:
    if value.__class__ is tuple:
        return np.ndarray(value[1], _DTYPES[value[0]], value[2])  # (read-only: a view over the bytes object)
    return value  # type: ignore[return-value]  (an array pickled as it is)


def request_to_wire(request: InferenceRequest) -> tuple[Any, ...]:
    inputs = []
    for i in request.inputs:
        data = i.data
        if data is not None:
            # tensor_to_wire inlined (here and in response_to_wire): a tenth fewer instructions per call
            dtype = data.dtype
            data = (dtype.str, data.shape, data.tobytes()) if dtype.kind in "biuf" and dtype.isnative else data
        inputs.append((i.name, i.datatype, i.shape, data, i.parameters or None, i.shared_memory))
    return (request.model_name, request.model_version, request.id, inputs,
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
    outputs = []
    for o in response.outputs:
        data = o.data
        if data is not None:
            dtype = data.dtype
            data = (dtype.str, data.shape, data.tobytes()) if dtype.kind in "biuf" and dtype.isnative else data
        outputs.append((o.name, o.datatype, o.shape, data, o.parameters or None))
    return response.model_name, response.model_version, response.id, response.parameters or None, outputs


def response_from_wire(wire: tuple[Any, ...]) -> InferenceResponse:
    model, version, response_id, parameters, outputs = wire
    return InferenceResponse(
        model, version,
        [OutputTensor(name, datatype, shape, None if data is None else tensor_from_wire(data), params or {})
         for name, datatype, shape, data, params in outputs],
        response_id, parameters or {})
