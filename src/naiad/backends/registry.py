"""Finds backends by name: built-in modules first, then the `naiad.backends` entry-point group."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from naiad.backends.base import Backend

_BUILTIN = {
    "onnxruntime": "naiad.backends.onnxruntime_backend:OnnxRuntimeBackend",
    "python": "naiad.backends.python.backend:PythonBackend",
    "pytorch": "naiad.backends.pytorch_backend:PyTorchBackend",
    "fil": "naiad.backends.fil_backend:FilBackend",
    "openvino": "naiad.backends.openvino_backend:OpenVinoBackend",
    "tensorflow": "naiad.backends.tensorflow_backend:TensorFlowBackend",
    "transformers": "naiad.backends.transformers_backend.backend:TransformersBackend",
}


class BackendUnavailable(Exception):
    """The backend is unknown, or its framework package is not installed."""


def _load(target: str) -> Backend:
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr)()


class BackendRegistry:
    """Backend instances by name, created on first use (so missing frameworks cost nothing)."""

    def __init__(self) -> None:
        self._backends: dict[str, Backend] = {}

    def get(self, name: str) -> Backend:
        if name in self._backends:
            return self._backends[name]
        target = _BUILTIN.get(name)
        if target is None:
            for ep in entry_points(group="naiad.backends"):
                if ep.name == name:
                    target = ep.value
                    break
        if target is None:
            raise BackendUnavailable(f"unable to find backend '{name}': no built-in or installed backend has this name")
        try:
            backend = _load(target)
        except ImportError as exc:
            raise BackendUnavailable(
                f"backend '{name}' needs a package that is not installed ({exc}); install the matching extra, "
                f"e.g. pip install 'naiad[{name}]'"
            ) from None
        self._backends[name] = backend
        return backend
