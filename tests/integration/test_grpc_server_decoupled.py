"""The real `naiad serve` over gRPC with a decoupled Python model: several responses per stream request."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tests.support.python_models import write_counter_model
from tests.support.servers import RunningServer, start_server

WAIT = 30.0

@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo: Path = tmp_path_factory.mktemp("grpc_decoupled") / "models"
    write_counter_model(repo)
    with start_server(repo) as running:
        yield running


def _count_input(count: int) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("COUNT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([count], dtype=np.int32))
    return tensor


def _raw(request_id: str, count: int, empty_final: bool = False) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(
        model_name="counter", id=request_id, raw_input_contents=[np.array([count], "<i4").tobytes()]
    )
    request.inputs.add(name="COUNT", datatype="INT32", shape=[1])
    if empty_final:
        request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request


def test_unary_infer_refuses_decoupled_model(server: RunningServer) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.get_model_config("counter").config.model_transaction_policy.decoupled is True
        with pytest.raises(InferenceServerException) as info:
            client.infer("counter", [_count_input(2)])
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    assert info.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"


def test_stream_many_responses_per_request(server: RunningServer) -> None:
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer("counter", [_count_input(4)], request_id="four", enable_empty_final_response=True)
        client.async_stream_infer("counter", [_count_input(0)], request_id="zero", enable_empty_final_response=True)
        client.async_stream_infer("counter", [_count_input(2)], request_id="two")
        got: dict[str, list] = {"four": [], "zero": [], "two": []}
        for _ in range(4 + 1 + 1 + 2):
            result, error = results.get(timeout=WAIT)
            assert error is None, error
            response = result.get_response()
            value = int(result.as_numpy("VALUE")[0]) if response.outputs else None
            got[response.id].append((value, response.parameters["triton_final_response"].bool_param))
        client.stop_stream()
    assert results.empty()
    assert got["four"] == [(0, False), (1, False), (2, False), (3, False), (None, True)]
    assert got["zero"] == [(None, True)]
    assert got["two"] == [(0, False), (1, False)]


def test_stream_decoupled_error_response_keeps_stream(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    responses = list(stub.ModelStreamInfer(iter([_raw("bad", -3), _raw("one", 1, empty_final=True)])))
    errors = [(r.infer_response.id, r.error_message) for r in responses if r.error_message]
    assert errors == [("bad", "count must not be negative, got -3")]
    ok = [r.infer_response for r in responses if not r.error_message]
    assert [(r.id, len(r.outputs), r.parameters["triton_final_response"].bool_param) for r in ok] == [
        ("one", 1, False), ("one", 0, True)
    ]
    empty_final = ok[-1]
    assert (empty_final.model_name, empty_final.model_version) == ("counter", "1")


def test_stream_decoupled_error_in_grpc_error_mode(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    call = stub.ModelStreamInfer(iter([_raw("bad", -1)]), metadata=(("triton_grpc_error", "true"),))
    with pytest.raises(grpc.RpcError) as info:
        list(call)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert info.value.details() == "count must not be negative, got -1"
