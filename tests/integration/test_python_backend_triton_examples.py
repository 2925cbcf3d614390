"""Patterns of Triton's own python_backend examples, on the real server: BLS with a model name taken from a
BYTES tensor, a model directory holding only `1/model.py` (its auto_complete_config writes the config), and a
load-API config override that names no backend for a Python model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from textwrap import dedent

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.test_python_backend_support import (
    ADD_SUB_PY,
    add_sub,
    write_model,
)
from tests.support.servers import RunningServer, post_json, start_server

# As examples/bls/sync_model.py: the target model's name arrives as a BYTES tensor and is passed on as
# `as_numpy()[0]` (a numpy bytes scalar); requested output names and the request id are bytes as well.
BLS_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] },
        { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1, 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1, 16 ] } ]
"""

BLS_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            model_name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME")
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            bls = pb_utils.InferenceRequest(
                model_name=model_name.as_numpy()[0],
                request_id=b"from-bls",
                requested_output_names=[b"OUTPUT0", np.bytes_(b"OUTPUT1")],
                inputs=[pb_utils.Tensor(b"INPUT0", in0.as_numpy()), in1])
            response = bls.exec()
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            responses.append(pb_utils.InferenceResponse([
                pb_utils.get_output_tensor_by_name(response, "OUTPUT0"),
                pb_utils.get_output_tensor_by_name(response, "OUTPUT1")]))
        return responses
"""

# As examples/auto_complete/model.py: no config.pbtxt at all.
AUTO_COMPLETE_PY = ADD_SUB_PY.replace("class TritonPythonModel:\n", dedent('''
    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(auto_complete_model_config):
            config = auto_complete_model_config.as_dict()
            have_in = {i["name"] for i in config["input"]}
            have_out = {o["name"] for o in config["output"]}
            for name in ("INPUT0", "INPUT1"):
                if name not in have_in:
                    auto_complete_model_config.add_input({"name": name, "data_type": "TYPE_FP32", "dims": [16]})
            for name in ("OUTPUT0", "OUTPUT1"):
                if name not in have_out:
                    auto_complete_model_config.add_output({"name": name, "data_type": "TYPE_FP32", "dims": [16]})
            auto_complete_model_config.set_max_batch_size(4)
            auto_complete_model_config.set_dynamic_batching()
            return auto_complete_model_config
'''), 1)

NO_BACKEND_OVERRIDE = {
    "max_batch_size": 2,
    "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [16]} for n in ("INPUT0", "INPUT1")],
    "output": [{"name": n, "data_type": "TYPE_FP32", "dims": [16]} for n in ("OUTPUT0", "OUTPUT1")],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("triton_examples") / "models"
    add_sub(repo, "add_sub")
    add_sub(repo, "overridden")
    write_model(repo, "bls_sync", BLS_CONFIG, BLS_PY)
    auto = repo / "auto_complete" / "1"
    auto.mkdir(parents=True)
    (auto / "model.py").write_text(AUTO_COMPLETE_PY)
    with start_server(repo, "--model-control-mode=explicit", "--load-model=add_sub", "--load-model=bls_sync",
                      "--load-model=auto_complete", "--load-model=overridden", timeout=180) as running:
        yield running


def _add_sub_inputs(module, shape: list[int]) -> tuple[list, np.ndarray, np.ndarray]:
    a = np.arange(16, dtype=np.float32).reshape(shape)
    b = np.full(shape, 2, np.float32)
    inputs = [module.InferInput("INPUT0", shape, "FP32"), module.InferInput("INPUT1", shape, "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_bls_takes_the_model_name_as_bytes(server: RunningServer, module) -> None:
    client = module.InferenceServerClient(server.http_url if module is httpclient else server.grpc_url)
    inputs, a, b = _add_sub_inputs(module, [1, 16])
    name = module.InferInput("MODEL_NAME", [1], "BYTES")
    name.set_data_from_numpy(np.array([b"add_sub"], dtype=np.object_))
    result = client.infer("bls_sync", [name, *inputs])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert client.is_server_ready()


def test_model_py_alone_is_a_python_model_completed_by_auto_complete_config(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_model_ready("auto_complete")
    config = client.get_model_config("auto_complete")
    assert config["backend"] == "python" and config["default_model_filename"] == "model.py"
    assert config["max_batch_size"] == 4
    assert "dynamic_batching" in config
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("INPUT0", "TYPE_FP32", [16]), ("INPUT1", "TYPE_FP32", [16])]
    assert [o["name"] for o in config["output"]] == ["OUTPUT0", "OUTPUT1"]
    inputs, a, b = _add_sub_inputs(httpclient, [1, 16])
    result = client.infer("auto_complete", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def test_config_override_without_backend_loads_a_python_model(server: RunningServer) -> None:
    status, body = post_json(f"http://{server.http_url}/v2/repository/models/overridden/load",
                             {"parameters": {"config": json.dumps(NO_BACKEND_OVERRIDE)}}, timeout=120)
    assert (status, body) == (200, b"")
    client = httpclient.InferenceServerClient(server.http_url)
    config = client.get_model_config("overridden")
    assert config["backend"] == "python" and config["max_batch_size"] == 2
    inputs, a, b = _add_sub_inputs(httpclient, [1, 16])
    np.testing.assert_array_equal(client.infer("overridden", inputs).as_numpy("OUTPUT1"), a - b)
    assert client.is_server_ready()


def test_model_py_outside_a_version_directory_is_not_a_model(tmp_path: Path) -> None:
    """Only `<version>/model.py` makes a Python model; a directory without one still says what is missing."""
    (tmp_path / "models" / "empty" / "1").mkdir(parents=True)
    (tmp_path / "models" / "empty" / "model.py").write_text("")
    with start_server(tmp_path / "models", "--exit-on-error=false") as running:
        status, body = post_json(f"http://{running.http_url}/v2/repository/index", {})
        assert status == 200
        assert json.loads(body) == [{"name": "empty"}]
        assert "unable to determine the backend for model 'empty'" in "".join(running.output)
