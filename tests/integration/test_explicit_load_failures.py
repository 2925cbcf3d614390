"""The real server in explicit mode: a failed load says why (HTTP and gRPC) and follows Triton's readiness rules.

Triton 2.51, probed: a config it cannot read (bad JSON, bad field, wrong name) fails like a repository poll (500,
no version state, readiness unchanged); a config that reads but cannot load (e.g. KIND_GPU on a CPU machine)
fails with 400 and the version's reason. A failed reload keeps the loaded version serving and the server ready;
a failed first load leaves an UNAVAILABLE version, which makes the server not ready until it loads.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from tests.support.onnx_models import add_sub_model
from tests.support.servers import RunningServer, post_json, start_server

ADD_SUB_JSON = {
    "backend": "onnxruntime", "max_batch_size": 8,
    "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [16]} for n in ("INPUT0", "INPUT1")],
    "output": [{"name": n, "data_type": "TYPE_FP32", "dims": [16]} for n in ("OUTPUT0", "OUTPUT1")],
}
GPU_JSON = json.dumps({**ADD_SUB_JSON, "instance_group": [{"kind": "KIND_GPU"}]})
UNREADABLE = {
    "not JSON": ("{", "Failed to load JSON"),
    "unknown datatype": (json.dumps({**ADD_SUB_JSON, "input": [{"name": "INPUT0", "data_type": "TYPE_BOGUS"}]}), "TYPE_BOGUS"),
    "negative max_batch_size": (json.dumps({**ADD_SUB_JSON, "max_batch_size": -1}), "max_batch_size"),
    "another name": (json.dumps({**ADD_SUB_JSON, "name": "other"}), "does not match"),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("explicit_failures") / "models"
    for name in ("simple", "fresh", "fresh_gpu"):
        add_sub_model(repo, name)
    with start_server(repo, "--model-control-mode=explicit", "--load-model=simple") as running:
        yield running


def _load(server: RunningServer, name: str, config: str) -> tuple[int, str]:
    status, body = post_json(f"http://{server.http_url}/v2/repository/models/{name}/load", {"parameters": {"config": config}})
    return status, json.loads(body)["error"] if body else ""


def _http_ready(server: RunningServer) -> bool:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=30) as reply:
            return reply.status == 200
    except urllib.error.HTTPError as exc:
        assert exc.code == 400
        return False


def _ready_everywhere(server: RunningServer) -> bool:
    """Server readiness over HTTP and gRPC, which must agree."""
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        grpc_ready = client.is_server_ready()
    http_ready = _http_ready(server)
    assert grpc_ready == http_ready
    return http_ready


def _index(server: RunningServer, name: str) -> list[dict]:
    status, body = post_json(f"http://{server.http_url}/v2/repository/index", {})
    assert status == 200
    return [entry for entry in json.loads(body) if entry["name"] == name]


def _infer_ok(server: RunningServer, name: str) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    a, b = np.full((1, 16), 3, np.float32), np.ones((1, 16), np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    assert client.infer(name, inputs).as_numpy("OUTPUT0").tolist() == (a + b).tolist()


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_unreadable_override_of_a_loaded_model_says_why_and_keeps_it(server: RunningServer, case: str) -> None:
    config, detail = UNREADABLE[case]
    status, error = _load(server, "simple", config)
    assert status == 500
    assert error.startswith("failed to load 'simple', failed to poll from model repository: ")
    assert detail in error
    assert _index(server, "simple") == [{"name": "simple", "version": "1", "state": "READY"}]
    assert _ready_everywhere(server)
    _infer_ok(server, "simple")


def test_failed_reload_of_a_loaded_model_gives_the_version_reason(server: RunningServer) -> None:
    status, error = _load(server, "simple", GPU_JSON)
    assert status == 400
    assert error.startswith("load failed for model 'simple': version 1 is at UNAVAILABLE state: Invalid argument: ")
    assert "KIND_GPU" in error and error.endswith(";\n")
    assert _index(server, "simple") == [{"name": "simple", "version": "1", "state": "READY"}]
    assert _ready_everywhere(server)
    _infer_ok(server, "simple")


def test_grpc_load_failures_carry_the_reason(server: RunningServer) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for config, code, prefix, detail in (
            ("{", grpc.StatusCode.INTERNAL, "failed to load 'simple', failed to poll from model repository: ", "Failed to load JSON"),
            (GPU_JSON, grpc.StatusCode.INVALID_ARGUMENT, "load failed for model 'simple': version 1 is at UNAVAILABLE state: ",
             "KIND_GPU"),
        ):
            request = pb.RepositoryModelLoadRequest(model_name="simple")
            request.parameters["config"].string_param = config
            with pytest.raises(grpc.RpcError) as info:
                stub.RepositoryModelLoad(request, timeout=60)
            assert info.value.code() == code
            assert info.value.details().startswith(prefix) and detail in info.value.details()
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=30).ready is True
    _infer_ok(server, "simple")


def test_unreadable_override_of_a_model_never_loaded_leaves_the_server_ready(server: RunningServer) -> None:
    for config, detail in UNREADABLE.values():
        status, error = _load(server, "fresh", config)
        assert status == 500 and detail in error
        assert _index(server, "fresh") == [{"name": "fresh"}]
        assert _ready_everywhere(server)


def test_failed_first_load_makes_the_server_not_ready_until_it_loads(server: RunningServer) -> None:
    status, error = _load(server, "fresh_gpu", GPU_JSON)
    assert status == 400 and "KIND_GPU" in error
    [entry] = _index(server, "fresh_gpu")
    assert entry["state"] == "UNAVAILABLE" and "KIND_GPU" in entry["reason"]
    assert not _ready_everywhere(server)
    status, error = _load(server, "fresh_gpu", json.dumps(ADD_SUB_JSON))
    assert (status, error) == (200, "")
    assert _ready_everywhere(server)
    _infer_ok(server, "fresh_gpu")
