"""Python-backend models behind the real `naiad serve` process, driven by tritonclient over HTTP and gRPC."""

from __future__ import annotations

import os
import queue
import signal
import threading
from functools import partial

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.test_python_backend_support import (
    ERROR_PY,
    INIT_RAISE_PY,
    PID_CONFIG,
    PID_PY,
    RAISE_PY,
    REPEAT_CONFIG,
    REPEAT_PY,
    SIMPLE_CONFIG,
    add_sub,
    pid_alive,
    write_model,
)
from tests.support.servers import start_server
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repo = tmp_path_factory.mktemp("pyserved")
    add_sub(repo, "add_sub")
    add_sub(repo, "add_sub_bytes", "TYPE_STRING")
    write_model(repo, "errors", SIMPLE_CONFIG, ERROR_PY)
    write_model(repo, "raiser", SIMPLE_CONFIG, RAISE_PY)
    write_model(repo, "init_raiser", SIMPLE_CONFIG, INIT_RAISE_PY)
    write_model(repo, "repeat", REPEAT_CONFIG, REPEAT_PY)
    write_model(repo, "pids", PID_CONFIG % 1, PID_PY)
    server = start_server(repo)
    try:
        yield server, repo
    finally:
        server.stop()


def _http_input(name: str, array: np.ndarray, datatype: str) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=True)
    return tensor


def test_http_add_sub_fp32(served):
    server, _ = served
    client = httpclient.InferenceServerClient(server.http_url)
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.float32)
    result = client.infer("add_sub", [_http_input("INPUT0", a, "FP32"), _http_input("INPUT1", b, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_grpc_add_sub_bytes(served):
    server, _ = served
    client = grpcclient.InferenceServerClient(server.grpc_url)
    a = np.array([[f"x{i}".encode() for i in range(16)]], dtype=np.object_)
    b = np.array([[b"-y"] * 16], dtype=np.object_)
    inputs = []
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        tensor = grpcclient.InferInput(name, list(array.shape), "BYTES")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    result = client.infer("add_sub_bytes", inputs)
    assert result.as_numpy("OUTPUT0")[0, 3] == b"x3-y"
    assert result.as_numpy("OUTPUT1")[0, 10] == b"01x"


def test_http_model_errors(served):
    server, _ = served
    client = httpclient.InferenceServerClient(server.http_url)
    one = [_http_input("INPUT0", np.ones(1, np.float32), "FP32")]
    with pytest.raises(InferenceServerException) as info:
        client.infer("errors", one)
    assert info.value.status() == "500" and info.value.message() == "custom error response"
    with pytest.raises(InferenceServerException) as info:
        client.infer("raiser", one)
    assert info.value.status() == "500"
    assert info.value.message().startswith(
        "Failed to process the request(s) for model 'raiser_0', message: ValueError: boom from execute\n\nAt:\n")


def test_initialize_error_in_repository_index(served):
    server, _ = served
    client = httpclient.InferenceServerClient(server.http_url)
    entry = next(e for e in client.get_model_repository_index() if e["name"] == "init_raiser")
    assert entry["state"] == "UNAVAILABLE"
    assert entry["reason"].startswith("Internal: RuntimeError: init exploded")
    assert not client.is_model_ready("init_raiser")


def test_http_infer_on_decoupled_model_is_501(served):
    server, _ = served
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException) as info:
        client.infer("repeat", [_http_input("IN", np.array([2], np.int32), "INT32")])
    assert info.value.status() == "501"
    assert info.value.message() == "HTTP end point doesn't support models with decoupled transaction policy"


def _stream(server, counts: list[int], empty_final: bool) -> dict[str, list]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), results))
    try:
        for index, count in enumerate(counts):
            tensor = grpcclient.InferInput("IN", [1], "INT32")
            tensor.set_data_from_numpy(np.array([count], np.int32))
            client.async_stream_infer("repeat", [tensor], request_id=f"r{index}",
                                      enable_empty_final_response=empty_final)
        by_request: dict[str, list] = {f"r{i}": [] for i in range(len(counts))}
        expected = sum(counts) + (len(counts) if empty_final else 0)
        for _ in range(expected):
            result, error = results.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            value = None if not response.outputs else int(result.as_numpy("OUT")[0])
            by_request[response.id].append((value, final))
    finally:
        client.stop_stream()
    assert results.empty()
    return by_request


def test_grpc_stream_decoupled_repeat_with_empty_final(served):
    server, _ = served
    got = _stream(server, [3, 0, 1], empty_final=True)
    assert got["r0"] == [(0, False), (1, False), (2, False), (None, True)]
    assert got["r1"] == [(None, True)]
    assert got["r2"] == [(0, False), (None, True)]


def test_grpc_stream_decoupled_repeat_without_empty_final(served):
    server, _ = served
    got = _stream(server, [2], empty_final=False)
    assert got["r0"] == [(0, False), (1, False)]


def test_killed_worker_over_http_and_recovery(served):
    server, repo = served
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    sleep = lambda s: [_http_input("SLEEP", np.array([s], np.float32), "FP32")]  # noqa: E731
    pid = int(client.infer("pids", sleep(0)).as_numpy("PID")[0])
    marker = repo / "pids" / "markers" / f"executing-{pid}"
    marker.unlink()
    outcome: list = []

    def slow_request() -> None:  # tritonclient.http clients are gevent-based: one per thread
        own = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
        try:
            outcome.append(own.infer("pids", sleep(60)))
        except InferenceServerException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=slow_request)
    thread.start()
    wait_until(marker.exists)
    os.kill(pid, signal.SIGKILL)
    thread.join(60)
    assert isinstance(outcome[0], InferenceServerException)
    assert outcome[0].status() == "500" and outcome[0].message() == "Stub process 'pids_0_0' is not healthy."
    assert client.is_server_live()
    wait_until(lambda: client.is_model_ready("pids"))
    new_pid = int(client.infer("pids", sleep(0)).as_numpy("PID")[0])
    assert new_pid != pid and pid_alive(new_pid)


def test_server_stop_ends_workers(tmp_path):
    write_model(tmp_path, "pids", PID_CONFIG % 2, PID_PY)
    server = start_server(tmp_path)
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        result = client.infer("pids", [_http_input("SLEEP", np.zeros(1, np.float32), "FP32")])
        pid = int(result.as_numpy("PID")[0])
        assert pid_alive(pid)
    finally:
        assert server.stop() == 0
    assert not pid_alive(pid)
    assert len(list((tmp_path / "pids" / "markers").glob("finalized-*"))) == 2


def test_killed_server_takes_its_workers_and_segments_along(tmp_path):
    import uuid

    prefix = f"nk{uuid.uuid4().hex[:8]}_"
    write_model(tmp_path, "pids", PID_CONFIG % 2, PID_PY)
    server = start_server(tmp_path, f"--backend-config=python,shm-region-prefix-name={prefix}")
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        pid = int(client.infer("pids", [_http_input("SLEEP", np.zeros(1, np.float32), "FP32")]).as_numpy("PID")[0])
        server.process.kill()
        server.process.wait()
    finally:
        server.stop()
    wait_until(lambda: not pid_alive(pid))
    wait_until(lambda: not [n for n in os.listdir("/dev/shm") if n.startswith(prefix)])
