"""Restricted API groups over HTTP and gRPC, probed without and with the key, against the real server."""

from __future__ import annotations

import http.client
import json

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from naiad.frontends.security import API_GROUPS
from tests.support.onnx_models import add_sub_model
from tests.support.servers import start_server

INFER_BODY = {
    "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [2.0] * 16},
    ]
}

# One request per endpoint, grouped as tritonserver groups them.
HTTP_PROBES = [
    ("health", "GET", "/v2/health/live", None),
    ("health", "GET", "/v2/health/ready", None),
    ("health", "GET", "/v2/models/add_sub/ready", None),
    ("health", "GET", "/v2/models/add_sub/versions/1/ready", None),
    ("metadata", "GET", "/v2", None),
    ("metadata", "GET", "/v2/models/add_sub", None),
    ("inference", "POST", "/v2/models/add_sub/infer", INFER_BODY),
    ("inference", "POST", "/v2/models/add_sub/versions/1/infer", INFER_BODY),
    ("model-config", "GET", "/v2/models/add_sub/config", None),
    ("statistics", "GET", "/v2/models/stats", None),
    ("statistics", "GET", "/v2/models/add_sub/stats", None),
    ("model-repository", "POST", "/v2/repository/index", {}),
    ("model-repository", "POST", "/v2/repository/models/add_sub/load", {}),
    ("shared-memory", "GET", "/v2/systemsharedmemory/status", None),
    ("shared-memory", "POST", "/v2/systemsharedmemory/unregister", None),
    ("trace", "GET", "/v2/trace/setting", None),
    ("trace", "GET", "/v2/models/add_sub/trace/setting", None),
    ("logging", "GET", "/v2/logging", None),
]


def _key(group: str) -> str:
    return f"key-{group}"


def _value(group: str) -> str:
    return f"secret-{group}"


@pytest.fixture(scope="module")
def restricted(tmp_path_factory):
    """Every group restricted to its own key, over both protocols (explicit mode so load is allowed)."""
    repo = tmp_path_factory.mktemp("restricted")
    add_sub_model(repo, "add_sub")
    args = ["--model-control-mode=explicit", "--load-model=add_sub"]
    for group in API_GROUPS:
        args += [f"--http-restricted-api={group}:{_key(group)}={_value(group)}",
                 f"--grpc-restricted-protocol={group}:{_key(group)}={_value(group)}"]
    with start_server(repo, *args) as server:
        yield server


