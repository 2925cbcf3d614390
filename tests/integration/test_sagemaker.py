"""SageMaker mode, called as SageMaker calls a container: /ping, /invocations, and the multi-model endpoint routes."""

from __future__ import annotations

import http.client
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support.onnx_models import add_sub_model, ensemble_model
from tests.support.servers import start_server

BINARY_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="


def _request(port: int, method: str, path: str, body: bytes | None = None,
             headers: dict | None = None) -> tuple[int, dict, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, data


def _json(port: int, method: str, path: str, doc=None, headers: dict | None = None) -> tuple[int, object]:
    body = json.dumps(doc).encode() if doc is not None else None
    status, _, data = _request(port, method, path, body, {"Content-Type": "application/json", **(headers or {})})
    return status, (json.loads(data) if data else None)


def _add_sub_body(a: float, b: float) -> dict:
    return {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [a] * 16},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [b] * 16},
    ]}


def _binary_request(a: np.ndarray, b: np.ndarray) -> tuple[bytes, int]:
    inputs = [httpclient.InferInput("INPUT0", list(a.shape), "FP32"), httpclient.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=True)
    inputs[1].set_data_from_numpy(b, binary_data=True)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    return body, json_size


@pytest.fixture(scope="module")
def archives(tmp_path_factory) -> dict[str, Path]:
    """Unpacked model archives as SageMaker puts them under /opt/ml/models/<hash>/model."""
    root = tmp_path_factory.mktemp("sm_archives")
    single = add_sub_model(root / "single_parent", "whatever_dir_name")
    nested = root / "nested"
    add_sub_model(nested, "inner")
    ens = root / "ensemble"
    add_sub_model(ens, "step_add_sub")
    ensemble_model(
        ens, "pipeline",
        steps=[("step_add_sub", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "SUM"})],
        inputs=[("A", "FP32", [16]), ("B", "FP32", [16])],
        outputs=[("SUM", "FP32", [16])],
    )
    return {"single": single, "nested": nested, "ensemble": ens}


@pytest.fixture(scope="module")
def sagemaker(tmp_path_factory):
    repo = tmp_path_factory.mktemp("sm_repo")
    add_sub_model(repo, "add_sub")
    add_sub_model(repo, "other")
    with start_server(
        repo, "--allow-sagemaker=true", "--sagemaker-port=0",
        "--model-control-mode=explicit", "--load-model=add_sub", "--load-model=other",
        env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_sub"},
    ) as server:
        assert server.sagemaker_port not in (None, server.http_port)
        yield server


def test_ping_answers_when_ready(sagemaker):
    status, headers, body = _request(sagemaker.sagemaker_port, "GET", "/ping")
    assert status == 200 and body == b""
    assert _request(sagemaker.sagemaker_port, "POST", "/ping", b"")[0] == 405
    assert _request(sagemaker.sagemaker_port, "GET", "/invocations")[0] == 405
    status, _, body = _request(sagemaker.sagemaker_port, "GET", "/pings")
    assert status == 400 and b"unknown SageMaker route: GET /pings" in body


def test_invocations_runs_the_default_model_named_by_the_environment(sagemaker):
    status, headers, body = _request(sagemaker.sagemaker_port, "POST", "/invocations",
                                     json.dumps(_add_sub_body(2.0, 0.5)).encode(), {"Content-Type": "application/json"})
    assert status == 200 and headers["content-type"] == "application/json"
    doc = json.loads(body)
    assert doc["model_name"] == "add_sub"
    assert doc["outputs"][0]["data"] == [2.5] * 16 and doc["outputs"][1]["data"] == [1.5] * 16


def test_invocations_with_binary_tensors_uses_the_sagemaker_mime_type(sagemaker):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.float32)
    body, json_size = _binary_request(a, b)
    status, headers, data = _request(sagemaker.sagemaker_port, "POST", "/invocations", body,
                                     {"Content-Type": f"{BINARY_MIME}{json_size}"})
    assert status == 200, data
    assert headers["content-type"].startswith(BINARY_MIME)
    header_length = int(headers["content-type"][len(BINARY_MIME):])
    result = httpclient.InferenceServerClient.parse_response_body(data, header_length=header_length)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def test_invocations_errors_are_json(sagemaker):
    status, doc = _json(sagemaker.sagemaker_port, "POST", "/invocations", {"inputs": [{"name": "INPUT0"}]})
    assert status == 400 and "error" in doc
    status, _, _ = _request(sagemaker.sagemaker_port, "POST", "/invocations", b"{}",
                            {"Content-Type": BINARY_MIME + "999999"})
    assert status == 400


def test_unknown_routes_are_400(sagemaker):
    for method, path in (("GET", "/"), ("GET", "/v2/health/ready"), ("PUT", "/models/x"), ("POST", "/models/a/b")):
        assert _request(sagemaker.sagemaker_port, method, path)[0] == 400, path


def test_routes_match_whole_path_segments(sagemaker):
    """/models routes are /models, /models/<name> and /models/<name>/invoke, nothing that only starts so."""
    for method, path in (("GET", "/modelsx"), ("POST", "/modelsx/invoke"), ("DELETE", "/models"), ("GET", "/models/x/invoke")):
        status, _, body = _request(sagemaker.sagemaker_port, method, path)
        assert status == 400 and f"unknown SageMaker route: {method} {path}".encode() in body, path
    assert _request(sagemaker.sagemaker_port, "GET", "/ping")[0] == 200


