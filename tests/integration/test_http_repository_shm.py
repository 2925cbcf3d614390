"""The real server over HTTP: model repository extension (explicit mode) and system shared memory."""

from __future__ import annotations

import http.client
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.support.onnx_models import add_sub_model, identity_model, identity_onnx
from tests.support.servers import RunningServer, start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("http_repo") / "models"
    add_sub_model(repo, "add_sub", datatype="INT32", dims=4, scheduler="")
    identity_model(repo, "identity_fp32", "FP32", [-1])
    identity_model(repo, "identity_int8", "INT8", [-1])
    broken = identity_model(repo, "broken", "FP32", [-1])
    (broken / "1" / "model.onnx").write_bytes(b"this is not an onnx model")
    with start_server(repo, "--model-control-mode", "explicit", "--load-model", "add_sub",
                      "--load-model", "identity_int8") as running:
        yield running


@pytest.fixture()
def client(server: RunningServer) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.close()


def call(server: RunningServer, method: str, path: str, body: bytes | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        conn.request(method, path, body=body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def error_of(body: bytes) -> str:
    return json.loads(body)["error"]


def _client_error(call_, *args, **kwargs) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call_(*args, **kwargs)
    return info.value


def _identity_infer(client, model: str, values: list[float]) -> np.ndarray:
    inp = httpclient.InferInput("INPUT0", [1, len(values)], "FP32")
    inp.set_data_from_numpy(np.array([values], np.float32))
    return client.infer(model, [inp]).as_numpy("OUTPUT0")


# ------------------------------------------------------------------ repository


def test_index_lists_loaded_and_unloaded_models(client, server):
    index = client.get_model_repository_index()
    assert {"name": "add_sub", "version": "1", "state": "READY"} in index
    assert any(entry.get("name") == "identity_fp32" and entry.get("state") != "READY" for entry in index)
    status, body = call(server, "POST", "/v2/repository/index", b'{"ready": true}')
    assert status == 200
    ready = json.loads(body)
    assert {e["name"] for e in ready} >= {"add_sub", "identity_int8"}
    assert all(e["state"] == "READY" for e in ready)


def test_load_infer_unload(client):
    client.load_model("identity_fp32")
    assert client.is_model_ready("identity_fp32")
    assert _identity_infer(client, "identity_fp32", [1.0, 2.0]).tolist() == [[1.0, 2.0]]
    client.unload_model("identity_fp32")
    assert not client.is_model_ready("identity_fp32")
    entries = [e for e in client.get_model_repository_index() if e["name"] == "identity_fp32"]
    assert entries == [{"name": "identity_fp32", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]
    error = _client_error(_identity_infer, client, "identity_fp32", [1.0])
    assert error.status() in ("400", "404")


def test_load_with_config_and_files(client, tmp_path: Path):
    model_file = tmp_path / "model.onnx"
    identity_onnx(model_file, "FP32", ["n"])
    config = json.dumps({
        "name": "uploaded", "backend": "onnxruntime", "max_batch_size": 0,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    })
    client.load_model("uploaded", config=config, files={"file:1/model.onnx": model_file.read_bytes()})
    try:
        inp = httpclient.InferInput("INPUT0", [3], "FP32")
        inp.set_data_from_numpy(np.array([1, 2, 3], np.float32))
        assert client.infer("uploaded", [inp]).as_numpy("OUTPUT0").tolist() == [1.0, 2.0, 3.0]
        assert client.get_model_config("uploaded")["max_batch_size"] == 0
    finally:
        client.unload_model("uploaded")


def test_load_errors(client, server):
    error = _client_error(client.load_model, "no_such_model")
    assert error.status() == "500"
    assert error.message() == "failed to load 'no_such_model', failed to poll from model repository"
    error = _client_error(client.load_model, "broken")
    assert error.status() == "400" and "broken" in error.message()
    status, body = call(server, "POST", "/v2/repository/models/x/load",
                        json.dumps({"parameters": {"file:1/model.onnx": "AAAA"}}).encode())
    assert status == 400 and "'config' parameter is required" in error_of(body)
    status, body = call(server, "POST", "/v2/repository/models/x/load", b'{"parameters": {"config": {"a": 1}}}')
    assert status == 400 and "Unable to parse parameter 'config'" in error_of(body)
    status, body = call(server, "POST", "/v2/repository/models/x/load",
                        b'{"parameters": {"config": "{}", "file:1/model.onnx": "%%%"}}')
    assert status == 400 and "Unable to decode base64 content of 'file:1/model.onnx'" in error_of(body)


def test_unload_parameters(client, server):
    status, body = call(server, "POST", "/v2/repository/models/identity_int8/unload",
                        b'{"parameters": {"unload_dependents": "yes"}}')
    assert status == 400 and error_of(body).startswith("Unable to parse 'unload_dependents'")
    assert client.is_model_ready("identity_int8")
    client.unload_model("identity_int8", unload_dependents=True)
    assert not client.is_model_ready("identity_int8")
    client.load_model("identity_int8")
    assert client.is_model_ready("identity_int8")
    client.unload_model("never_heard_of_it")


@pytest.mark.parametrize("path", ["/v2/repository/other/index", "/v2/repository/other/models/add_sub/load",
                                  "/v2/repository/other/models/add_sub/unload"])
def test_repository_name_in_path_is_501(server, path):
    status, body = call(server, "POST", path)
    assert status == 501 and error_of(body) == "'repository_name' specification is not supported"


# ------------------------------------------------------------------ system shared memory


@pytest.fixture()
def regions(client):
    made = []

    def make(name: str, size: int):
        key = f"/naiad_http_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        handle = shm.create_shared_memory_region(name, key, size)
        made.append(handle)
        client.register_system_shared_memory(name, key, size)
        return handle, key

    yield make
    client.unregister_system_shared_memory()
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def test_infer_through_system_shared_memory(client, regions):
    a = np.array([[1, 2, 3, 4]], np.int32)
    b = np.array([[10, 20, 30, 40]], np.int32)
    in_handle, in_key = regions("inputs", 32)
    out_handle, _ = regions("outputs", 32)
    shm.set_shared_memory_region(in_handle, [a, b])
    inputs = [httpclient.InferInput(f"INPUT{i}", [1, 4], "INT32") for i in (0, 1)]
    inputs[0].set_shared_memory("inputs", 16)
    inputs[1].set_shared_memory("inputs", 16, offset=16)
    outputs = [httpclient.InferRequestedOutput(f"OUTPUT{i}") for i in (0, 1)]
    outputs[0].set_shared_memory("outputs", 16)
    outputs[1].set_shared_memory("outputs", 16, offset=16)
    result = client.infer("add_sub", inputs, outputs=outputs)
    for i, expected in ((0, a + b), (1, a - b)):
        # as Triton: an output written to shared memory comes back with no parameters and no data
        assert result.get_output(f"OUTPUT{i}") == {"name": f"OUTPUT{i}", "datatype": "INT32", "shape": [1, 4]}
        got = shm.get_contents_as_numpy(out_handle, np.int32, [1, 4], offset=16 * i)
        np.testing.assert_array_equal(got, expected)
    # One output in shared memory, the other in binary: only the binary one has parameters.
    mixed = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1", binary_data=True)]
    mixed[0].set_shared_memory("outputs", 16)
    result = client.infer("add_sub", inputs, outputs=mixed)
    assert result.get_output("OUTPUT0") == {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 4]}
    assert result.get_output("OUTPUT1")["parameters"] == {"binary_data_size": 16}
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    status = client.get_system_shared_memory_status("inputs")
    assert status == [{"name": "inputs", "key": in_key, "offset": 0, "byte_size": 32}]
    assert {r["name"] for r in client.get_system_shared_memory_status()} == {"inputs", "outputs"}


def test_shared_memory_errors(client, regions, server):
    _, key = regions("small", 8)
    error = _client_error(client.register_system_shared_memory, "small", key, 8)
    assert error.status() == "400" and "shared memory region 'small' already in manager" in error.message()
    error = _client_error(client.get_system_shared_memory_status, "missing")
    assert error.status() == "400" and "Unable to find system shared memory region: 'missing'" in error.message()
    error = _client_error(client.register_system_shared_memory, "r", "/naiad_no_such_key_zz", 8)
    assert error.status() == "400"
    a = np.ones((1, 4), np.int32)
    inputs = [httpclient.InferInput(f"INPUT{i}", [1, 4], "INT32") for i in (0, 1)]
    for inp in inputs:
        inp.set_data_from_numpy(a)
    out = httpclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("small", 8)
    error = _client_error(client.infer, "add_sub", inputs, outputs=[out])
    assert error.status() == "400" and "OUTPUT0" in error.message()
    inputs[0].set_shared_memory("nowhere", 16)
    error = _client_error(client.infer, "add_sub", inputs)
    assert error.status() == "400" and "Unable to find shared memory region: 'nowhere'" in error.message()
    status, body = call(server, "POST", "/v2/systemsharedmemory/region/x/register", b'{"key": "/k"}')
    assert status == 400 and error_of(body) == "Shared memory register request has no 'byte_size' field"
    status, body = call(server, "POST", "/v2/systemsharedmemory/region/x/unregister")
    assert status == 200


def test_client_shm_disabled(tmp_path: Path):
    repo = tmp_path / "models"
    identity_model(repo, "identity_fp32", "FP32", [-1])
    with start_server(repo, "--allow-client-shm=false") as running:
        client = httpclient.InferenceServerClient(running.http_url)
        try:
            assert client.get_system_shared_memory_status() == []
            error = _client_error(client.register_system_shared_memory, "r", "/whatever", 8)
            assert error.status() == "501"
            assert error.message() == (
                "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
            )
            assert _identity_infer(client, "identity_fp32", [4.0]).tolist() == [[4.0]]
        finally:
            client.close()


def test_shared_memory_output_json_shape(server, regions):
    """A plain JSON request with one output to shared memory: the raw response document, as Triton writes it."""
    in_handle, _ = regions("json_in", 32)
    out_handle, _ = regions("json_out", 16)
    shm.set_shared_memory_region(in_handle, [np.array([[5, 6, 7, 8]], np.int32)])
    doc = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 4],
             "parameters": {"shared_memory_region": "json_in", "shared_memory_byte_size": 16}},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 4], "data": [1, 1, 1, 1]},
        ],
        "outputs": [
            {"name": "OUTPUT0", "parameters": {"shared_memory_region": "json_out", "shared_memory_byte_size": 16}},
            {"name": "OUTPUT1"},
        ],
    }
    status, body = call(server, "POST", "/v2/models/add_sub/infer", json.dumps(doc).encode())
    assert status == 200, body
    assert json.loads(body)["outputs"] == [
        {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 4]},
        {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 4], "data": [4, 5, 6, 7]},
    ]
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.int32, [1, 4]), [[6, 7, 8, 9]])
