"""Request data for perf: zero / random / JSON-file inputs shaped from model metadata, with the batch dim."""

from __future__ import annotations

import base64
import json
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from naiad.protocol.datatypes import NUMPY_DTYPES, WIRE_DTYPES
from naiad.tools.v2client import ModelInfo, TensorSpec


class InputError(ValueError):
    """The inputs cannot be built as asked (message says what to pass)."""


@dataclass
class Tensor:
    name: str
    datatype: str
    array: np.ndarray  # full shape, batch dim included when the model batches


InputSet = list[Tensor]  # one request's inputs


def parse_shapes(items: list[str]) -> dict[str, list[int]]:
    """`--shape NAME:d1,d2` (repeatable) -> {NAME: [d1, d2]}."""
    shapes: dict[str, list[int]] = {}
    for item in items:
        name, sep, dims = item.rpartition(":")
        if not sep or not name:
            raise InputError(f"--shape expects NAME:d1,d2,..., got '{item}'")
        try:
            shapes[name] = [int(d) for d in dims.split(",") if d.strip()]
        except ValueError:
            raise InputError(f"--shape {item}: dims must be integers") from None
    return shapes


def tensor_dims(spec: TensorSpec, batched: bool, shapes: dict[str, list[int]]) -> list[int]:
    """The per-sample dims (no batch dim) with variable dims filled from --shape."""
    dims = spec.shape[1:] if batched else list(spec.shape)
    if spec.name in shapes:
        given = shapes[spec.name]
        if len(given) != len(dims) or any(d >= 0 and d != g for d, g in zip(dims, given)):
            raise InputError(f"--shape {spec.name}:{','.join(map(str, given))} does not fit the model's dims {dims}")
        return list(given)
    if any(d < 0 for d in dims):
        raise InputError(f"input '{spec.name}' has variable dims {dims}: give them with --shape {spec.name}:d1,d2,...")
    return list(dims)


def _random_strings(rng: np.random.Generator, count: int, length: int) -> np.ndarray:
    alphabet = np.array(list(string.ascii_letters + string.digits))
    picks = rng.integers(0, alphabet.size, size=(count, length))
    return np.array(["".join(alphabet[row]).encode() for row in picks] or [], dtype=np.object_)


def synthetic_sample(spec: TensorSpec, dims: list[int], mode: str, rng: np.random.Generator,
                     string_length: int = 128, string_data: str | None = None) -> np.ndarray:
    """One sample (no batch dim): zeros or random values of the input's datatype."""
    count = int(np.prod(dims)) if dims else 1
    if spec.datatype == "BYTES":
        if string_data is not None:
            values = np.array([string_data.encode()] * count, dtype=np.object_)
        elif mode == "zero":
            values = np.array([b"0" * string_length] * count, dtype=np.object_)
        else:
            values = _random_strings(rng, count, string_length)
        return values.reshape(dims)
    dtype = WIRE_DTYPES[spec.datatype]
    if mode == "zero":
        return np.zeros(dims, dtype=dtype)
    if spec.datatype == "BOOL":
        return rng.integers(0, 2, size=dims).astype(np.bool_)
    if dtype.kind == "f":
        return rng.random(size=dims).astype(dtype)
    high = min(int(np.iinfo(dtype).max), 127) + 1
    return rng.integers(0, high, size=dims).astype(dtype)


def _from_json_value(spec: TensorSpec, value: Any, dims: list[int]) -> np.ndarray:
    shape = dims
    if isinstance(value, dict):
        if "shape" in value:
            shape = [int(d) for d in value["shape"]]
        if "b64" in value:
            raw = base64.b64decode(value["b64"])
            if spec.datatype == "BYTES":
                return np.array([raw], dtype=np.object_).reshape(shape or [1])
            return np.frombuffer(raw, dtype=WIRE_DTYPES[spec.datatype]).reshape(shape)
        value = value.get("content", value.get("data"))
    flat = np.asarray(value).ravel()
    if spec.datatype == "BYTES":
        array = np.array([v.encode() if isinstance(v, str) else bytes(v) for v in flat.tolist()], dtype=np.object_)
    else:
        array = flat.astype(NUMPY_DTYPES[spec.datatype])
    if any(d < 0 for d in shape):
        variable = [i for i, d in enumerate(shape) if d < 0]
        if len(variable) != 1:
            raise InputError(f"input '{spec.name}': give a 'shape' in the data file for dims {shape}")
        fixed = int(np.prod([d for d in shape if d >= 0])) if len(shape) > 1 else 1
        shape = list(shape)
        shape[variable[0]] = array.size // max(fixed, 1)
    try:
        return array.reshape(shape)
    except ValueError:
        raise InputError(f"input '{spec.name}': {array.size} values do not fit shape {shape}") from None


