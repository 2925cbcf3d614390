"""Turns a model's output arrays into the response: client-facing shapes, classification, shared memory."""

from __future__ import annotations

from typing import Any

import numpy as np

from naiad.core.model_version import ModelVersion, TensorSpec
from naiad.protocol.datatypes import datatype_of_array, numpy_dtype
from naiad.protocol.errors import invalid_arg
from naiad.protocol.tensor_codec import array_to_raw
from naiad.protocol.types import (
    InferenceRequest,
    InferenceResponse,
    OutputTensor,
    RequestedOutput,
)
from naiad.runtime.shared_memory import SystemSharedMemoryRegistry


def _client_facing(array: np.ndarray, spec: TensorSpec, batched: bool) -> np.ndarray:
    """Undo `reshape`: clients see [batch] + dims."""
    if spec.reshape is None:
        return array
    lead = array.shape[:1] if batched else ()
    dims = spec.dims
    if dims.count(-1) <= 1:
        return array.reshape(tuple(lead) + tuple(dims))
    return array


def _format_value(value: np.generic) -> str:
    """Triton prints classification values with C's %f for floats, plainly for integers."""
    if isinstance(value, (np.floating, float)):
        return f"{float(value):f}"
    return str(value)


def classify(array: np.ndarray, k: int, labels: tuple[str, ...], batched: bool) -> np.ndarray:
    """Top-k "value:index[:label]" strings per batch item (Triton's classification extension)."""
    rows = array.reshape(array.shape[0], -1) if batched and array.ndim else array.reshape(1, -1)
    if rows.dtype == np.object_:
        raise invalid_arg("classification is not supported for BYTES outputs")
    count = min(k, rows.shape[1])
    result = np.empty((rows.shape[0], count), dtype=np.object_)
    for r, row in enumerate(rows):
        order = np.argsort(-row.astype(np.float64), kind="stable")[:count]
        for c, index in enumerate(order):
            text = f"{_format_value(row[index])}:{index}"
            if labels and index < len(labels):
                text += f":{labels[index]}"
            result[r, c] = text.encode("utf-8")
    return result if batched else result.reshape(count)


def _requested(request: InferenceRequest, model: ModelVersion) -> list[RequestedOutput]:
    """Requested outputs in the model's output order (as Triton answers), duplicates merged."""
    by_name: dict[str, RequestedOutput] = {}
    for out in request.outputs:
        by_name.setdefault(out.name, out)
    return [by_name[name] for name in model.outputs if name in by_name]


def _typed(produced: np.ndarray, spec: TensorSpec, batched: bool) -> tuple[np.ndarray, str]:
    """An output array as clients see it, with its datatype."""
    array = _client_facing(produced if type(produced) is np.ndarray else np.asarray(produced), spec, batched)
    datatype = spec.datatype
    if datatype != "BYTES" and array.dtype != numpy_dtype(datatype):
        # as Triton: the response carries what the model produced, with its real datatype
        datatype = datatype_of_array(array)
    return array, datatype


def build_response(
    model: ModelVersion,
    request: InferenceRequest,
    arrays: dict[str, np.ndarray],
    shared_memory: SystemSharedMemoryRegistry,
) -> InferenceResponse:
    batched = model.max_batch_size > 0
    outputs: list[OutputTensor] = []
    # Outputs asked for by name alone (what gRPC clients usually send) are answered as unnamed ones are, among
    # the requested names: nothing to classify or write to shared memory (add_sub naming both outputs: ~10k
    # instructions less per request than _build_requested, which takes any other request).
    names: set[str] | None = None
    if request.outputs:
        names = set()
        for out in request.outputs:
            if out.classification > 0 or out.shared_memory is not None:
                return _build_requested(model, request, arrays, shared_memory, batched)
            names.add(out.name)
    for name, spec, dtype in model.output_plan:
        # as Triton: an output the model did not produce is left out of the response
        if name in arrays and (names is None or name in names):
            array = arrays[name]
            if type(array) is np.ndarray and array.dtype is dtype and spec.reshape is None:
                datatype = spec.datatype  # what _typed gives for it, without the call
            else:
                array, datatype = _typed(array, spec, batched)
            outputs.append(OutputTensor(name, datatype, array.shape, array, {}))
    return InferenceResponse(model.name, model.version_str, outputs, request.id, {})  # positional: a faster __init__


def _build_requested(
    model: ModelVersion, request: InferenceRequest, arrays: dict[str, np.ndarray],
    shared_memory: SystemSharedMemoryRegistry, batched: bool,
) -> InferenceResponse:
    """build_response for requested outputs that ask for classification or shared memory."""
    outputs: list[OutputTensor] = []
    for wanted in _requested(request, model):
        spec = model.outputs[wanted.name]
        if wanted.name not in arrays:
            continue
        array, datatype = _typed(arrays[wanted.name], spec, batched)
        if wanted.classification > 0:
            array = classify(array, wanted.classification, spec.labels, batched)
            datatype = "BYTES"
        parameters: dict[str, Any] = {}
        data: np.ndarray | None = array
        if wanted.shared_memory is not None:
            ref = wanted.shared_memory
            shared_memory.write(ref, array_to_raw(array, datatype), wanted.name)
            data = None  # as Triton: name, datatype and shape only, no parameters echoed
        outputs.append(OutputTensor(wanted.name, datatype, tuple(array.shape), data, parameters))
    return InferenceResponse(model.name, model.version_str, outputs, id=request.id)
