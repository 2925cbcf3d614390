"""The real `naiad serve` over gRPC: system shared-memory regions for inputs and outputs."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

from tests.support.onnx_models import add_sub_model
from tests.support.servers import RunningServer, start_server
from tests.support.servers import client_error as _client_error

BYTES = 64  # one [1,16] FP32 tensor


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("grpc_shm") / "models"
    add_sub_model(repo, "add_sub")
    return repo


@pytest.fixture(scope="module")
def server(repo) -> Iterator[RunningServer]:
    with start_server(repo) as running:
        yield running


@pytest.fixture()
def client(grpc_client: grpcclient.InferenceServerClient) -> grpcclient.InferenceServerClient:
    return grpc_client


@pytest.fixture()
def regions() -> Iterator[dict]:
    """An input region holding two tensors and an output region with room for two, under unique keys."""
    tag = f"{os.getpid()}_{uuid.uuid4().hex[:8]}"
    made = {
        "in": shm.create_shared_memory_region(f"in_{tag}", f"/naiad_in_{tag}", 2 * BYTES),
        "out": shm.create_shared_memory_region(f"out_{tag}", f"/naiad_out_{tag}", 2 * BYTES),
        "tag": tag,
    }
    yield made
    shm.destroy_shared_memory_region(made["in"])
    shm.destroy_shared_memory_region(made["out"])


def test_infer_through_shared_memory(client: grpcclient.InferenceServerClient, regions: dict) -> None:
    tag = regions["tag"]
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 10, dtype=np.float32)
    shm.set_shared_memory_region(regions["in"], [a, b])
    client.register_system_shared_memory(f"in_{tag}", f"/naiad_in_{tag}", 2 * BYTES)
    client.register_system_shared_memory(f"out_{tag}", f"/naiad_out_{tag}", 2 * BYTES)
    try:
        status = client.get_system_shared_memory_status(f"in_{tag}")
        region = status.regions[f"in_{tag}"]
        assert (region.name, region.key, region.offset, region.byte_size) == (f"in_{tag}", f"/naiad_in_{tag}", 0, 128)

        in0 = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        in0.set_shared_memory(f"in_{tag}", BYTES)
        in1 = grpcclient.InferInput("INPUT1", [1, 16], "FP32")
        in1.set_shared_memory(f"in_{tag}", BYTES, offset=BYTES)
        out0 = grpcclient.InferRequestedOutput("OUTPUT0")
        out0.set_shared_memory(f"out_{tag}", BYTES)
        out1 = grpcclient.InferRequestedOutput("OUTPUT1")  # this one comes back in the response
        result = client.infer("add_sub", [in0, in1], outputs=[out0, out1])
        response = result.get_response()
        assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
        shm_out = response.outputs[0]
        assert len(shm_out.parameters) == 0  # as Triton: the request's shm parameters are not echoed
        assert list(shm_out.shape) == [1, 16] and shm_out.datatype == "FP32"
        assert response.raw_output_contents[0] == b""
        np.testing.assert_array_equal(
            shm.get_contents_as_numpy(regions["out"], np.float32, [1, 16]), a + b
        )
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    finally:
        client.unregister_system_shared_memory(f"in_{tag}")
        client.unregister_system_shared_memory(f"out_{tag}")
    err = _client_error(client.get_system_shared_memory_status, f"in_{tag}")
    assert err.message() == f"Unable to find system shared memory region: 'in_{tag}'"


def test_shared_memory_errors(client: grpcclient.InferenceServerClient, regions: dict) -> None:
    tag = regions["tag"]
    client.register_system_shared_memory(f"in_{tag}", f"/naiad_in_{tag}", 2 * BYTES)
    try:
        err = _client_error(client.register_system_shared_memory, f"in_{tag}", f"/naiad_in_{tag}", BYTES)
        assert err.status() == "StatusCode.ALREADY_EXISTS"
        assert err.message() == f"shared memory region 'in_{tag}' already in manager"
        in0 = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        in0.set_shared_memory("no_such_region", BYTES)
        in1 = grpcclient.InferInput("INPUT1", [1, 16], "FP32")
        in1.set_data_from_numpy(np.ones((1, 16), np.float32))
        err = _client_error(client.infer, "add_sub", [in0, in1])
        assert err.status() == "StatusCode.INVALID_ARGUMENT"
        assert err.message() == "Unable to find shared memory region: 'no_such_region'"
        in0.set_shared_memory(f"in_{tag}", BYTES, offset=BYTES + 8)
        err = _client_error(client.infer, "add_sub", [in0, in1])
        assert err.status() == "StatusCode.INVALID_ARGUMENT"
        assert "exceeds the 128 bytes of region" in err.message()
    finally:
        client.unregister_system_shared_memory(f"in_{tag}")
    err = _client_error(client.register_system_shared_memory, f"x_{tag}", f"/naiad_missing_{tag}", BYTES)
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert f"Unable to open shared memory region: '/naiad_missing_{tag}'" in err.message()


def test_client_shm_disabled(repo, regions: dict) -> None:
    with start_server(repo, "--allow-client-shm=false") as running:
        with grpcclient.InferenceServerClient(running.grpc_url) as client:
            err = _client_error(client.register_system_shared_memory, "r", f"/naiad_in_{regions['tag']}", BYTES)
            assert err.status() == "StatusCode.UNIMPLEMENTED"
            assert err.message() == (
                "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
            )
            assert client.get_system_shared_memory_status(as_json=True) == {}
            in0 = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
            in0.set_shared_memory("r", BYTES)
            in1 = grpcclient.InferInput("INPUT1", [1, 16], "FP32")
            in1.set_data_from_numpy(np.ones((1, 16), np.float32))
            err = _client_error(client.infer, "add_sub", [in0, in1])
            assert err.status() == "StatusCode.UNIMPLEMENTED"
            assert client.is_server_ready() is True
