"""Starts worker processes: the interpreter (ours or an EXECUTION_ENV_PATH environment's), its environment, its pipes."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

import naiad.runtime.process as _package
import triton_python_backend_utils as _pb_utils
from naiad.config.model_config import ConfigError, parameter

MODEL_DIRECTORY_VARIABLE = "$$TRITON_MODEL_DIRECTORY"

# Runs in the worker's interpreter: makes `naiad.runtime.process` and `triton_python_backend_utils`
# importable without importing the server (`naiad/__init__`), nor adding our site-packages to sys.path.
BOOTSTRAP = (
    "import sys, types, importlib.util as u\n"
    "a = sys.argv\n"
    "if sys.path and sys.path[0] in ('', '.'):\n"
    "    del sys.path[0]\n"
    "p = types.ModuleType('naiad'); p.__path__ = [a[1]]; sys.modules['naiad'] = p\n"
    "s = u.spec_from_file_location('triton_python_backend_utils', a[2] + '/__init__.py', submodule_search_locations=[a[2]])\n"
    "m = u.module_from_spec(s); sys.modules[s.name] = m; s.loader.exec_module(m)\n"
    "from naiad.runtime.process.worker import main\n"
    "main(a[3:])\n"
)


class ExecutionEnvError(Exception):
    """EXECUTION_ENV_PATH points at something that cannot run a worker."""


@dataclass
class Launch:
    """How to start this model's workers."""

    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)


def package_directories() -> tuple[str, str]:
    """(directory of the `naiad` package, directory of `triton_python_backend_utils`)."""
    naiad_dir = str(Path(_package.__file__).resolve().parents[2])
    pb_dir = str(Path(_pb_utils.__file__).resolve().parent)
    return naiad_dir, pb_dir


def _interpreter(env_dir: Path) -> Path:
    for candidate in ("bin/python3", "bin/python", "python.exe", "Scripts/python.exe"):
        path = env_dir / candidate
        if path.exists():
            return path
    raise ExecutionEnvError(f"EXECUTION_ENV_PATH '{env_dir}' has no Python interpreter (looked for bin/python3, bin/python)")


def _unpack(archive: Path) -> Path:
    """Unpack a conda-pack tarball once into a cache directory keyed by its path, size and mtime."""
    stat = archive.stat()
    key = hashlib.sha1(f"{archive.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cache = Path(tempfile.gettempdir()) / "naiad-python-envs"
    target = cache / key
    if target.is_dir():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=cache))
    try:
        with tarfile.open(archive) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(staging, filter="tar")
            else:  # pragma: no cover - Python without extraction filters
                tar.extractall(staging)
        try:
            os.rename(staging, target)
        except OSError:  # another instance unpacked it first
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def resolve_launch(execution_env_path: str | None, model_dir: Path) -> Launch:
    """The interpreter and environment variables for a model's workers."""
    env = dict(os.environ)
    env.pop("PYTHONHOME", None)
    if not execution_env_path:
        return Launch(sys.executable, env)
    raw = execution_env_path.replace(MODEL_DIRECTORY_VARIABLE, str(model_dir))
    path = Path(raw)
    if not path.is_absolute():
        path = model_dir / path
    if not path.exists():
        raise ExecutionEnvError(f"EXECUTION_ENV_PATH '{raw}' does not exist")
    env_dir = _unpack(path) if path.is_file() else path
    python = _interpreter(env_dir)
    bin_dir = str(python.parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    lib_dir = env_dir / "lib"
    if lib_dir.is_dir():
        env["LD_LIBRARY_PATH"] = str(lib_dir) + (os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    if (env_dir / "pyvenv.cfg").exists():
        env["VIRTUAL_ENV"] = str(env_dir)
    else:
        env["CONDA_PREFIX"] = str(env_dir)
    env.pop("PYTHONPATH", None)  # the server's import path must not leak into another environment
    return Launch(str(python), env)


def launch_for(config: mc.ModelConfig, model_dir: Path) -> Launch:
    """The launch of a model's workers: its EXECUTION_ENV_PATH parameter, else this interpreter."""
    try:
        return resolve_launch(parameter(config, "EXECUTION_ENV_PATH"), model_dir)
    except (ExecutionEnvError, OSError) as exc:
        raise ConfigError(f"unable to prepare the Python environment of model '{config.name}': {exc}") from None


def spawn(launch: Launch) -> tuple[subprocess.Popen[bytes], int, int]:
    """Start one worker (own session: terminal signals go to the server only); returns it, the descriptor we
    read its messages from and the one we write ours to (one pipe each way, see framing.BlockingChannel)."""
    to_worker = os.pipe()
    from_worker = os.pipe()
    theirs = (to_worker[0], from_worker[1])
    ours = (from_worker[0], to_worker[1])
    naiad_dir, pb_dir = package_directories()
    try:
        process = subprocess.Popen(
            [launch.python, "-c", BOOTSTRAP, naiad_dir, pb_dir, *map(str, theirs)],
            pass_fds=theirs,
            env=launch.env,
            start_new_session=True,
        )
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    return process, ours[0], ours[1]