def test_multi_model_endpoint_lifecycle(sagemaker, archives):
    port = sagemaker.sagemaker_port
    status, doc = _json(port, "GET", "/models")
    assert status == 200 and doc == {"models": []}
    url = str(archives["single"])
    assert _json(port, "POST", "/models", {"model_name": "hash-single", "url": url})[0] == 200
    status, doc = _json(port, "GET", "/models")
    assert doc == {"models": [{"modelName": "hash-single", "modelUrl": url}]}
    assert _json(port, "GET", "/models/hash-single") == (200, {"modelName": "hash-single", "modelUrl": url})
    status, doc = _json(port, "POST", "/models/hash-single/invoke", _add_sub_body(1.0, 1.0))
    assert status == 200 and doc["model_name"] == "hash-single" and doc["outputs"][0]["data"] == [2.0] * 16
    # the model is also an ordinary model of the server
    client = httpclient.InferenceServerClient(sagemaker.http_url)
    assert client.is_model_ready("hash-single")
    status, doc = _json(port, "POST", "/models", {"model_name": "hash-single", "url": url})
    assert status == 409 and "already loaded" in doc["error"]
    assert _json(port, "DELETE", "/models/hash-single")[0] == 200
    assert _json(port, "GET", "/models/hash-single")[0] == 404
    assert _json(port, "POST", "/models/hash-single/invoke", _add_sub_body(1.0, 1.0))[0] == 404
    assert _json(port, "DELETE", "/models/hash-single")[0] == 404
    assert not client.is_model_ready("hash-single")
    client.close()


def test_target_model_header_names_the_loaded_model(sagemaker, archives):
    port = sagemaker.sagemaker_port
    header = {"X-Amzn-SageMaker-Target-Model": "inner-model.tar.gz"}
    assert _json(port, "POST", "/models", {"model_name": "hash-nested", "url": str(archives["nested"])}, header)[0] == 200
    status, doc = _json(port, "POST", "/models/hash-nested/invoke", _add_sub_body(3.0, 1.0), header)
    assert status == 200 and doc["model_name"] == "inner-model.tar.gz" and doc["outputs"][1]["data"] == [2.0] * 16
    assert _json(port, "DELETE", "/models/hash-nested", None, header)[0] == 200


def test_ensemble_archive_loads_its_composing_models(sagemaker, archives):
    port = sagemaker.sagemaker_port
    loaded = _json(port, "POST", "/models", {"model_name": "hash-ens", "url": str(archives["ensemble"])})
    assert loaded[0] == 200, loaded
    body = {"inputs": [{"name": "A", "datatype": "FP32", "shape": [1, 16], "data": [1.5] * 16},
                       {"name": "B", "datatype": "FP32", "shape": [1, 16], "data": [2.0] * 16}]}
    status, doc = _json(port, "POST", "/models/hash-ens/invoke", body)
    assert status == 200 and doc["outputs"][0]["name"] == "SUM" and doc["outputs"][0]["data"] == [3.5] * 16
    client = httpclient.InferenceServerClient(sagemaker.http_url)
    assert client.is_model_ready("step_add_sub")
    assert _json(port, "DELETE", "/models/hash-ens")[0] == 200
    assert not client.is_model_ready("step_add_sub") and not client.is_model_ready("hash-ens")
    client.close()


@pytest.mark.parametrize("doc,message", [
    ({"model_name": "m", "url": "/proc/self"}, "cannot start with /dev/, /proc/, or /sys/"),
    ({"model_name": "m", "url": "/nonexistent/model/dir"}, "not a directory"),
    ({"model_name": "../m", "url": "/tmp"}, "invalid model name"),
    ({"url": "/tmp"}, "must give 'model_name' and 'url'"),
])
def test_bad_load_requests_are_400(sagemaker, doc, message):
    status, answer = _json(sagemaker.sagemaker_port, "POST", "/models", doc)
    assert status == 400 and message in answer["error"]


def test_broken_archive_is_400_and_not_listed(sagemaker, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(Path(__file__).parent.parent / "support", broken / "not_a_model" / "1")
    status, doc = _json(sagemaker.sagemaker_port, "POST", "/models", {"model_name": "hash-broken", "url": str(broken)})
    assert status == 400 and doc["error"]
    assert _json(sagemaker.sagemaker_port, "GET", "/models/hash-broken")[0] == 404


@pytest.fixture(scope="module")
def restricted_sagemaker(tmp_path_factory):
    repo = tmp_path_factory.mktemp("sm_single")
    add_sub_model(repo, "only_model")
    with start_server(repo, "--allow-sagemaker=true", "--sagemaker-port=0", "--allow-http=false", "--allow-grpc=false",
                      "--http-restricted-api=model-repository:sm-admin=yes") as server:
        yield server


def test_without_the_environment_variable_the_only_model_is_the_default(restricted_sagemaker):
    assert restricted_sagemaker.http_port is None and restricted_sagemaker.grpc_port is None
    status, doc = _json(restricted_sagemaker.sagemaker_port, "POST", "/invocations", _add_sub_body(1.0, 2.0))
    assert status == 200 and doc["model_name"] == "only_model"


def test_several_models_without_a_default_is_a_clear_error(tmp_path):
    add_sub_model(tmp_path, "one")
    add_sub_model(tmp_path, "two")
    with start_server(tmp_path, "--allow-sagemaker=true", "--sagemaker-port=0") as server:
        status, doc = _json(server.sagemaker_port, "POST", "/invocations", _add_sub_body(1.0, 2.0))
        assert status == 400 and "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME" in doc["error"]


def test_multi_model_routes_follow_the_model_repository_restriction(restricted_sagemaker):
    port = restricted_sagemaker.sagemaker_port
    status, doc = _json(port, "GET", "/models")
    assert status == 403 and doc == {"error": "This API is restricted, expecting header 'sm-admin'"}
    assert _json(port, "GET", "/models", None, {"sm-admin": "yes"}) == (200, {"models": []})
    assert _request(port, "GET", "/ping")[0] == 200  # health is not restricted here
