"""A PyTorch module as the navigator's source (only imported when torch is installed): eager reference,
TorchScript trace and ONNX export variants."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np

from naiad.protocol.datatypes import NUMPY_DTYPES
from naiad.tools.navigate.runtimes import IoSpec, TorchScriptRunner
from naiad.tools.navigate.triton_config import ModelSignature

_PROTOCOL_OF = {dt: name for name, dt in NUMPY_DTYPES.items() if name not in ("BF16", "BYTES")}


def _datatype(array: np.ndarray) -> str:
    if array.dtype not in _PROTOCOL_OF:
        raise ValueError(f"sample dtype {array.dtype} has no v2 datatype")
    return _PROTOCOL_OF[array.dtype]


def _load_module(torch: Any, spec: str) -> Any:
    """`package.module:name`, where name is a torch.nn.Module or a function returning one."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"--torch-module expects package.module:factory, got '{spec}'")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except ImportError as exc:
        raise ValueError(f"--torch-module {spec}: cannot import '{module_name}' ({exc}); is its directory on "
                         "PYTHONPATH?") from None
    except AttributeError:
        raise ValueError(f"--torch-module {spec}: module '{module_name}' has no attribute '{attr}'") from None
    except Exception as exc:
        raise ValueError(f"--torch-module {spec}: importing '{module_name}' failed: {type(exc).__name__}: {exc}") from None
    if isinstance(target, torch.nn.Module):
        return target
    if not callable(target):
        raise ValueError(f"--torch-module {spec}: '{attr}' is neither a torch.nn.Module nor a function returning one")
    try:
        module = target()
    except Exception as exc:
        raise ValueError(f"--torch-module {spec}: calling {attr}() failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(module, torch.nn.Module):
        raise ValueError(f"--torch-module {spec}: {attr}() returned {type(module).__name__}, not a torch.nn.Module")
    return module


class TorchSource:
    def __init__(self, spec: str, arrays: dict[str, np.ndarray]) -> None:
        import torch

        self.torch = torch
        self.module = _load_module(torch, spec).eval()
        self.arrays = arrays  # forward() argument order = the order of the arrays in the .npz file
        self.input_names = list(arrays)
        first = {k: v[:1] for k, v in arrays.items()}
        try:
            outputs = self._eager(first)
        except Exception as exc:
            raise ValueError(f"--torch-module {spec}: forward() fails on the sample inputs "
                             f"{[(k, list(v.shape)) for k, v in first.items()]}: {type(exc).__name__}: {exc}") from None
        self.output_names = [f"OUTPUT__{i}" for i in range(len(outputs))]

    def _eager(self, sample: dict[str, np.ndarray]) -> list[np.ndarray]:
        torch = self.torch
        with torch.inference_mode():
            result = self.module(*[torch.from_numpy(np.ascontiguousarray(sample[n])) for n in self.input_names])
        outputs = result if isinstance(result, (tuple, list)) else [result]
        return [o.detach().cpu().numpy() for o in outputs]

    def run(self, sample: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.output_names, self._eager(sample)))

    def signature(self) -> ModelSignature:
        first = {k: v[:1] for k, v in self.arrays.items()}
        outputs = self._eager(first)
        inputs = [IoSpec(n, _datatype(a), [None, *a.shape[1:]]) for n, a in self.arrays.items()]
        outs = [IoSpec(n, _datatype(a), [None, *a.shape[1:]]) for n, a in zip(self.output_names, outputs)]
        return ModelSignature(inputs, outs, batchable=True)

    def _tensors(self, sample: dict[str, np.ndarray]) -> tuple[Any, ...]:
        return tuple(self.torch.from_numpy(np.ascontiguousarray(sample[n])) for n in self.input_names)

    def torchscript_variant(self, workspace: Path, sample: dict[str, np.ndarray], variant_type: type) -> Any:
        path = workspace / "torchscript-trace" / "model.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self.torch.inference_mode():
                traced = self.torch.jit.trace(self.module, self._tensors(sample))
            traced.save(str(path))
        except Exception as exc:
            return variant_type("torchscript-trace", "torchscript", path, lambda: None, None, "error", str(exc))
        names, outs = self.input_names, self.output_names
        return variant_type("torchscript-trace", "torchscript", path, lambda: TorchScriptRunner(path, names, outs))

    def export_onnx(self, path: Path, sample: dict[str, np.ndarray]) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        axes = {n: {0: "batch"} for n in self.input_names + self.output_names}
        self.torch.onnx.export(self.module, self._tensors(sample), str(path), input_names=self.input_names,
                               output_names=self.output_names, dynamic_axes=axes, opset_version=17)
        return path
