"""Request data for perf: zero / random / JSON-file inputs shaped from model metadata, with the batch dim."""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from naiad.protocol.datatypes import WIRE_DTYPES
from naiad.tools.perf.data_files import DataFileError, Stream, load_directory, load_json_streams
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


@dataclass
class InputData:
    """Every distinct request the run sends (`sets`) and the data streams, as indexes into `sets`."""

    sets: list[InputSet]
    streams: list[list[int]]


def _user_streams(model: ModelInfo, sources: list[str], shapes: dict[str, list[int]]) -> list[Stream]:
    streams: list[Stream] = []
    for source in sources:
        path = Path(source)
        try:
            streams += load_directory(path, model, shapes) if path.is_dir() else load_json_streams(path, model, shapes)
        except DataFileError as exc:
            raise InputError(str(exc)) from None
    return streams


def build_input_data(model: ModelInfo, batch_size: int, data: str | list[str], shapes: dict[str, list[int]],
                     string_length: int = 128, string_data: str | None = None, seed: int = 0) -> InputData:
    """zero / random: one request; JSON files and directories: one per entry, grouped in their streams."""
    batched = model.max_batch_size > 0
    if not batched and batch_size != 1:
        raise InputError(f"model '{model.name}' does not support batching (max_batch_size 0): use -b 1")
    if batched and batch_size > model.max_batch_size:
        raise InputError(f"batch size {batch_size} exceeds the model's max_batch_size {model.max_batch_size}")
    sources = [data] if isinstance(data, str) else list(data)
    if sources in (["zero"], ["random"]):
        rng = np.random.default_rng(seed)
        streams = [[{spec.name: synthetic_sample(spec, tensor_dims(spec, batched, shapes), sources[0], rng,
                                                 string_length, string_data)
                     for spec in model.inputs}]]
    else:
        streams = _user_streams(model, sources, shapes)
    sets: list[InputSet] = []
    indexes = []
    for stream in streams:
        indexes.append([])
        for sample in stream:
            tensors = []
            for spec in model.inputs:
                array = sample[spec.name]
                if batched:
                    array = np.repeat(array[np.newaxis, ...], batch_size, axis=0)
                tensors.append(Tensor(spec.name, spec.datatype, array))
            indexes[-1].append(len(sets))
            sets.append(tensors)
    return InputData(sets, indexes)


def build_input_sets(model: ModelInfo, batch_size: int, data: str | list[str], shapes: dict[str, list[int]],
                     string_length: int = 128, string_data: str | None = None, seed: int = 0) -> list[InputSet]:
    """Every distinct request the run cycles through (a JSON file gives one per entry)."""
    return build_input_data(model, batch_size, data, shapes, string_length, string_data, seed).sets


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
