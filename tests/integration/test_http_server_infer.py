"""The real `naiad serve` over HTTP: health, metadata, config, infer for every datatype, extensions, errors."""

from __future__ import annotations

import gzip
import http.client
import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.onnx_models import ALL_DATATYPES, identity_model, standard_repository
from tests.support.servers import RunningServer, start_server

NUMPY = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = standard_repository(tmp_path_factory.mktemp("http_infer") / "models")
    decoupled = identity_model(repo, "decoupled_identity", "INT32", [-1], max_batch_size=0)
    config = decoupled / "config.pbtxt"
    config.write_text(config.read_text() + "model_transaction_policy { decoupled: true }\n")
    with start_server(repo) as running:
        yield running


@pytest.fixture()
def client(server: RunningServer) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.close()


def call(server: RunningServer, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def error_of(body: bytes) -> str:
    return json.loads(body)["error"]


def sample(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    count = int(np.prod(shape))
    if datatype == "BYTES":
        return np.array([f"é{i}".encode() for i in range(count)], dtype=np.object_).reshape(shape)
    if datatype == "BOOL":
        return (np.arange(count) % 2 == 0).reshape(shape)
    return (np.arange(count) + 1).astype(NUMPY[datatype]).reshape(shape)


def _infer(client, model, array, datatype, binary_in, binary_out):
    inp = httpclient.InferInput("INPUT0", list(array.shape), datatype)
    inp.set_data_from_numpy(array, binary_data=binary_in)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_out)
    return client.infer(model, [inp], outputs=[out])


# ------------------------------------------------------------------ health, metadata, config


def test_health_endpoints(server, client):
    assert client.is_server_live() and client.is_server_ready()
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/add_sub/ready", "/v2/models/add_sub/versions/1/ready"):
        status, headers, body = call(server, "GET", path)
        assert (status, body) == (200, b""), path
        assert headers["content-type"].startswith("text/plain")


def test_server_metadata(client):
    meta = client.get_server_metadata()
    assert meta["name"] == "triton"
    assert {"binary_tensor_data", "classification", "model_repository", "system_shared_memory"} <= set(meta["extensions"])


def test_model_metadata_and_config(server, client):
    expected = {
        "name": "add_sub", "versions": ["1"], "platform": "onnxruntime_onnx",
        "inputs": [{"name": f"INPUT{i}", "datatype": "FP32", "shape": [-1, 16]} for i in (0, 1)],
        "outputs": [{"name": f"OUTPUT{i}", "datatype": "FP32", "shape": [-1, 16]} for i in (0, 1)],
    }
    assert client.get_model_metadata("add_sub") == expected
    assert client.get_model_metadata("add_sub", "1") == expected
    config = client.get_model_config("add_sub_nobatch", "1")
    assert config["max_batch_size"] == 0 and config["input"][0]["dims"] == [4]
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    status, headers, _ = call(server, "GET", "/v2/models/add_sub/config")
    assert status == 200 and headers["content-type"] == "application/json"


def test_unknown_model_and_version(server):
    status, _, body = call(server, "GET", "/v2/models/nope")
    assert status == 404 and error_of(body) == "Request for unknown model: 'nope' is not found"
    status, _, body = call(server, "GET", "/v2/models/add_sub/versions/9/config")
    assert status == 404 and error_of(body) == "Request for unknown model: 'add_sub' version 9 is not found"
    status, _, body = call(server, "GET", "/v2/models/nope/ready")
    assert status == 400 and "nope" in error_of(body)
    status, _, body = call(server, "POST", "/v2/models/nope/infer", b'{"inputs": []}')
    assert status == 404 and error_of(body) == "Request for unknown model: 'nope' is not found"


@pytest.mark.parametrize("body,headers", [
    (b'{"inputs": [', {}),  # malformed JSON
    (b'{"inputs": [{"name": "X", "datatype": "FP99", "shape": [1], "data": [1]}]}', {}),
    (b'{"inputs": []}', {"Inference-Header-Content-Length": "500"}),
    (b'{"inputs": [', {"Content-Encoding": "br"}),
], ids=["json", "datatype", "header-length", "encoding"])
def test_an_unknown_model_is_404_whatever_the_body_holds(server, body, headers):
    """As Triton 2.51 answers (probed): the model is looked up before the body is decoded."""
    status, _, answer = call(server, "POST", "/v2/models/nope/infer", body, headers)
    assert status == 404 and error_of(answer) == "Request for unknown model: 'nope' is not found"
    status, _, answer = call(server, "POST", "/v2/models/add_sub/versions/9/infer", body, headers)
    assert status == 404 and error_of(answer) == "Request for unknown model: 'add_sub' version 9 is not found"
    status, _, answer = call(server, "POST", "/v2/models/add_sub/infer", body, headers)
    assert status == 400  # a known model: the body's own error


def test_not_found_and_method_not_allowed(server):
    for path in ("/v2/nothing", "/v2/models/add_sub/versions/x/ready", "/v2/models/add_sub/explode", "/v3"):
        status, headers, body = call(server, "GET", path)
        assert (status, json.loads(body)) == (404, {"error": "Not Found"}), path
        assert headers["content-type"] == "application/json"
    for method, path in (("GET", "/v2/models/add_sub/infer"), ("POST", "/v2/models/add_sub/config"),
                         ("DELETE", "/v2"), ("GET", "/v2/repository/index"),
                         ("GET", "/v2/systemsharedmemory/region/x/register")):
        status, _, body = call(server, method, path)
        assert (status, json.loads(body)) == (405, {"error": "Method Not Allowed"}), (method, path)


# ------------------------------------------------------------------ inference


@pytest.mark.parametrize("datatype", ALL_DATATYPES)
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_identity_every_datatype(client, datatype, binary):
    array = sample(datatype, (2, 3))
    if datatype == "FP16" and not binary:
        with pytest.raises(InferenceServerException) as info:
            _infer(client, "identity_fp16", array, datatype, False, False)
        assert info.value.status() == "400"
        assert "receiving FP16 data via JSON is not supported" in info.value.message()
        return
    result = _infer(client, f"identity_{datatype.lower()}", array, datatype, binary, binary)
    got = result.as_numpy("OUTPUT0")
    assert got.shape == (2, 3)
    if datatype == "BYTES":
        got = np.array([x if isinstance(x, bytes) else str(x).encode() for x in got.ravel()], dtype=np.object_)
        assert list(got) == list(array.ravel())
    else:
        assert got.dtype == NUMPY[datatype]
        np.testing.assert_array_equal(got, array)


def test_fp16_output_as_json_refused(client):
    array = sample("FP16", (1, 4))
    with pytest.raises(InferenceServerException) as info:
        _infer(client, "identity_fp16", array, "FP16", True, False)
    assert info.value.status() == "400"
    assert "sending FP16 data via JSON is not supported" in info.value.message()


def test_add_sub_with_request_id_and_mixed_encodings(client):
    a = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    b = np.ones((3, 16), np.float32)
    inputs = [httpclient.InferInput("INPUT0", [3, 16], "FP32"), httpclient.InferInput("INPUT1", [3, 16], "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=True)
    inputs[1].set_data_from_numpy(b, binary_data=False)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=False),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=True)]
    result = client.infer("add_sub", inputs, outputs=outputs, request_id="req-7", model_version="1")
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    response = result.get_response()
    assert response["id"] == "req-7" and response["model_name"] == "add_sub" and response["model_version"] == "1"


