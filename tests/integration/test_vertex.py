"""Vertex AI mode, configured and called as Vertex AI does: AIP_* environment, health and predict routes."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support.onnx_models import add_sub_model, identity_model
from tests.support.servers import start_server

BINARY_MIME = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
HEALTH = "/v1/endpoints/123/deployedModels/456"
PREDICT = "/v1/endpoints/123/deployedModels/456:predict"


def vertex_env(**extra: str) -> dict[str, str]:
    env = {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": "0", "AIP_HEALTH_ROUTE": HEALTH, "AIP_PREDICT_ROUTE": PREDICT}
    env.update(extra)
    return env


def _request(port: int, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, data


def _predict(port: int, doc: dict, headers: dict | None = None) -> tuple[int, dict]:
    status, _, data = _request(port, "POST", PREDICT, json.dumps(doc).encode(),
                               {"Content-Type": "application/json", **(headers or {})})
    return status, (json.loads(data) if data else {})


ADD_SUB = {"inputs": [
    {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [4.0] * 16},
    {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16},
]}


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    """The model artifacts Vertex AI names in AIP_STORAGE_URI (one model)."""
    repo = tmp_path_factory.mktemp("vertex_storage")
    add_sub_model(repo, "add_sub")
    return repo


@pytest.fixture(scope="module")
def vertex(storage):
    """Started the way a Vertex AI container starts: no flags but the environment."""
    with start_server(None, env=vertex_env(AIP_STORAGE_URI=str(storage))) as server:
        yield server


def test_vertex_environment_turns_the_plain_frontends_off(vertex):
    assert vertex.vertex_ai_port and vertex.http_port is None and vertex.grpc_port is None
    assert "Started Vertex AI HTTPService" in "".join(vertex.output)


def test_health_route_answers_when_ready(vertex):
    status, _, body = _request(vertex.vertex_ai_port, "GET", HEALTH)
    assert status == 200 and body == b""
    assert _request(vertex.vertex_ai_port, "POST", HEALTH, b"")[0] == 405
    status, _, body = _request(vertex.vertex_ai_port, "GET", HEALTH + "/x")
    assert status == 400 and f"unknown Vertex AI route: GET {HEALTH}/x".encode() in body


def test_predict_runs_the_only_model_of_the_storage_uri(vertex):
    status, doc = _predict(vertex.vertex_ai_port, ADD_SUB)
    assert status == 200, doc
    assert doc["model_name"] == "add_sub"
    assert doc["outputs"][0]["data"] == [5.0] * 16 and doc["outputs"][1]["data"] == [3.0] * 16


def test_predict_with_binary_tensors(vertex):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=True)
    inputs[1].set_data_from_numpy(a, binary_data=True)
    outputs = [httpclient.InferRequestedOutput("OUTPUT1", binary_data=True)]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    status, headers, data = _request(vertex.vertex_ai_port, "POST", PREDICT, body,
                                     {"Content-Type": f"{BINARY_MIME}{json_size}"})
    assert status == 200, data
    length = int(headers["content-type"][len(BINARY_MIME):])
    result = httpclient.InferenceServerClient.parse_response_body(data, header_length=length)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 16), dtype=np.float32))


def test_predict_route_only_takes_post_and_other_routes_are_400(vertex):
    assert _request(vertex.vertex_ai_port, "GET", PREDICT)[0] == 405
    assert _request(vertex.vertex_ai_port, "GET", "/v2/health/ready")[0] == 400


@pytest.mark.parametrize("target,check", [
    ("v2/models/add_sub/ready", lambda status, body: status == 200),
    ("v2/models/add_sub/config", lambda status, body: json.loads(body)["name"] == "add_sub"),
    ("v2/models/add_sub", lambda status, body: json.loads(body)["inputs"][0]["name"] == "INPUT0"),
    ("v2/models/add_sub/stats", lambda status, body: json.loads(body)["model_stats"][0]["name"] == "add_sub"),
    ("v2/models/stats", lambda status, body: status == 200 and "model_stats" in json.loads(body)),
    ("v2", lambda status, body: json.loads(body)["name"] == "triton"),
    ("v2/health/live", lambda status, body: status == 200),
    ("v2/repository/index", lambda status, body: json.loads(body)[0]["name"] == "add_sub"),
    ("metrics", lambda status, body: b"nv_inference_request_success" in body),
])
def test_redirect_header_reaches_other_v2_endpoints(vertex, target, check):
    status, _, body = _request(vertex.vertex_ai_port, "POST", PREDICT, b"",
                               {"X-Vertex-Ai-Triton-Redirect": target})
    assert status == 200 and check(status, body), (status, body)


def test_redirect_to_infer_and_to_unknown_targets(vertex):
    status, doc = _predict(vertex.vertex_ai_port, ADD_SUB, {"X-Vertex-Ai-Triton-Redirect": "v2/models/add_sub/infer"})
    assert status == 200 and doc["outputs"][0]["data"] == [5.0] * 16
    status, _, body = _request(vertex.vertex_ai_port, "POST", PREDICT, b"", {"X-Vertex-Ai-Triton-Redirect": "v2/logging"})
    assert status == 400 and b"unsupported Vertex AI redirect target" in body
    status, _, body = _request(vertex.vertex_ai_port, "POST", PREDICT, b"",
                               {"X-Vertex-Ai-Triton-Redirect": "v2/models/..%2Fx/config"})
    assert status == 400 and b"invalid model name" in body


def test_default_model_flag_picks_among_several(tmp_path):
    add_sub_model(tmp_path, "add_sub")
    identity_model(tmp_path, "echo", "INT32", [-1])
    with start_server(tmp_path, "--vertex-ai-default-model=echo", "--allow-http=true",
                      env=vertex_env()) as server:
        assert server.http_port is not None  # an explicit flag wins over the AIP_MODE default
        doc = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 3], "data": [7, 8, 9]}]}
        status, answer = _predict(server.vertex_ai_port, doc)
        assert status == 200 and answer["model_name"] == "echo" and answer["outputs"][0]["data"] == [7, 8, 9]


@pytest.mark.parametrize("flags,env,message", [
    ([], {}, "Expect the model repository contains only a single model if default model is not specified"),
    (["--vertex-ai-default-model=missing"], {}, "Expect the default model 'missing' is loaded"),
    ([], {"AIP_PREDICT_ROUTE": ""}, "AIP_PREDICT_ROUTE is not defined for the Vertex AI endpoint"),
])
def test_vertex_start_errors(tmp_path, flags, env, message):
    add_sub_model(tmp_path, "one")
    add_sub_model(tmp_path, "two")
    process = subprocess.run(
        [sys.executable, "-m", "naiad", "serve", "--model-repository", str(tmp_path),
         "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1", "--metrics-port=0", *flags],
        capture_output=True, text=True, timeout=120, env={**os.environ, **vertex_env(**env)},
    )
    assert process.returncode != 0
    assert message in process.stdout + process.stderr