def load_json_samples(path: Path, model: ModelInfo, shapes: dict[str, list[int]]) -> list[dict[str, np.ndarray]]:
    """perf_analyzer's data file: {"data": [{NAME: [..] | {"content": [..], "shape": [..]} | {"b64": ".."}}, ...]}."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read input data file {path}: {exc}") from None
    steps = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(steps, list) or not steps:
        raise InputError(f"{path}: expected an object with a non-empty 'data' list")
    batched = model.max_batch_size > 0
    samples = []
    for index, step in enumerate(steps):
        if isinstance(step, list):  # sequence form: take its steps in order
            raise InputError(f"{path}: entry {index} is a sequence; sequences are not supported by naiad perf")
        sample = {}
        for spec in model.inputs:
            if spec.name not in step:
                raise InputError(f"{path}: entry {index} has no value for input '{spec.name}'")
            dims = spec.shape[1:] if batched else list(spec.shape)
            dims = shapes.get(spec.name, dims)
            sample[spec.name] = _from_json_value(spec, step[spec.name], dims)
        samples.append(sample)
    return samples


def build_input_sets(model: ModelInfo, batch_size: int, data: str, shapes: dict[str, list[int]],
                     string_length: int = 128, string_data: str | None = None, seed: int = 0) -> list[InputSet]:
    """Every distinct request the run cycles through (a JSON file gives one per entry)."""
    batched = model.max_batch_size > 0
    if not batched and batch_size != 1:
        raise InputError(f"model '{model.name}' does not support batching (max_batch_size 0): use -b 1")
    if batched and batch_size > model.max_batch_size:
        raise InputError(f"batch size {batch_size} exceeds the model's max_batch_size {model.max_batch_size}")
    if data in ("zero", "random"):
        rng = np.random.default_rng(seed)
        samples = [{spec.name: synthetic_sample(spec, tensor_dims(spec, batched, shapes), data, rng,
                                                string_length, string_data)
                    for spec in model.inputs}]
    else:
        samples = load_json_samples(Path(data), model, shapes)
    sets = []
    for sample in samples:
        tensors = []
        for spec in model.inputs:
            array = sample[spec.name]
            if batched:
                array = np.repeat(array[np.newaxis, ...], batch_size, axis=0)
            tensors.append(Tensor(spec.name, spec.datatype, array))
        sets.append(tensors)
    return sets


def tensor_bytes(tensor: Tensor) -> bytes:
    """The binary-extension / raw_input_contents encoding (BYTES: 4-byte little-endian length + bytes)."""
    if tensor.datatype == "BYTES":
        parts = []
        for item in tensor.array.ravel().tolist():
            raw = item if isinstance(item, bytes) else str(item).encode()
            parts.append(len(raw).to_bytes(4, "little") + raw)
        return b"".join(parts)
    return np.ascontiguousarray(tensor.array, dtype=WIRE_DTYPES[tensor.datatype]).tobytes()


def output_byte_size(spec: TensorSpec, batched: bool, batch_size: int, default: int) -> int:
    """Bytes an output needs in shared memory: exact for fixed shapes, `default` otherwise."""
    dims = spec.shape[1:] if batched else list(spec.shape)
    if spec.datatype == "BYTES" or any(d < 0 for d in dims):
        return default
    count = int(np.prod(dims)) if dims else 1
    return count * (batch_size if batched else 1) * WIRE_DTYPES[spec.datatype].itemsize
