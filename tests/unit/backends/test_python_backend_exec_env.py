"""EXECUTION_ENV_PATH: a model's workers run with another environment's interpreter (directory or tarball)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from naiad import Server
from naiad.runtime.process.launcher import (
    MODEL_DIRECTORY_VARIABLE,
    ExecutionEnvError,
    resolve_launch,
)
from tests.integration.test_python_backend_support import write_model

ENV_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] } ]
parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "%s" } }
"""

ENV_PY = """
import json
import sys
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        info = json.dumps({"prefix": sys.prefix, "executable": sys.executable}).encode()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("INFO", np.array([info], dtype=np.object_))]) for _ in requests]
"""


def _make_venv(target: Path) -> Path:
    """A bare venv (no pip) that sees this test environment's numpy through a .pth file."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(target)], check=True)
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    site = target / "lib" / version / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    (site / "server_numpy.pth").write_text(str(Path(np.__file__).resolve().parent.parent) + "\n")
    return target


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("envrepo")
    dir_model = write_model(root, "in_dir_env", ENV_CONFIG % f"{MODEL_DIRECTORY_VARIABLE}/env", ENV_PY)
    _make_venv(dir_model / "env")
    tar_model = write_model(root, "in_tar_env", ENV_CONFIG % f"{MODEL_DIRECTORY_VARIABLE}/env.tar.gz", ENV_PY)
    staging = _make_venv(root.parent / f"{root.name}-staging-env")
    with tarfile.open(tar_model / "env.tar.gz", "w:gz") as tar:
        for child in staging.iterdir():
            tar.add(child, arcname=child.name)
    return root


def _info(server: Server, model: str) -> dict:
    out = server.infer(model, {"INPUT0": np.zeros(1, np.float32)})
    return json.loads(out["INFO"][0])


def test_env_directory_with_model_directory_variable(repo):
    with Server(model_repository=str(repo)) as server:
        info = _info(server, "in_dir_env")
    assert Path(info["prefix"]) == repo / "in_dir_env" / "env"
    assert info["executable"].startswith(str(repo / "in_dir_env" / "env"))
    assert Path(info["prefix"]) != Path(sys.prefix)


def test_env_tarball_is_unpacked_and_used(repo):
    with Server(model_repository=str(repo)) as server:
        info = _info(server, "in_tar_env")
    unpacked = Path(info["prefix"])
    assert "naiad-python-envs" in info["prefix"]
    assert (unpacked / "pyvenv.cfg").exists()
    shutil.rmtree(unpacked, ignore_errors=True)


def test_missing_environment_fails_the_load(tmp_path):
    write_model(tmp_path, "no_env", ENV_CONFIG % "/nonexistent/env", ENV_PY)
    with Server(model_repository=str(tmp_path)) as server:
        entry = server.repository_index()[0]
    assert entry["state"] == "UNAVAILABLE"
    assert "EXECUTION_ENV_PATH '/nonexistent/env' does not exist" in entry["reason"]


def test_resolve_launch_defaults_to_this_interpreter(tmp_path):
    launch = resolve_launch(None, tmp_path)
    assert launch.python == sys.executable
    with pytest.raises(ExecutionEnvError):
        resolve_launch(str(tmp_path), tmp_path)  # a directory without bin/python


def test_custom_stub_in_model_directory_is_not_needed(repo):
    """Triton's per-model `triton_python_backend_stub` (a binary built for the env's Python) is ignored:
    the worker is plain Python and runs under the EXECUTION_ENV_PATH interpreter, whatever its version."""
    model_dir = repo / "in_dir_env"
    marker = model_dir / "stub-ran"
    stub = model_dir / "triton_python_backend_stub"
    stub.write_text(f"#!/bin/sh\ntouch '{marker}'\nexit 1\n")
    stub.chmod(0o755)
    try:
        with Server(model_repository=str(repo)) as server:
            info = _info(server, "in_dir_env")
        assert info["executable"].startswith(str(model_dir / "env"))
        assert not marker.exists()
    finally:
        stub.unlink()
