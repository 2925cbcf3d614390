"""perf_analyzer's user data: JSON files (entries, or streams for sequence models) and directories of raw files."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from naiad.protocol.datatypes import NUMPY_DTYPES, WIRE_DTYPES
from naiad.tools.v2client import ModelInfo, TensorSpec

Sample = dict[str, np.ndarray]  # one request's inputs, per sample (no batch dim)
Stream = list[Sample]  # the steps of one sequence, or a run of plain entries


class DataFileError(ValueError):
    """The data file cannot be used (message names the file, entry and input)."""


def _strings_from_raw(raw: bytes, where: str) -> list[bytes]:
    """BYTES elements in the wire form: 4-byte little-endian length, then the bytes."""
    items, offset = [], 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise DataFileError(f"{where}: truncated string length prefix")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise DataFileError(f"{where}: string of {length} bytes runs past the data")
        items.append(raw[offset:offset + length])
        offset += length
    return items


def _fit(spec: TensorSpec, array: np.ndarray, shape: list[int], where: str) -> np.ndarray:
    if any(d < 0 for d in shape):
        variable = [i for i, d in enumerate(shape) if d < 0]
        if len(variable) != 1:
            raise DataFileError(f"{where}: give a 'shape' for dims {shape} (or --shape {spec.name}:...)")
        fixed = int(np.prod([d for d in shape if d >= 0])) if len(shape) > 1 else 1
        shape = list(shape)
        shape[variable[0]] = array.size // max(fixed, 1)
    try:
        return array.reshape(shape)
    except ValueError:
        raise DataFileError(f"{where}: {array.size} values do not fit shape {shape}") from None


def tensor_from_json(spec: TensorSpec, value: Any, dims: list[int], where: str) -> np.ndarray:
    """One input of one entry: a flat list, {"content": ..., "shape": [...]}, or {"b64": "..."} (also as content)."""
    shape = list(dims)
    if isinstance(value, dict):
        if "shape" in value:
            shape = [int(d) for d in value["shape"]]
        if "content" in value:
            value = value["content"]
    if isinstance(value, dict) and "b64" in value:
        raw = base64.b64decode(value["b64"])
        if spec.datatype == "BYTES":
            array = np.array(_strings_from_raw(raw, where), dtype=np.object_)
        else:
            array = np.frombuffer(raw, dtype=WIRE_DTYPES[spec.datatype]).astype(NUMPY_DTYPES[spec.datatype])
        return _fit(spec, array, shape, where)
    if isinstance(value, dict):
        raise DataFileError(f"{where}: expected a list, 'content' or 'b64'")
    flat = np.asarray(value, dtype=np.object_ if spec.datatype == "BYTES" else None).ravel()
    if spec.datatype == "BYTES":
        array = np.array([v.encode() if isinstance(v, str) else bytes(v) for v in flat.tolist()], dtype=np.object_)
    else:
        array = flat.astype(NUMPY_DTYPES[spec.datatype])
    return _fit(spec, array, shape, where)


def _sample(step: Any, model: ModelInfo, shapes: dict[str, list[int]], where: str) -> Sample:
    if not isinstance(step, dict):
        raise DataFileError(f"{where}: expected an object mapping input names to data")
    batched = model.max_batch_size > 0
    sample = {}
    for spec in model.inputs:
        if spec.name not in step:
            raise DataFileError(f"{where} has no value for input '{spec.name}'")
        dims = shapes.get(spec.name, spec.shape[1:] if batched else list(spec.shape))
        sample[spec.name] = tensor_from_json(spec, step[spec.name], dims, f"{where}, input '{spec.name}'")
    return sample


def load_json_streams(path: Path, model: ModelInfo, shapes: dict[str, list[int]]) -> list[Stream]:
    """{"data": [entry, ...]} is one stream of entries; {"data": [[entry, ...], [...]]} is one stream per list."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DataFileError(f"cannot read input data file {path}: {exc}") from None
    entries = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise DataFileError(f"{path}: expected an object with a non-empty 'data' list")
    if all(isinstance(e, list) for e in entries):
        streams = []
        for index, stream in enumerate(entries):
            if not stream:
                raise DataFileError(f"{path}: stream {index} is empty")
            streams.append([_sample(step, model, shapes, f"{path}: stream {index} step {n}")
                            for n, step in enumerate(stream)])
        return streams
    if any(isinstance(e, list) for e in entries):
        raise DataFileError(f"{path}: 'data' mixes streams (lists) and plain entries")
    return [[_sample(step, model, shapes, f"{path}: entry {index}") for index, step in enumerate(entries)]]


def load_directory(path: Path, model: ModelInfo, shapes: dict[str, list[int]]) -> list[Stream]:
    """One file per input named like the input: raw little-endian values, or one string per line for BYTES."""
    batched = model.max_batch_size > 0
    sample = {}
    for spec in model.inputs:
        file = Path(path) / spec.name
        if not file.is_file():
            raise DataFileError(f"{path}: no file '{spec.name}' for input '{spec.name}'")
        dims = shapes.get(spec.name, spec.shape[1:] if batched else list(spec.shape))
        if spec.datatype == "BYTES":
            lines = file.read_text().splitlines()
            array = np.array([line.encode() for line in lines], dtype=np.object_)
        else:
            array = np.frombuffer(file.read_bytes(), dtype=WIRE_DTYPES[spec.datatype]).astype(NUMPY_DTYPES[spec.datatype])
        sample[spec.name] = _fit(spec, array, dims, f"{file}")
    return [[sample]]
