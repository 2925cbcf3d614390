"""The real `naiad serve`: requests cancelled by their client count once as failures with reason CANCELED."""

from __future__ import annotations

import json
import re
import socket
import threading
import urllib.request
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from tests.support.onnx_models import add_sub_model, slow_model
from tests.support.servers import RunningServer, client_error, start_server
from tests.support.waiting import wait_until

# A lone request waits this long for company: it is still queued when its client gives up.
QUEUED = "dynamic_batching { max_queue_delay_microseconds: 30000000 preferred_batch_size: [8] }"
MODELS = ("grpc_deadline", "grpc_stream", "http_gone")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("cancelled_counted") / "models"
    for name in MODELS:
        add_sub_model(repo, name, dims=4, scheduler=QUEUED)
    slow_model(repo, "grpc_executing", matmuls=240)  # about a second per execution
    with start_server(repo) as running:
        yield running


def _metric(server: RunningServer, family: str, model: str, reason: str | None = None) -> int:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    labels = f'model="{model}",reason="{reason}",version="1"' if reason else f'model="{model}",version="1"'
    match = re.search(rf"^{family}\{{{labels}\}} (\d+)", text, re.M)
    assert match is not None, text
    return int(match.group(1))


def _wait_for_pending(server: RunningServer, model: str, expected: int, timeout: float = 10.0) -> None:
    wait_until(lambda: _metric(server, "nv_inference_pending_request_count", model) == expected,
               f"pending requests of '{model}' to become {expected}", timeout)


def _assert_one_canceled_failure(server: RunningServer, model: str) -> None:
    """Once the server dropped the request: one CANCELED failure, no other, no success (metrics and statistics)."""
    _wait_for_pending(server, model, 0)
    wait_until(lambda: _metric(server, "nv_inference_request_failure", model, "CANCELED") != 0,
               f"the cancelled request of '{model}' to be counted", timeout=10)
    for reason, expected in (("CANCELED", 1), ("REJECTED", 0), ("BACKEND", 0), ("OTHER", 0)):
        assert _metric(server, "nv_inference_request_failure", model, reason) == expected, reason
    assert _metric(server, "nv_inference_request_success", model) == 0
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    inference = stats["inference_stats"]
    assert int(inference["fail"]["count"]) == 1
    assert int(inference["fail"]["ns"]) > 0
    assert int(inference["success"].get("count", 0)) == 0
    assert int(stats.get("execution_count", 0)) == 0


def _grpc_inputs() -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    return inputs


def test_grpc_deadline_while_queued(server: RunningServer) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        error = client_error(client.infer, "grpc_deadline", _grpc_inputs(), client_timeout=1.0)
    assert error.status() == "StatusCode.DEADLINE_EXCEEDED"
    _assert_one_canceled_failure(server, "grpc_deadline")


def test_grpc_stream_cancelled_while_queued(server: RunningServer) -> None:
    a = np.ones((1, 4), np.float32).tobytes()
    request = pb.ModelInferRequest(model_name="grpc_stream", raw_input_contents=[a, a])
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 4])
    more = threading.Event()  # keeps the request side open until the call is cancelled

    def requests() -> Iterator[pb.ModelInferRequest]:
        yield request
        more.wait(30)

    with grpc.insecure_channel(server.grpc_url) as channel:
        call = pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(requests())
        _wait_for_pending(server, "grpc_stream", 1)
        call.cancel()
        more.set()
    _assert_one_canceled_failure(server, "grpc_stream")


def test_http_client_gone_while_queued(server: RunningServer) -> None:
    data = [1.0, 2.0, 3.0, 4.0]
    body = json.dumps({"inputs": [
        {"name": n, "datatype": "FP32", "shape": [1, 4], "data": data} for n in ("INPUT0", "INPUT1")
    ]}).encode()
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(
            b"POST /v2/models/http_gone/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
        )
        _wait_for_pending(server, "http_gone", 1)
    _assert_one_canceled_failure(server, "http_gone")
    assert not [line for line in server.output if "Traceback" in line]


def test_grpc_deadline_while_executing(server: RunningServer) -> None:
    """The execution runs to its end and is counted; the next request waits for the instance meanwhile."""
    x = grpcclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.ones(1, np.float32))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        error = client_error(client.infer, "grpc_executing", [x], client_timeout=0.3)
        assert error.status() == "StatusCode.DEADLINE_EXCEEDED"
        assert client.infer("grpc_executing", [x]).as_numpy("Y").tolist() == pytest.approx([1.0])
        stats = client.get_inference_statistics("grpc_executing", as_json=True)["model_stats"][0]
    assert (int(stats["execution_count"]), int(stats["inference_count"])) == (2, 2)
    inference = stats["inference_stats"]
    assert int(inference["success"]["count"]) == 1 and int(inference["fail"]["count"]) == 1
    # The second request was queued until the cancelled execution released the instance.
    assert int(inference["queue"]["ns"]) >= 200_000_000
    for reason, expected in (("CANCELED", 1), ("REJECTED", 0), ("BACKEND", 0), ("OTHER", 0)):
        assert _metric(server, "nv_inference_request_failure", "grpc_executing", reason) == expected, reason
    assert _metric(server, "nv_inference_request_success", "grpc_executing") == 1
    assert _metric(server, "nv_inference_exec_count", "grpc_executing") == 2
    assert _metric(server, "nv_inference_count", "grpc_executing") == 2
