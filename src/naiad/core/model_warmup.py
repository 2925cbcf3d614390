"""model_warmup: run the config's warm-up samples on every instance before a model is READY."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.config.model_config import ConfigError, datatype_name
from naiad.core.model_version import ModelVersion
from naiad.protocol.datatypes import WIRE_DTYPES, numpy_dtype
from naiad.protocol.errors import NaiadError
from naiad.protocol.tensor_codec import deserialize_bytes, element_count
from naiad.scheduling.base import WorkItem


def _sample_input(spec: mc.ModelWarmup.Input, model_dir: Path, seed: int) -> np.ndarray:
    datatype = datatype_name(spec.data_type)
    dims = tuple(int(d) for d in spec.dims)
    source = spec.WhichOneof("input_data_type")
    if source == "input_data_file":
        raw = (model_dir / "warmup" / spec.input_data_file).read_bytes()
        if datatype == "BYTES":
            return deserialize_bytes(raw, dims, spec.input_data_file)
        expected = element_count(dims) * WIRE_DTYPES[datatype].itemsize
        if len(raw) < expected:
            raise ValueError(f"warmup file '{spec.input_data_file}' holds {len(raw)} bytes, {expected} are needed")
        return np.frombuffer(raw[:expected], dtype=WIRE_DTYPES[datatype]).astype(numpy_dtype(datatype)).reshape(dims)
    if datatype == "BYTES":
        array = np.empty(element_count(dims), dtype=object)
        array[:] = [b"" if source != "random_data" else bytes(np.random.default_rng(seed + i).integers(97, 123, 4).astype(np.uint8)) for i in range(array.size)]
        return array.reshape(dims)
    dtype = numpy_dtype(datatype)
    if source == "random_data":
        rng = np.random.default_rng(seed)
        if dtype.kind == "f":
            return rng.random(dims).astype(dtype)
        if dtype.kind == "b":
            return rng.integers(0, 2, dims).astype(dtype)
        return rng.integers(0, 8, dims).astype(dtype)
    return np.zeros(dims, dtype=dtype)


async def warm_up(model: ModelVersion, model_dir: Path) -> None:
    """Run every sample max(1, count) times per instance; a failing sample fails the load."""
    instances = max(len(model.pool.instances), 1)
    for index, sample in enumerate(model.config.model_warmup):
        batch = max(sample.batch_size, 1)
        try:
            inputs = {}
            for name, spec in sample.inputs.items():
                array = _sample_input(spec, model_dir, seed=index)
                if model.max_batch_size > 0:
                    array = np.repeat(array[np.newaxis, ...], batch, axis=0)
                inputs[name] = array
            for _ in range(max(sample.count, 1) * instances):
                item = WorkItem(dict(inputs), list(model.outputs), batch if model.max_batch_size > 0 else 1)
                await model.scheduler.enqueue(item)
        except (NaiadError, OSError, ValueError) as exc:
            message = exc.message if isinstance(exc, NaiadError) else str(exc)
            raise ConfigError(f"model '{model.name}' warmup sample '{sample.name or index}' failed: {message}") from None
