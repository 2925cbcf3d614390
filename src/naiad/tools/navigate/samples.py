"""Sample inputs for the navigator: from an .npz file (arrays keyed by input name) or generated from the graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from naiad.protocol.datatypes import NUMPY_DTYPES
from naiad.tools.navigate.runtimes import IoSpec

Sample = dict[str, np.ndarray]


def is_batchable(inputs: list[IoSpec], outputs: list[IoSpec]) -> bool:
    """True when every input and output starts with a dynamic dimension (the batch)."""
    return all(spec.shape and spec.shape[0] is None for spec in inputs + outputs)


def load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def batched_samples(arrays: dict[str, np.ndarray], batch_sizes: list[int]) -> dict[int, Sample]:
    """One sample per batch size: the first b rows of each array, repeated when the file has fewer."""
    samples = {}
    for b in batch_sizes:
        sample = {}
        for name, array in arrays.items():
            if array.ndim == 0:
                raise ValueError(f"sample '{name}' has no batch dimension")
            reps = -(-b // array.shape[0])
            sample[name] = np.ascontiguousarray(np.concatenate([array] * reps, axis=0)[:b])
        samples[b] = sample
    return samples


def random_samples(inputs: list[IoSpec], batch_sizes: list[int], batchable: bool, seed: int = 0) -> dict[int, Sample]:
    rng = np.random.default_rng(seed)
    samples: dict[int, Sample] = {}
    for b in (batch_sizes if batchable else [1]):
        sample = {}
        for spec in inputs:
            dims = spec.shape[1:] if batchable else spec.shape
            if any(d is None for d in dims):
                raise ValueError(f"input '{spec.name}' has dynamic dims {spec.shape}: pass --sample-inputs FILE.npz")
            shape = ([b] if batchable else []) + [int(d) for d in dims]  # type: ignore[arg-type]
            dtype = NUMPY_DTYPES[spec.datatype]
            if spec.datatype == "BYTES":
                raise ValueError(f"input '{spec.name}' is a string tensor: pass --sample-inputs FILE.npz")
            if dtype.kind == "f":
                sample[spec.name] = rng.standard_normal(shape).astype(dtype)
            elif dtype.kind == "b":
                sample[spec.name] = rng.integers(0, 2, size=shape).astype(dtype)
            else:
                sample[spec.name] = rng.integers(0, 10, size=shape).astype(dtype)
        samples[b] = sample
    return samples