def test_only_requested_output_is_returned(server):
    doc = {"inputs": [{"name": f"INPUT{i}", "datatype": "FP32", "shape": [1, 16], "data": [[1.0] * 16]} for i in (0, 1)],
           "outputs": [{"name": "OUTPUT1"}]}
    status, headers, body = call(server, "POST", "/v2/models/add_sub/infer", json.dumps(doc).encode())
    assert status == 200 and headers["content-type"] == "application/json"
    response = json.loads(body)
    assert "id" not in response
    assert [o["name"] for o in response["outputs"]] == ["OUTPUT1"]
    assert response["outputs"][0]["data"] == [0.0] * 16


def test_classification_with_and_without_labels(client):
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    inp = httpclient.InferInput("INPUT", [2, 4], "FP32")
    inp.set_data_from_numpy(x)
    probs = client.infer("classifier", [inp]).as_numpy("PROBS")
    top = np.argsort(-probs, axis=1)[:, :3]
    for model, binary in (("classifier", True), ("classifier", False), ("classifier_nolabels", True)):
        out = httpclient.InferRequestedOutput("PROBS", binary_data=binary, class_count=3)
        result = client.infer(model, [inp], outputs=[out])
        got = result.as_numpy("PROBS")
        assert got.shape == (2, 3) and result.get_output("PROBS")["datatype"] == "BYTES"
        for row in range(2):
            for k in range(3):
                text = got[row, k].decode() if isinstance(got[row, k], bytes) else got[row, k]
                parts = text.split(":")
                assert int(parts[1]) == top[row, k]
                assert abs(float(parts[0]) - probs[row, top[row, k]]) < 1e-5
                if model == "classifier":
                    assert parts[2] == f"class_{top[row, k]}"
                else:
                    assert len(parts) == 2


