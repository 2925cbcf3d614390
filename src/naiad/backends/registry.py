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
        loaded = self._backends.get(name)
        if loaded is not None and name not in _YIELDS_TO_BACKEND_DIRECTORY:
            return loaded
        found = self._find(name, backend_directory)
        if isinstance(found, Path):
            return self._python_based_backend(name, found)
        if loaded is not None:
            return loaded
        try:
            backend = _load(found)
        except ImportError as exc:
            raise BackendUnavailable(
                f"backend '{name}' needs a package that is not installed ({exc}); install the matching extra, "
                f"e.g. pip install 'naiad[{name}]'"
            ) from None
        self._backends[name] = backend
        return backend

    def runs_python_models(self, name: str, backend_directory: str | None = None) -> bool:
        """Whether `name` is the Python backend or a Python-based one, told without importing any framework."""
        try:
            found = self._find(name, backend_directory)
        except BackendUnavailable:
            return False
        return isinstance(found, Path) or found == _BUILTIN["python"]

    def _find(self, name: str, backend_directory: str | None) -> str | Path:
        """Where the backend is: its "module:class" (not imported yet), or the shared model.py of a Python-based one."""
        if name in _YIELDS_TO_BACKEND_DIRECTORY:
            shared = python_based_model_file(name, backend_directory)
            if shared is not None:
                return shared
        target = _BUILTIN.get(name)
        if target is None:
            for ep in entry_points(group="naiad.backends"):
                if ep.name == name:
                    return str(ep.value)
            shared = python_based_model_file(name, backend_directory)
            if shared is not None:
                return shared
            where = f" and there is no '{Path(backend_directory) / name / 'model.py'}'" if backend_directory else ""
            raise BackendUnavailable(
                f"unable to find backend '{name}': no built-in or installed backend has this name{where}{instead(name)}"
            )
        return target

    def _python_based_backend(self, name: str, model_file: Path) -> Backend:
        key = (name, model_file)
        backend = self._python_based.get(key)
        if backend is None:
            from naiad.backends.python.backend import PythonBackend

            backend = PythonBackend(name=name, shared_model_file=model_file)
            self._python_based[key] = backend
        return backend
