"""The real server reads a model's inline execution settings: bad ones fail the load with the parameter's name
and the model already loaded keeps serving; good ones load and serve."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support.onnx_models import add_sub_model
from tests.support.servers import RunningServer, post_json, start_server

ADD_SUB = {
    "backend": "onnxruntime", "max_batch_size": 8,
    "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [16]} for n in ("INPUT0", "INPUT1")],
    "output": [{"name": n, "data_type": "TYPE_FP32", "dims": [16]} for n in ("OUTPUT0", "OUTPUT1")],
}


def _with(**parameters: str) -> str:
    return json.dumps({**ADD_SUB, "parameters": {k: {"string_value": v} for k, v in parameters.items()}})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("inline_policy") / "models"
    add_sub_model(repo, "simple")
    with start_server(repo, "--model-control-mode=explicit", "--load-model=simple") as running:
        yield running


def _load(server: RunningServer, config: str) -> tuple[int, str]:
    status, body = post_json(f"http://{server.http_url}/v2/repository/models/simple/load", {"parameters": {"config": config}})
    return status, json.loads(body)["error"] if body else ""


def _infer_ok(server: RunningServer, requests: int = 1) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    a, b = np.full((1, 16), 3, np.float32), np.ones((1, 16), np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    for _ in range(requests):
        result = client.infer("simple", inputs)
        assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
        assert result.as_numpy("OUTPUT1").tolist() == (a - b).tolist()


@pytest.mark.parametrize(("key", "value"), [("inline_cap_us", "0"), ("inline_threshold_us", "soon")])
def test_a_bad_setting_fails_the_load_and_the_loaded_model_keeps_serving(server: RunningServer, key: str, value: str) -> None:
    status, error = _load(server, _with(**{key: value}))
    assert status == 400
    assert error.startswith("load failed for model 'simple': version 1 is at UNAVAILABLE state: Invalid argument: ")
    assert f"field 'parameters': parameter '{key}' must be a whole number of microseconds" in error and f"got '{value}'" in error
    _infer_ok(server)


@pytest.mark.parametrize("parameters", [{"inline_threshold_us": "0"}, {"inline_threshold_us": "1000000", "inline_cap_us": "1"}])
def test_good_settings_load_and_serve(server: RunningServer, parameters: dict[str, str]) -> None:
    """Never inline; and always inline with a cap every execution exceeds (each one suspends inline execution)."""
    status, error = _load(server, _with(**parameters))
    assert (status, error) == (200, "")
    _infer_ok(server, requests=20)