def test_raw_binary_request(server):
    x = np.arange(5, dtype=np.float32)
    status, headers, body = call(server, "POST", "/v2/models/identity_fp32/infer", x.tobytes(),
                                 {"Inference-Header-Content-Length": "0"})
    assert status == 200 and headers["content-type"] == "application/octet-stream"
    n = int(headers["inference-header-content-length"])
    header = json.loads(body[:n])
    assert header["outputs"][0]["shape"] == [1, 5]
    assert header["outputs"][0]["parameters"]["binary_data_size"] == 20
    assert np.frombuffer(body[n:], np.float32).tolist() == x.tolist()
    status, _, body = call(server, "POST", "/v2/models/add_sub/infer", b"\0" * 128, {"Inference-Header-Content-Length": "0"})
    assert status == 400
    assert "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'add_sub'" in error_of(body)
    status, _, body = call(server, "POST", "/v2/models/identity_fp32/infer", b"\0" * 7, {"Inference-Header-Content-Length": "0"})
    assert status == 400 and "INPUT0" in error_of(body)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_request_and_response(client, algorithm):
    x = np.arange(32, dtype=np.int32).reshape(2, 16)
    inputs = [httpclient.InferInput(f"INPUT{i}", [2, 16], "INT32") for i in (0, 1)]
    for inp in inputs:
        inp.set_data_from_numpy(x)
    result = client.infer("add_sub_int32", inputs, request_compression_algorithm=algorithm,
                          response_compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x * 2)


def test_response_compression_header(server):
    doc = {"inputs": [{"name": "INPUT0", "datatype": "INT64", "shape": [1, 3], "data": [1, 2, 3]}]}
    status, headers, body = call(server, "POST", "/v2/models/identity_int64/infer", json.dumps(doc).encode(),
                                 {"Accept-Encoding": "gzip"})
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert json.loads(gzip.decompress(body))["outputs"][0]["data"] == [1, 2, 3]


def test_decoupled_model_refused(server):
    doc = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [1]}]}
    status, _, body = call(server, "POST", "/v2/models/decoupled_identity/infer", json.dumps(doc).encode())
    assert status == 501
    assert error_of(body) == "HTTP end point doesn't support models with decoupled transaction policy"


def test_core_validation_errors(client, server):
    inputs = [httpclient.InferInput(f"INPUT{i}", [1, 8], "FP32") for i in (0, 1)]
    for inp in inputs:
        inp.set_data_from_numpy(np.zeros((1, 8), np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("add_sub", inputs)
    assert info.value.status() == "400"
    assert info.value.message().startswith(
        "[request id: <id_unknown>] unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [-1,16], got [1,8]"
    )
    doc = {"inputs": [{"name": f"INPUT{i}", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16} for i in (0, 1)],
           "outputs": [{"name": "NOPE"}]}
    status, _, body = call(server, "POST", "/v2/models/add_sub/infer", json.dumps(doc).encode())
    assert status == 400 and "unexpected inference output 'NOPE' for model 'add_sub'" in error_of(body)


def test_parameters(server):
    base = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}]}
    doc = dict(base, parameters={"custom": "x", "n": 3, "ok": True, "f": 0.5, "priority": 0, "binary_data_output": True})
    status, headers, _ = call(server, "POST", "/v2/models/identity_int32/infer", json.dumps(doc).encode())
    assert status == 200 and headers["content-type"] == "application/octet-stream"
    doc = dict(base, parameters={"triton_enable_empty_final_response": True})
    status, _, body = call(server, "POST", "/v2/models/identity_int32/infer", json.dumps(doc).encode())
    assert status == 400
    assert error_of(body) == (
        "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
    )
    # Triton reads an integer outside int64 as a double; null, lists and objects are refused.
    for value in (2**64 - 1, 2**63, -(2**63) - 1):
        doc = dict(base, parameters={"big": value})
        status, _, body = call(server, "POST", "/v2/models/identity_int32/infer", json.dumps(doc).encode())
        assert status == 200, body
    for value in (None, [1], {"a": 1}):
        doc = dict(base, parameters={"c": value})
        status, _, body = call(server, "POST", "/v2/models/identity_int32/infer", json.dumps(doc).encode())
        assert (status, error_of(body)) == (400, "parameter 'c' has invalid type. It should be either 'int', 'bool', or 'string'.")
    # Wrong types of the request-level keys: Triton's texts (Naiad answers 400 where Triton answers 500).
    uint, boolean = "non-unsigned-integer as unsigned-integer", "non-boolean as boolean"
    for key, value, kind in (("sequence_id", -1, "non-string as string"), ("sequence_id", 1.5, "non-string as string"),
                             ("priority", -1, uint), ("timeout", "5", uint), ("sequence_start", 1, boolean),
                             ("binary_data_output", 1, boolean)):
        doc = dict(base, parameters={key: value})
        status, _, body = call(server, "POST", "/v2/models/identity_int32/infer", json.dumps(doc).encode())
        assert (status, error_of(body)) == (400, f"Unable to parse '{key}': attempt to access JSON {kind}")


