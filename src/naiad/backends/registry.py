"""Finds backends by name: built-in modules, the `naiad.backends` entry-point group, then Python-based backends.

A Python-based backend is `<backend-directory>/<name>/model.py`: every model with `backend: "<name>"`
runs that shared model.py through the Python backend (this is how Triton's vLLM backend works).
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from pathlib import Path

from naiad.backends.base import Backend
from naiad.backends.gpu_only import instead

_BUILTIN = {
    "onnxruntime": "naiad.backends.onnxruntime_backend:OnnxRuntimeBackend",
    "python": "naiad.backends.python.backend:PythonBackend",
    "pytorch": "naiad.backends.pytorch_backend:PyTorchBackend",
    "fil": "naiad.backends.fil_backend:FilBackend",
    "openvino": "naiad.backends.openvino_backend:OpenVinoBackend",
    "tensorflow": "naiad.backends.tensorflow_backend:TensorFlowBackend",
    "transformers": "naiad.backends.transformers_backend.backend:TransformersBackend",
    "vllm": "naiad.backends.vllm_backend:VllmBackend",
}

# Built-ins that a `<backend-directory>/<name>/model.py` replaces: Triton's own vLLM backend is such a
# model.py, and a repository set up for it keeps running it.
_YIELDS_TO_BACKEND_DIRECTORY = {"vllm"}


class BackendUnavailable(Exception):
    """The backend is unknown, or its framework package is not installed."""


def python_based_model_file(name: str, backend_directory: str | None) -> Path | None:
    """`<backend_directory>/<name>/model.py` when it exists (name must be one plain path component)."""
    if not backend_directory or not name or name in (".", "..") or "/" in name or "\\" in name:
        return None
    model_file = Path(backend_directory) / name / "model.py"
    return model_file.resolve() if model_file.is_file() else None


def _load(target: str) -> Backend:
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr)()


class BackendRegistry:
    """Backend instances by name, created on first use (so missing frameworks cost nothing)."""

    def __init__(self) -> None:
        self._backends: dict[str, Backend] = {}
        self._python_based: dict[tuple[str, Path], Backend] = {}

    def get(self, name: str, backend_directory: str | None = None) -> Backend:
        """The backend called `name`; an unknown name may be a Python-based backend in `backend_directory`."""
        if name in _YIELDS_TO_BACKEND_DIRECTORY:
            shared = python_based_model_file(name, backend_directory)
            if shared is not None:
                return self._python_based_backend(name, shared)
        if name in self._backends:
            return self._backends[name]
        target = _BUILTIN.get(name)
        if target is None:
            for ep in entry_points(group="naiad.backends"):
                if ep.name == name:
                    target = ep.value
                    break
        if target is None:
            shared = python_based_model_file(name, backend_directory)
            if shared is not None:
                return self._python_based_backend(name, shared)
            where = f" and there is no '{Path(backend_directory) / name / 'model.py'}'" if backend_directory else ""
            raise BackendUnavailable(
                f"unable to find backend '{name}': no built-in or installed backend has this name{where}{instead(name)}"
            )
        try:
            backend = _load(target)
        except ImportError as exc:
            raise BackendUnavailable(
                f"backend '{name}' needs a package that is not installed ({exc}); install the matching extra, "
                f"e.g. pip install 'naiad[{name}]'"
            ) from None
        self._backends[name] = backend
        return backend

    def _python_based_backend(self, name: str, model_file: Path) -> Backend:
        key = (name, model_file)
        backend = self._python_based.get(key)
        if backend is None:
            from naiad.backends.python.backend import PythonBackend

            backend = PythonBackend(name=name, shared_model_file=model_file)
            self._python_based[key] = backend
        return backend
