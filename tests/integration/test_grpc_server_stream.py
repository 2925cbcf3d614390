"""The real `naiad serve` over gRPC: ModelStreamInfer with tritonclient streams and raw bidi stubs."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tests.support.onnx_models import add_sub_model, identity_model
from tests.support.servers import RunningServer, start_server

WAIT = 30.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("grpc_stream") / "models"
    add_sub_model(repo, "add_sub")
    identity_model(repo, "identity_bytes", "BYTES", [-1])
    identity_model(repo, "identity_fp16", "FP16", [-1])
    with start_server(repo) as running:
        yield running


class Collector:
    """Stream callback target: results and errors in arrival order."""

    def __init__(self) -> None:
        self.items: queue.Queue[tuple[Any, Any]] = queue.Queue()

    def __call__(self, result: Any, error: Any) -> None:
        self.items.put((result, error))

    def next(self) -> tuple[Any, Any]:
        return self.items.get(timeout=WAIT)


def _add_sub_inputs(value: float) -> list[grpcclient.InferInput]:
    a = np.full((1, 16), value, dtype=np.float32)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        inp = grpcclient.InferInput(name, [1, 16], "FP32")
        inp.set_data_from_numpy(a)
        inputs.append(inp)
    return inputs


def _raw_request(request_id: str, value: float, model: str = "add_sub") -> pb.ModelInferRequest:
    a = np.full((1, 16), value, dtype=np.float32).tobytes()
    request = pb.ModelInferRequest(model_name=model, id=request_id, raw_input_contents=[a, a])
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
    return request


def test_stream_one_final_response_per_request(server: RunningServer) -> None:
    collector = Collector()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=collector)
        for i in range(20):
            client.async_stream_infer("add_sub", _add_sub_inputs(i), request_id=f"s{i}")
        got = [collector.next() for _ in range(20)]
        client.stop_stream()
    assert all(error is None for _, error in got)
    by_id = {result.get_response().id: result for result, _ in got}
    assert sorted(by_id) == sorted(f"s{i}" for i in range(20))
    for request_id, result in by_id.items():
        value = int(request_id[1:])
        response = result.get_response()
        assert response.parameters["triton_final_response"].bool_param is True
        assert (response.model_name, response.model_version) == ("add_sub", "1")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 2 * value, np.float32))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 16), np.float32))


def test_stream_bytes_fp16_and_empty_final_flag(server: RunningServer) -> None:
    collector = Collector()
    strings = np.array([[b"one", b"two", b""]], dtype=np.object_)
    halves = np.array([[0.5, -2.0]], dtype=np.float16)
    s_in = grpcclient.InferInput("INPUT0", [1, 3], "BYTES")
    s_in.set_data_from_numpy(strings)
    h_in = grpcclient.InferInput("INPUT0", [1, 2], "FP16")
    h_in.set_data_from_numpy(halves)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=collector)
        client.async_stream_infer("identity_bytes", [s_in], request_id="b", enable_empty_final_response=True)
        client.async_stream_infer("identity_fp16", [h_in], request_id="h")
        got = {r.get_response().id: r for r, e in (collector.next(), collector.next()) if e is None}
        client.stop_stream()
    assert got["b"].as_numpy("OUTPUT0").tolist() == strings.tolist()
    np.testing.assert_array_equal(got["h"].as_numpy("OUTPUT0"), halves)
    # non-decoupled: the single response is the final one; no extra empty response follows
    assert collector.items.empty()
    assert got["b"].get_response().parameters["triton_final_response"].bool_param is True


def test_stream_errors_arrive_on_callback_and_stream_stays_open(server: RunningServer) -> None:
    collector = Collector()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=collector)
        client.async_stream_infer("nope", _add_sub_inputs(1), request_id="e1")
        result, error = collector.next()
        assert result is None and isinstance(error, InferenceServerException)
        assert error.message() == "Request for unknown model: 'nope' is not found"
        bad = _add_sub_inputs(1)[:1]
        client.async_stream_infer("add_sub", bad, request_id="e2")
        _, error = collector.next()
        assert error.message().startswith("[request id: e2] expected 2 inputs but got 1 inputs for model 'add_sub'")
        client.async_stream_infer("add_sub", _add_sub_inputs(3), request_id="ok")
        result, error = collector.next()
        assert error is None
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 6, np.float32))
        client.stop_stream()


def _stream_by_id(stub: pb_grpc.GRPCInferenceServiceStub, *requests: pb.ModelInferRequest) -> dict:
    """Send requests on one stream; its responses by request id."""
    return {r.infer_response.id: r for r in stub.ModelStreamInfer(iter(requests))}


def test_stream_error_message_identifies_request(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    bad = _raw_request("bad", 1)
    bad.model_version = "1"
    bad.inputs[0].datatype = "FP99"
    by_id = _stream_by_id(stub, bad, _raw_request("good", 2))
    assert set(by_id) == {"bad", "good"}
    assert by_id["bad"].error_message == "invalid datatype 'FP99' for input 'INPUT0'"
    assert (by_id["bad"].infer_response.model_name, by_id["bad"].infer_response.model_version) == ("add_sub", "1")
    assert len(by_id["bad"].infer_response.raw_output_contents) == 0
    assert by_id["good"].error_message == ""
    assert len(by_id["good"].infer_response.raw_output_contents) == 2


def test_stream_unknown_model_is_reported_before_its_tensors(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    unknown = _raw_request("unknown", 1)
    unknown.model_name = "nope"
    unknown.inputs[0].datatype = "FP99"
    by_id = _stream_by_id(stub, unknown, _raw_request("good", 2))
    assert by_id["unknown"].error_message == "Request for unknown model: 'nope' is not found"
    assert by_id["good"].error_message == ""  # the stream goes on


def test_stream_half_close_completes_in_flight_with_ok(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    requests = [_raw_request(f"h{i}", i) for i in range(64)]
    call = stub.ModelStreamInfer(iter(requests))
    ids = [r.infer_response.id for r in call]
    assert sorted(ids) == sorted(f"h{i}" for i in range(64))
    assert call.code() == grpc.StatusCode.OK


def test_stream_grpc_error_mode_ends_with_status(server: RunningServer) -> None:
    collector = Collector()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=collector, headers={"triton_grpc_error": "true"})
        client.async_stream_infer("add_sub", _add_sub_inputs(1), request_id="first")
        result, error = collector.next()
        assert error is None and result.get_response().id == "first"
        client.async_stream_infer("nope", _add_sub_inputs(1), request_id="second")
        result, error = collector.next()
        assert result is None
        assert error.status() == "StatusCode.NOT_FOUND"
        assert error.message() == "Request for unknown model: 'nope' is not found"
        client.stop_stream()


def test_stream_reserved_parameters(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    reserved = _raw_request("r1", 1)
    reserved.parameters["triton_other"].bool_param = True
    wrong_flag = _raw_request("r2", 1)
    wrong_flag.parameters["triton_enable_empty_final_response"].int64_param = 1
    allowed = _raw_request("r3", 1)
    allowed.parameters["triton_enable_empty_final_response"].bool_param = False
    by_id = {r.infer_response.id: r for r in stub.ModelStreamInfer(iter([reserved, wrong_flag, allowed]))}
    assert by_id["r1"].error_message == (
        "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys "
        "starting with 'triton_' are allowed: triton_enable_empty_final_response"
    )
    assert by_id["r2"].error_message == (
        "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param."
    )
    assert by_id["r3"].error_message == ""


def test_many_streams_then_unary_still_works(server: RunningServer, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    calls = [stub.ModelStreamInfer(iter([_raw_request(f"m{n}-{i}", i) for i in range(5)])) for n in range(8)]
    for call in calls:
        assert len(list(call)) == 5
    cancelled = stub.ModelStreamInfer(iter([_raw_request("c", 1)]))
    cancelled.cancel()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        result = client.infer("add_sub", _add_sub_inputs(4))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 8, np.float32))
