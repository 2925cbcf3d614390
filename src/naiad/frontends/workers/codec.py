"""Requests and responses as flat tuples of builtins for the worker channel.

Pickling the dataclasses themselves costs the core about 3x more (each slotted object goes through
`__reduce_ex__`); the core's CPU per request bounds the whole server, so the infer messages are
flattened, and the usual ones more so (fewer objects to pickle, unpickle and unpack):

- a tensor of a plain numeric dtype in native byte order, with no parameters and the shape of its
  array, travels as the 5-tuple (name, datatype, shape, dtype character, bytes) and comes back with
  a read-only numpy view over those bytes (as the HTTP decoder's views over a body are). The type
  character, not `dtype.str`: that one is formatted (printf) on each call, 4x the cost (~0.2 us a
  tensor), and a native byte order is the character's own;
- any other tensor as the 6-tuple (name, datatype, shape, data, parameters, shared memory), its data
  (dtype character, shape, bytes) as above when it can, else the array pickled as it is (BYTES object
  arrays, extension dtypes), or None (an input sent by shared-memory reference: the core reads the region);
- a request with no requested outputs, parameters, priority, timeout nor sequence travels as
  (model, version, id, inputs); any other as all eleven fields.

wire_request and wire_response also tell whether the tuple is plain (the short forms, every tensor a
5-tuple): such a message may travel as MessagePack rather than pickled (wire.PLAIN).
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

Tensor = tuple[str, tuple[int, ...], bytes] | np.ndarray  # (dtype character, shape, bytes) or an array
_ndarray = np.ndarray


def tensor_to_wire(array: np.ndarray) -> Tensor:
    """(request_to_wire and response_to_wire inline this rule.)"""
    dtype = array.dtype
    # isnative, not isbuiltin: the decoders' little-endian dtypes (np.frombuffer over a body or a
    # protobuf field) are native but not "builtin", and pickling the array costs 5x the flat form
    if dtype.kind in "biuf" and dtype.isnative:
        return dtype.char, array.shape, array.tobytes()
    return array


class _Dtypes(dict[str, np.dtype]):
    """dtype character -> dtype: np.dtype(char) parses it on every call."""

    def __missing__(self, key: str) -> np.dtype:
        parsed = self[key] = np.dtype(key)
        return parsed


_DTYPES = _Dtypes()


def tensor_from_wire(value: Tensor) -> np.ndarray:
    if value.__class__ is tuple:
        return np.ndarray(value[1], _DTYPES[value[0]], value[2])  # (read-only: a view over the bytes object)
    return value  # type: ignore[return-value]  (an array pickled as it is)


def _tensor(name: str, datatype: str, shape: Any, data: np.ndarray | None, parameters: dict[str, Any],
            extra: Any) -> tuple[Any, ...]:
    """The 5-tuple of a plain tensor, else the 6-tuple (`extra`: an input's shared-memory reference)."""
    if data is not None:
        dtype = data.dtype
        if dtype.kind in "biuf" and dtype.isnative:
            if not parameters and extra is None and shape == data.shape:
                return name, datatype, shape, dtype.char, data.tobytes()
            return name, datatype, shape, (dtype.char, data.shape, data.tobytes()), parameters or None, extra
    return name, datatype, shape, data, parameters or None, extra


def request_to_wire(request: InferenceRequest) -> tuple[Any, ...]:
    return wire_request(request)[0]


def wire_request(request: InferenceRequest) -> tuple[tuple[Any, ...], bool]:
    """request_to_wire's tuple, and whether it is the short form of plain tensors only (wire.PLAIN's)."""
    inputs = []
    plain = True
    for i in request.inputs:
        data = i.data
        # _tensor's short form tested inline (here and in wire_response): a call fewer per tensor
        if data is not None and not i.parameters and i.shared_memory is None:
            dtype = data.dtype
            shape = i.shape
            if dtype.kind in "biuf" and dtype.isnative and shape == data.shape:
                inputs.append((i.name, i.datatype, shape, dtype.char, data.tobytes()))
                continue
        plain = False  # (what the test above let through is _tensor's 6-tuple)
        inputs.append(_tensor(i.name, i.datatype, i.shape, data, i.parameters, i.shared_memory))
    if not (request.outputs or request.parameters or request.priority or request.timeout_us or request.sequence_id
            or request.sequence_start or request.sequence_end):
        return (request.model_name, request.model_version, request.id, inputs), plain
    return (request.model_name, request.model_version, request.id, inputs,
            [(o.name, o.parameters or None, o.classification, o.shared_memory) for o in request.outputs],
            request.parameters or None, request.priority, request.timeout_us,
            request.sequence_id, request.sequence_start, request.sequence_end), False


def _input(wired: tuple[Any, ...]) -> InferInput:
    name, datatype, shape, data, parameters, shm = wired
    return InferInput(name, datatype, shape, None if data is None else tensor_from_wire(data), parameters or {}, shm)


def request_from_wire(wire: tuple[Any, ...]) -> InferenceRequest:
    dtypes = _DTYPES
    inputs = [InferInput(i[0], i[1], i[2], _ndarray(i[2], dtypes[i[3]], i[4])) if len(i) == 5 else _input(i)
              for i in wire[3]]
    if len(wire) == 4:
        return InferenceRequest(wire[0], inputs, wire[1], wire[2])
    model, version, request_id, _, outputs, parameters, priority, timeout_us, sequence_id, start, end = wire
    return InferenceRequest(
        model, inputs, version, request_id,
        [RequestedOutput(name, params or {}, classification, shm) for name, params, classification, shm in outputs]
        if outputs else [],
        parameters or {}, priority, timeout_us, sequence_id, start, end)


def response_to_wire(response: InferenceResponse) -> tuple[Any, ...]:
    return wire_response(response)[0]


def wire_response(response: InferenceResponse) -> tuple[tuple[Any, ...], bool]:
    """response_to_wire's tuple, and whether it has no parameters and plain tensors only (wire.PLAIN's)."""
    outputs = []
    plain = True
    for o in response.outputs:
        data = o.data
        if data is not None and not o.parameters:
            dtype = data.dtype
            shape = o.shape
            if dtype.kind in "biuf" and dtype.isnative and shape == data.shape:
                outputs.append((o.name, o.datatype, shape, dtype.char, data.tobytes()))
                continue
        plain = False
        outputs.append(_tensor(o.name, o.datatype, o.shape, data, o.parameters, None))
    parameters = response.parameters or None
    return (response.model_name, response.model_version, response.id, parameters, outputs), plain and parameters is None


def _output(wired: tuple[Any, ...]) -> OutputTensor:
    name, datatype, shape, data, parameters, _ = wired
    return OutputTensor(name, datatype, shape, None if data is None else tensor_from_wire(data), parameters or {})


def response_from_wire(wire: tuple[Any, ...]) -> InferenceResponse:
    model, version, response_id, parameters, outputs = wire
    dtypes = _DTYPES
    return InferenceResponse(
        model, version,
        [OutputTensor(o[0], o[1], o[2], _ndarray(o[2], dtypes[o[3]], o[4])) if len(o) == 5 else _output(o)
         for o in outputs],
        response_id, parameters or {})