def test_version_strings_as_triton_reads_them(server):
    """Digits only in the path (else 404 Not Found); digits past int64 get Triton's stol text (400)."""
    doc = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}]}).encode()
    big = "99999999999999999999"
    message = (f"failed to get model version from specified version string '{big}' (details: stol), "
               "version should be an integral value > 0")
    for method, suffix, body in (("POST", "/infer", doc), ("GET", "", None), ("GET", "/config", None),
                                 ("GET", "/ready", None), ("GET", "/stats", None)):
        status, _, answer = call(server, method, f"/v2/models/identity_int32/versions/{big}{suffix}", body)
        assert (status, error_of(answer)) == (400, message), suffix
        status, _, _ = call(server, method, f"/v2/models/identity_int32/versions/abc{suffix}", body)
        assert status == 404, suffix
    status, _, _ = call(server, "POST", "/v2/models/identity_int32/versions/1/infer", doc)
    assert status == 200


def test_statistics(client):
    inp = httpclient.InferInput("INPUT0", [1, 1], "INT8")
    inp.set_data_from_numpy(np.ones((1, 1), np.int8))
    before = client.get_inference_statistics("identity_int8")["model_stats"][0]
    client.infer("identity_int8", [inp])
    after = client.get_inference_statistics("identity_int8", "1")["model_stats"][0]
    assert after["name"] == "identity_int8"
    assert int(after["inference_stats"]["success"]["count"]) == int(before["inference_stats"]["success"]["count"]) + 1
    names = {s["name"] for s in client.get_inference_statistics()["model_stats"]}
    assert {"add_sub", "identity_int8"} <= names
    with pytest.raises(InferenceServerException) as info:
        client.get_inference_statistics("nope")
    assert info.value.status() == "400" and "requested model 'nope' is not available" in info.value.message()


def test_repository_control_refused_outside_explicit_mode(server, client):
    with pytest.raises(InferenceServerException) as info:
        client.load_model("add_sub")
    assert info.value.status() == "503"
    assert info.value.message() == "explicit model load / unload is not allowed if polling is enabled"
    status, _, body = call(server, "POST", "/v2/repository/models/add_sub/unload")
    assert status == 503
    index = client.get_model_repository_index()
    assert {"name": "add_sub", "version": "1", "state": "READY"} in index


def test_cuda_shared_memory_answers_without_gpu(server, client):
    assert client.get_cuda_shared_memory_status() == []
    body = json.dumps({"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 64}).encode()
    status, _, resp = call(server, "POST", "/v2/cudasharedmemory/region/c0/register", body)
    assert status == 501 and "CUDA shared memory is not supported" in error_of(resp)
    client.unregister_cuda_shared_memory()


def test_logging_extension(server, client):
    settings = client.get_log_settings()
    assert set(settings) == {"log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format"}
    updated = client.update_log_settings({"log_verbose_level": 1, "log_info": None})
    assert updated["log_verbose_level"] == 1 and updated["log_info"] == settings["log_info"]
    assert client.update_log_settings({"log_verbose_level": 0})["log_verbose_level"] == 0
    for body, status, message in (
        (b'{"log_file": "/tmp/naiad.log"}', 501, "log file location can not be updated through network protocol"),
        (b'{"log_verbose_level": -1}', 400, "log_verbose_level"),
        (b'{"log_format": "xml"}', 503, "invalid argument for --log_format, got: xml"),
    ):
        got_status, _, resp = call(server, "POST", "/v2/logging", body)
        assert got_status == status and message in error_of(resp), resp
    assert client.get_log_settings()["log_format"] == settings["log_format"]
