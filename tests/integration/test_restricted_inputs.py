"""Untrusted names and headers: path traversal in model names and `file:` overrides refused over HTTP and
gRPC, model control closed unless enabled, header forwarding into request parameters."""

from __future__ import annotations

import base64
import http.client
import json
import queue
from functools import partial
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tests.support.onnx_models import add_sub_model
from tests.support.python_models import write_params_model
from tests.support.servers import start_server

ADD_SUB_CONFIG_JSON = json.dumps({
    "backend": "onnxruntime", "max_batch_size": 8,
    "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [16]} for n in ("INPUT0", "INPUT1")],
    "output": [{"name": n, "data_type": "TYPE_FP32", "dims": [16]} for n in ("OUTPUT0", "OUTPUT1")],
})


@pytest.fixture(scope="module")
def explicit(tmp_path_factory):
    root = tmp_path_factory.mktemp("traversal")
    repo = root / "repo"
    add_sub_model(repo, "add_sub")
    write_params_model(repo)
    with start_server(
        repo, "--model-control-mode=explicit", "--load-model=*",
        "--http-header-forward-pattern=X-FWD-|^triton_|^priority$",
        "--grpc-header-forward-pattern=(?-i)^x-fwd-|^triton_|^sequence_id$",
    ) as server:
        yield server, root


def _raw(server, method: str, path: str, body: bytes | None = None) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, (json.loads(data) if data else {})


BAD_SEGMENTS = ["..", "..%2F..%2Fetc", "a%2Fb", "a%00b", "..%5C..%5Cwindows", "%2E%2E"]


@pytest.mark.parametrize("segment", BAD_SEGMENTS)
@pytest.mark.parametrize("method,template", [
    ("POST", "/v2/repository/models/{}/load"),
    ("POST", "/v2/repository/models/{}/unload"),
    ("GET", "/v2/models/{}"),
    ("GET", "/v2/models/{}/ready"),
    ("GET", "/v2/models/{}/config"),
    ("GET", "/v2/models/{}/stats"),
    ("GET", "/v2/models/{}/versions/1/config"),
    ("POST", "/v2/models/{}/infer"),
    ("POST", "/v2/models/{}/generate"),
    ("GET", "/v2/models/{}/trace/setting"),
])
def test_http_model_names_that_escape_the_repository_are_400(explicit, segment, method, template):
    server, _ = explicit
    body = b"{}" if method == "POST" else None
    status, doc = _raw(server, method, template.format(segment), body)
    assert status == 400, doc
    assert doc["error"].startswith("invalid model name")


def test_http_file_override_outside_the_model_directory_is_refused(explicit):
    server, root = explicit
    client = httpclient.InferenceServerClient(server.http_url)
    model = (root / "repo" / "add_sub" / "1" / "model.onnx").read_bytes()
    for key in ("file:../../escape_http.txt", "file:/tmp/escape_http_abs.txt", "file:1/../../escape_http.txt"):
        with pytest.raises(InferenceServerException) as info:
            client.load_model("override_http", config=ADD_SUB_CONFIG_JSON, files={"file:1/model.onnx": model, key: b"x"})
        assert info.value.status() == "400" and "invalid file override path" in str(info.value)
    assert not list(root.rglob("escape_http*"))
    assert not Path("/tmp/escape_http_abs.txt").exists()
    # the same load without the bad entry works: the refusal is about the path only
    client.load_model("override_http", config=ADD_SUB_CONFIG_JSON, files={"file:1/model.onnx": model})
    assert client.is_model_ready("override_http")
    client.unload_model("override_http")
    client.close()


def test_http_load_of_a_traversal_name_with_files_writes_nothing(explicit):
    server, root = explicit
    body = json.dumps({"parameters": {"config": ADD_SUB_CONFIG_JSON, "file:1/model.onnx": base64.b64encode(b"x").decode()}})
    status, doc = _raw(server, "POST", "/v2/repository/models/..%2F..%2Fplanted/load", body.encode())
    assert status == 400 and "invalid model name" in doc["error"]
    assert not list(root.rglob("planted"))


GRPC_BAD_NAMES = ["..", "../etc", "a/b", "a\x00b", "..\\x"]