def _http(server, method: str, path: str, body=None, headers: dict | None = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    payload = json.dumps(body).encode() if body is not None else None
    connection.request(method, path, body=payload, headers=headers or {})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, data


@pytest.mark.parametrize("group,method,path,body", HTTP_PROBES, ids=[p[2] for p in HTTP_PROBES])
def test_http_restricted_endpoint_needs_its_header(restricted, group, method, path, body):
    status, data = _http(restricted, method, path, body)
    assert status == 403
    assert json.loads(data) == {"error": f"This API is restricted, expecting header '{_key(group)}'"}
    status, _ = _http(restricted, method, path, body, {_key(group): "wrong"})
    assert status == 403
    other = next(g for g in API_GROUPS if g != group)
    status, _ = _http(restricted, method, path, body, {_key(other): _value(other)})
    assert status == 403, "another group's key must not open this group"
    status, data = _http(restricted, method, path, body, {_key(group).upper(): _value(group)})
    assert status == 200, data


def test_http_unknown_paths_stay_404_under_restrictions(restricted):
    status, data = _http(restricted, "GET", "/v2/nothing/here")
    assert status == 404 and json.loads(data) == {"error": "Not Found"}


def test_tritonclient_http_passes_the_key_as_a_header(restricted):
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(restricted.http_url)
    with pytest.raises(InferenceServerException) as info:
        client.get_model_repository_index()
    assert "This API is restricted, expecting header 'key-model-repository'" in str(info.value)
    index = client.get_model_repository_index(headers={"key-model-repository": "secret-model-repository"})
    assert [entry["name"] for entry in index] == ["add_sub"]
    client.close()


# ---------------------------------------------------------------- gRPC


def _grpc_probes():
    infer = pb.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        tensor = infer.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        tensor.contents.fp32_contents.extend([1.0] * 16)
    return [
        ("health", "ServerLive", pb.ServerLiveRequest()),
        ("health", "ServerReady", pb.ServerReadyRequest()),
        ("health", "ModelReady", pb.ModelReadyRequest(name="add_sub")),
        ("metadata", "ServerMetadata", pb.ServerMetadataRequest()),
        ("metadata", "ModelMetadata", pb.ModelMetadataRequest(name="add_sub")),
        ("inference", "ModelInfer", infer),
        ("inference", "ModelStreamInfer", infer),
        ("model-config", "ModelConfig", pb.ModelConfigRequest(name="add_sub")),
        ("statistics", "ModelStatistics", pb.ModelStatisticsRequest(name="add_sub")),
        ("model-repository", "RepositoryIndex", pb.RepositoryIndexRequest()),
        ("model-repository", "RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="add_sub")),
        ("shared-memory", "SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest()),
        ("shared-memory", "CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest()),
        ("trace", "TraceSetting", pb.TraceSettingRequest()),
        ("logging", "LogSettings", pb.LogSettingsRequest()),
    ]


GRPC_PROBES = _grpc_probes()


def _call(channel: grpc.Channel, rpc: str, request, metadata):
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    if rpc == "ModelStreamInfer":
        responses = list(stub.ModelStreamInfer(iter([request]), metadata=metadata, timeout=30))
        assert len(responses) == 1 and not responses[0].error_message
        return responses[0]
    return getattr(stub, rpc)(request, metadata=metadata, timeout=30)


@pytest.mark.parametrize("group,rpc,request_message", GRPC_PROBES, ids=[p[1] for p in GRPC_PROBES])
def test_grpc_restricted_rpc_needs_its_metadata(restricted, group, rpc, request_message):
    header = f"triton-grpc-protocol-{_key(group)}"
    with grpc.insecure_channel(restricted.grpc_url) as channel:
        for metadata in ((), ((header, "wrong"),), ((_key(group), _value(group)),)):
            with pytest.raises(grpc.RpcError) as info:
                _call(channel, rpc, request_message, metadata)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert info.value.details() == f"This protocol is restricted, expecting header '{header}'"
        if rpc != "CudaSharedMemoryStatus":  # GPU-only: past the restriction the CPU build answers an error
            _call(channel, rpc, request_message, ((header, _value(group)),))


def test_grpc_health_check_service_is_in_the_health_group(restricted):
    check = "/grpc.health.v1.Health/Check"
    with grpc.insecure_channel(restricted.grpc_url) as channel:
        method = channel.unary_unary(check, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as info:
            method(b"", timeout=30)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        answer = method(b"", timeout=30, metadata=(("triton-grpc-protocol-key-health", "secret-health"),))
        assert answer == b"\x08\x01"  # SERVING


def test_tritonclient_grpc_passes_the_key_as_metadata(restricted):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(restricted.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        client.get_server_metadata()
    assert "This protocol is restricted, expecting header 'triton-grpc-protocol-key-metadata'" in str(info.value)
    metadata = client.get_server_metadata(headers={"triton-grpc-protocol-key-metadata": "secret-metadata"})
    assert metadata.name == "triton"
    client.close()


def test_bad_restriction_flags_are_refused_at_start(tmp_path):
    import subprocess
    import sys

    for flag, message in (
        ("--http-restricted-api=everything:k=v", "unknown restricted API 'everything'"),
        ("--grpc-restricted-protocol=health", "option format is"),
        ("--http-restricted-api=health,health:k=v", "can not be specified in multiple config groups"),
    ):
        process = subprocess.run([sys.executable, "-m", "naiad", "serve", "--model-repository", str(tmp_path), flag],
                                 capture_output=True, text=True, timeout=60)
        assert process.returncode != 0 and message in process.stderr, process.stderr
