"""The real `naiad serve --model-control-mode=explicit` over gRPC: index, load (config and file overrides), unload."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from tests.support.onnx_models import add_sub_model, identity_model, identity_onnx
from tests.support.servers import RunningServer, start_server
from tests.support.servers import client_error as _client_error


@pytest.fixture(scope="module")
def onnx_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("grpc_override") / "model.onnx"
    identity_onnx(path, "INT32", ["batch", 3])
    return path.read_bytes()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("grpc_repo") / "models"
    add_sub_model(repo, "add_sub")
    identity_model(repo, "identity_fp32", "FP32", [-1])
    identity_model(repo, "identity_int8", "INT8", [-1])
    with start_server(repo, "--model-control-mode=explicit", "--load-model=add_sub") as running:
        yield running


@pytest.fixture()
def client(grpc_client: grpcclient.InferenceServerClient) -> grpcclient.InferenceServerClient:
    return grpc_client


def _rpc_error(call: Any, *args: Any, **kwargs: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return info.value


def _index(client: grpcclient.InferenceServerClient) -> dict[str, dict]:
    return {m["name"]: m for m in client.get_model_repository_index(as_json=True).get("models", [])}


def _identity(client: grpcclient.InferenceServerClient, model: str, array: np.ndarray, datatype: str) -> np.ndarray:
    inp = grpcclient.InferInput("INPUT0", list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return client.infer(model, [inp]).as_numpy("OUTPUT0")


def test_index_lists_loaded_and_unloaded_models(client: grpcclient.InferenceServerClient,
                                                stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    index = _index(client)
    assert index["add_sub"] == {"name": "add_sub", "version": "1", "state": "READY"}
    assert index["identity_int8"] == {"name": "identity_int8"}
    ready = stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True))
    assert all(m.state == "READY" for m in ready.models)
    assert "identity_int8" not in {m.name for m in ready.models}


def test_load_infer_unload(client: grpcclient.InferenceServerClient) -> None:
    client.load_model("identity_fp32")
    assert client.is_model_ready("identity_fp32") is True
    x = np.array([[1.5, -2.0]], dtype=np.float32)
    np.testing.assert_array_equal(_identity(client, "identity_fp32", x, "FP32"), x)
    client.unload_model("identity_fp32", unload_dependents=True)
    assert client.is_model_ready("identity_fp32") is False
    err = _client_error(client.get_model_metadata, "identity_fp32")
    assert err.status() == "StatusCode.NOT_FOUND"
    assert err.message() == "Request for unknown model: 'identity_fp32' has no available versions"
    assert _index(client)["identity_fp32"] == {
        "name": "identity_fp32", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"
    }
    client.unload_model("never_heard_of_it")


def test_load_with_config_and_file_overrides(client: grpcclient.InferenceServerClient, onnx_bytes: bytes) -> None:
    config = {
        "name": "from_bytes",
        "backend": "onnxruntime",
        "max_batch_size": 4,
        "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [3]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [3]}],
    }
    client.load_model("from_bytes", config=json.dumps(config), files={"file:1/model.onnx": onnx_bytes})
    assert client.is_model_ready("from_bytes") is True
    assert client.get_model_config("from_bytes").config.max_batch_size == 4
    x = np.array([[7, 8, 9]], dtype=np.int32)
    np.testing.assert_array_equal(_identity(client, "from_bytes", x, "INT32"), x)
    client.unload_model("from_bytes")


def test_load_errors(client: grpcclient.InferenceServerClient, stub: pb_grpc.GRPCInferenceServiceStub,
                     onnx_bytes: bytes) -> None:
    err = _client_error(client.load_model, "no_such_model")
    assert err.status() == "StatusCode.INTERNAL"
    assert err.message() == "failed to load 'no_such_model', failed to poll from model repository"
    request = pb.RepositoryModelLoadRequest(model_name="x")
    request.parameters["file:1/model.onnx"].bytes_param = onnx_bytes
    err = _rpc_error(stub.RepositoryModelLoad, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "the 'config' parameter is required when 'file:' overrides are given" in err.details()
    request = pb.RepositoryModelLoadRequest(model_name="identity_int8")
    request.parameters["config"].bytes_param = b"{}"
    err = _rpc_error(stub.RepositoryModelLoad, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "invalid value type for load parameter 'config', expected string_param."
    request = pb.RepositoryModelLoadRequest(repository_name="other", model_name="identity_int8")
    err = _rpc_error(stub.RepositoryModelLoad, request)
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED
    assert err.details() == "'repository_name' specification is not supported"
    unload = pb.RepositoryModelUnloadRequest(model_name="add_sub")
    unload.parameters["unload_dependents"].int64_param = 1
    err = _rpc_error(stub.RepositoryModelUnload, unload)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "invalid value type for 'unload_dependents' parameter, expected bool_param."
    assert client.is_model_ready("add_sub") is True