@pytest.mark.parametrize("name", GRPC_BAD_NAMES, ids=["dotdot", "up", "slash", "nul", "backslash"])
def test_grpc_model_names_that_escape_the_repository_are_invalid(explicit, name):
    server, _ = explicit
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for call, request in (
            (stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name=name)),
            (stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(model_name=name)),
            (stub.ModelMetadata, pb.ModelMetadataRequest(name=name)),
            (stub.ModelConfig, pb.ModelConfigRequest(name=name)),
            (stub.ModelReady, pb.ModelReadyRequest(name=name)),
            (stub.ModelStatistics, pb.ModelStatisticsRequest(name=name)),
            (stub.ModelInfer, pb.ModelInferRequest(model_name=name)),
            (stub.TraceSetting, pb.TraceSettingRequest(model_name=name)),
        ):
            with pytest.raises(grpc.RpcError) as info:
                call(request, timeout=30)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, call
            assert "invalid model name" in info.value.details()
        responses = list(stub.ModelStreamInfer(iter([pb.ModelInferRequest(model_name=name, id="r1")]), timeout=30))
        assert len(responses) == 1 and "invalid model name" in responses[0].error_message
        assert responses[0].infer_response.id == "r1"


def test_grpc_file_override_outside_the_model_directory_is_refused(explicit):
    server, root = explicit
    client = grpcclient.InferenceServerClient(server.grpc_url)
    model = (root / "repo" / "add_sub" / "1" / "model.onnx").read_bytes()
    with pytest.raises(InferenceServerException) as info:
        client.load_model("override_grpc", config=ADD_SUB_CONFIG_JSON,
                          files={"file:1/model.onnx": model, "file:../../escape_grpc.txt": b"x"})
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "invalid file override path" in str(info.value)
    assert not list(root.rglob("escape_grpc*"))
    client.close()


def test_model_control_is_closed_unless_explicit(tmp_path):
    add_sub_model(tmp_path, "add_sub")
    with start_server(tmp_path) as server:  # --model-control-mode none (the default)
        status, doc = _raw(server, "POST", "/v2/repository/models/add_sub/unload", b"{}")
        assert status == 503 and "not allowed" in doc["error"]
        client = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException) as info:
            client.load_model("add_sub")
        assert info.value.status() == "StatusCode.UNAVAILABLE"
        assert client.is_model_ready("add_sub")
        client.close()


# ---------------------------------------------------------------- header forwarding


def _params_input(module):
    tensor = module.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    return [tensor]


def _params(result) -> dict:
    return json.loads(result.as_numpy("PARAMS")[0])


def test_http_headers_matching_the_pattern_become_parameters(explicit):
    server, _ = explicit
    client = httpclient.InferenceServerClient(server.http_url)
    headers = {"X-Fwd-Tenant": "acme", "x-fwd-trace": "t-1", "X-Other": "no",
               "triton_secret": "no", "priority": "9"}
    result = client.infer("params", _params_input(httpclient), headers=headers, parameters={"mine": "body"})
    assert _params(result) == {"mine": "body", "x-fwd-tenant": "acme", "x-fwd-trace": "t-1"}
    client.close()


def test_http_forwarded_header_never_replaces_a_body_parameter(explicit):
    server, _ = explicit
    client = httpclient.InferenceServerClient(server.http_url)
    result = client.infer("params", _params_input(httpclient), headers={"x-fwd-a": "header"}, parameters={"x-fwd-a": "body"})
    assert _params(result) == {"x-fwd-a": "body"}
    client.close()


def test_grpc_metadata_matching_the_pattern_becomes_parameters(explicit):
    server, _ = explicit
    client = grpcclient.InferenceServerClient(server.grpc_url)
    headers = {"x-fwd-tenant": "acme", "x-other": "no", "triton_secret": "no", "sequence_id": "7"}
    result = client.infer("params", _params_input(grpcclient), headers=headers)
    assert _params(result) == {"x-fwd-tenant": "acme"}
    client.close()


def test_grpc_stream_metadata_is_forwarded_to_every_request(explicit):
    server, _ = explicit
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put(error or result), results),
                        headers={"x-fwd-tenant": "stream"})
    for _ in range(2):
        client.async_stream_infer("params", _params_input(grpcclient))
    seen = [results.get(timeout=30) for _ in range(2)]
    client.stop_stream()
    client.close()
    assert all(_params(result) == {"x-fwd-tenant": "stream"} for result in seen), seen


def test_without_a_pattern_nothing_is_forwarded(tmp_path):
    write_params_model(tmp_path)
    with start_server(tmp_path) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        result = client.infer("params", _params_input(httpclient), headers={"x-fwd-tenant": "acme"})
        assert _params(result) == {}
        client.close()
