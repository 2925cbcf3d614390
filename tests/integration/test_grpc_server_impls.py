"""Both gRPC server implementations (`--grpc-server-impl naiad|grpcio`) serve the same calls alike:
unary infer, a stream, the health service and an error status."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from functools import partial

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.support.onnx_models import add_sub_model
from tests.support.servers import RunningServer, start_server


@pytest.fixture(scope="module", params=["naiad", "grpcio"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp(f"impl_{request.param}")
    add_sub_model(repo, "add_sub")
    with start_server(repo, "--grpc-server-impl", request.param) as running:
        yield running


def _inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    tensors = [grpcclient.InferInput("INPUT0", [1, 16], "FP32"), grpcclient.InferInput("INPUT1", [1, 16], "FP32")]
    tensors[0].set_data_from_numpy(a)
    tensors[1].set_data_from_numpy(b)
    return tensors


def test_unary_and_stream_infer(server: RunningServer) -> None:
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.float32)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        result = client.infer("add_sub", _inputs(a, b))
        assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
        results: queue.Queue = queue.Queue()
        client.start_stream(callback=partial(lambda q, result, error: q.put(error or result), results))
        for i in range(3):
            client.async_stream_infer("add_sub", _inputs(a * i, b), request_id=str(i))
        got = {r.get_response().id: r.as_numpy("OUTPUT1") for r in (results.get(timeout=30) for _ in range(3))}
        client.stop_stream()
    assert sorted(got) == ["0", "1", "2"]
    assert np.array_equal(got["2"], a * 2 - b)


def test_health_and_errors(server: RunningServer) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        assert check(b"", timeout=10) == b"\x08\x01"
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as info:
            client.infer("nope", _inputs(np.ones((1, 16), np.float32), np.ones((1, 16), np.float32)))
        assert info.value.status() == "StatusCode.NOT_FOUND"
        assert client.is_server_ready(client_timeout=10)
