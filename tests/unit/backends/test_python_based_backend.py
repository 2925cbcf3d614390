"""Python-based backends: `<backend-directory>/<name>/model.py` serves every model with `backend: "<name>"`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from naiad import Server
from naiad.backends.python.backend import PythonBackend
from naiad.backends.registry import BackendRegistry, BackendUnavailable
from naiad.protocol.types import InferenceRequest, InferInput
from tests.support.servers import start_server

# The shared model.py: completes the config itself and reads the factor from the model's own
# <model_repository>/<version>/model.json, so one file serves models with different data.
SCALE_PY = """
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]})
        auto_complete_model_config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]})
        auto_complete_model_config.add_output({"name": "INFO", "data_type": "TYPE_STRING", "dims": [1]})
        auto_complete_model_config.set_max_batch_size(0)
        return auto_complete_model_config

    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "model.json")
        with open(path) as f:
            self.factor = float(json.load(f)["factor"])
        self.info = json.dumps({"model_repository": args["model_repository"], "model_version": args["model_version"],
                                "model_name": args["model_name"], "file": os.path.abspath(__file__)})

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (x * self.factor).astype(np.float32)),
                pb_utils.Tensor("INFO", np.array([self.info.encode()], dtype=np.object_)),
            ]))
        return responses
"""


def write_backend(backend_dir: Path, name: str = "scale") -> Path:
    (backend_dir / name).mkdir(parents=True)
    model_file = backend_dir / name / "model.py"
    model_file.write_text(SCALE_PY)
    return model_file


def write_scaled_model(repo: Path, name: str, factor: float, config: str = 'backend: "scale"\n') -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.json").write_text(json.dumps({"factor": factor}))


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    root = tmp_path_factory.mktemp("pybased")
    backend_dir, repo = root / "backends", root / "models"
    write_backend(backend_dir)
    write_scaled_model(repo, "double", 2)
    # default_model_filename names a data file; the version directory has no model.py.
    write_scaled_model(repo, "triple", 3, 'backend: "scale"\ndefault_model_filename: "model.json"\n')
    (repo / "missing" / "1").mkdir(parents=True)
    (repo / "missing" / "config.pbtxt").write_text('backend: "nonexistent"\n')
    return backend_dir, repo


@pytest.fixture(scope="module")
def server(layout):
    backend_dir, repo = layout
    with Server(model_repository=str(repo), backend_directory=str(backend_dir)) as running:
        yield running


def run(server: Server, coroutine, timeout: float = 60.0):
    return asyncio.run_coroutine_threadsafe(coroutine, server._loop).result(timeout)


def infer(server: Server, model: str, x: np.ndarray) -> tuple[np.ndarray, dict]:
    response = run(server, server.infer_async(InferenceRequest(model, [InferInput("INPUT0", "FP32", x.shape, x)])))
    outputs = {o.name: o.data for o in response.outputs}
    info = outputs["INFO"].reshape(-1)[0]
    return np.asarray(outputs["OUTPUT0"]), json.loads(info.decode() if isinstance(info, bytes) else info)


# ---------------------------------------------------------------- registry


def test_registry_falls_back_to_backend_directory(tmp_path):
    model_file = write_backend(tmp_path)
    backend = BackendRegistry().get("scale", str(tmp_path))
    assert isinstance(backend, PythonBackend)
    assert backend.name == "scale"
    assert backend.shared_model_file == model_file.resolve()


def test_registry_builtins_win_over_backend_directory(tmp_path):
    write_backend(tmp_path, "python")
    backend = BackendRegistry().get("python", str(tmp_path))
    assert backend.name == "python" and backend.shared_model_file is None


@pytest.mark.parametrize("directory", [None, "missing-dir"])
def test_registry_unknown_backend_is_unavailable(tmp_path, directory):
    write_backend(tmp_path)
    with pytest.raises(BackendUnavailable, match="unable to find backend 'other'"):
        BackendRegistry().get("other", None if directory is None else str(tmp_path / directory))
    with pytest.raises(BackendUnavailable, match="unable to find backend 'scale'"):
        BackendRegistry().get("scale")  # no backend directory: no fallback


def test_registry_ignores_names_that_are_paths(tmp_path):
    write_backend(tmp_path / "inner")
    with pytest.raises(BackendUnavailable):
        BackendRegistry().get("inner/scale", str(tmp_path))
    with pytest.raises(BackendUnavailable):
        BackendRegistry().get("..", str(tmp_path / "inner" / "scale"))


# ---------------------------------------------------------------- in-process server


def test_two_models_share_the_backend_with_their_own_data(server, layout):
    backend_dir, repo = layout
    x = np.array([1.0, 2.5, -4.0], dtype=np.float32)
    doubled, info2 = infer(server, "double", x)
    tripled, info3 = infer(server, "triple", x)
    np.testing.assert_allclose(doubled, x * 2)
    np.testing.assert_allclose(tripled, x * 3)
    shared = str((backend_dir / "scale" / "model.py").resolve())
    assert info2 == {"model_repository": str(repo / "double"), "model_version": "1", "model_name": "double", "file": shared}
    assert info3["model_repository"] == str(repo / "triple") and info3["file"] == shared


def test_auto_complete_runs_from_the_shared_model_py(server):
    config = server.model_config("double")
    assert config.backend == "scale"
    assert [i.name for i in config.input] == ["INPUT0"]
    assert [o.name for o in config.output] == ["OUTPUT0", "INFO"]
    assert server.model_config("triple").default_model_filename == "model.json"


def test_missing_backend_fails_the_model_clearly(server):
    entry = next(e for e in server.repository_index() if e["name"] == "missing")
    assert entry.get("state") == "UNAVAILABLE"
    assert "unable to find backend 'nonexistent'" in entry.get("reason", "")


def test_without_backend_directory_the_models_do_not_load(layout):
    _, repo = layout
    with Server(model_repository=str(repo)) as running:
        entry = next(e for e in running.repository_index() if e["name"] == "double")
        assert entry.get("state") == "UNAVAILABLE"
        assert "unable to find backend 'scale'" in entry.get("reason", "")


# ---------------------------------------------------------------- real CLI


def test_serve_with_backend_directory_flag(layout):
    backend_dir, repo = layout
    with start_server(repo, "--backend-directory", str(backend_dir)) as running:
        client = httpclient.InferenceServerClient(running.http_url)
        x = np.array([3.0, -1.0], dtype=np.float32)
        for model, factor in (("double", 2), ("triple", 3)):
            tensor = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            result = client.infer(model, [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0")])
            np.testing.assert_allclose(result.as_numpy("OUTPUT0"), x * factor)
        assert not client.is_model_ready("missing")
