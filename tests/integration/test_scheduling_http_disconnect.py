"""The real `naiad serve`: an HTTP client that disconnects while its /infer is queued cancels it."""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support.onnx_models import add_sub_model, slow_model
from tests.support.servers import RunningServer, start_server
from tests.support.waiting import wait_until

# One queued request waits this long for company before it runs alone.
DELAY_US = 1_000_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("http_disconnect") / "models"
    add_sub_model(repo, "queued", dims=4, scheduler=f"dynamic_batching {{ max_queue_delay_microseconds: {DELAY_US} preferred_batch_size: [8] }}")
    slow_model(repo, "executing", matmuls=240)  # about a second per execution, default scheduler
    with start_server(repo) as running:
        yield running


def _metric(server: RunningServer, family: str, model: str = "queued", reason: str | None = None) -> int:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    labels = f'model="{model}",reason="{reason}",version="1"' if reason else f'model="{model}",version="1"'
    match = re.search(rf"^{family}\{{{labels}\}} (\d+)", text, re.M)
    assert match is not None, text
    return int(match.group(1))


def _pending(server: RunningServer) -> int:
    return _metric(server, "nv_inference_pending_request_count")


def _wait_for_pending(server: RunningServer, expected: int, timeout: float = 10.0) -> None:
    wait_until(lambda: _pending(server) == expected, f"the pending request count to become {expected}", timeout)


def _infer_body() -> bytes:
    data = [1.0, 2.0, 3.0, 4.0]
    return json.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": data},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 4], "data": data},
    ]}).encode()


def test_disconnect_while_queued_cancels_the_request(server: RunningServer) -> None:
    body = _infer_body()
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(
            b"POST /v2/models/queued/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
        )
        _wait_for_pending(server, 1)
    # The socket is closed: the server drops the queued request without waiting for its delay.
    _wait_for_pending(server, 0, timeout=DELAY_US / 1e6 / 2)

    with httpclient.InferenceServerClient(server.http_url) as client:
        inputs = [httpclient.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        result = client.infer("queued", inputs)
        assert result.as_numpy("OUTPUT0").tolist() == [[2.0] * 4]
        stats = client.get_inference_statistics("queued")["model_stats"][0]
    # Only the second request ever ran, alone: the first one did not join its batch.
    assert int(stats["inference_count"]) == 1 and int(stats["execution_count"]) == 1
    assert [(int(b["batch_size"]), int(b["compute_infer"]["count"])) for b in stats["batch_stats"]] == [(1, 1)]
    assert int(stats["inference_stats"]["success"]["count"]) == 1
    assert not [line for line in server.output if "Traceback" in line or "Exception in ASGI" in line]


def test_disconnect_while_executing_keeps_the_instance_until_the_execution_ends(server: RunningServer) -> None:
    body = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1.0]}]}).encode()
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(
            b"POST /v2/models/executing/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
        )
        time.sleep(0.2)  # no signal shows the execution started: give it time to reach the idle instance
    wait_until(lambda: _metric(server, "nv_inference_request_failure", "executing", "CANCELED") != 0,
               "the disconnected request to be counted", timeout=10)

    with httpclient.InferenceServerClient(server.http_url) as client:
        x = httpclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.ones(1, np.float32))
        assert client.infer("executing", [x]).as_numpy("Y").tolist() == pytest.approx([1.0])
        stats = client.get_inference_statistics("executing")["model_stats"][0]
    # Both executions counted; the second request waited for the first one to release the instance.
    assert (int(stats["execution_count"]), int(stats["inference_count"])) == (2, 2)
    inference = stats["inference_stats"]
    assert int(inference["success"]["count"]) == 1 and int(inference["fail"]["count"]) == 1
    assert int(inference["queue"]["ns"]) >= 200_000_000
    assert _metric(server, "nv_inference_request_failure", "executing", "CANCELED") == 1
    assert _metric(server, "nv_inference_exec_count", "executing") == 2
