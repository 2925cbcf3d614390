"""`naiad serve --frontend-processes 2`: the HTTP/REST port served by worker processes gives the one
server's answers (statistics, model control, shared memory, metrics), and survives a worker's death."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from tests.support.onnx_models import add_sub_model, identity_model
from tests.support.servers import RunningServer, start_server
from tests.support.waiting import wait_until

WORKERS = 2
CONNECTIONS = 16  # fresh connections per check: the kernel spreads them over the workers' sockets
_PIDS = re.compile(r"served by \d+ frontend worker processes \(pids ([\d, ]+)\)")
_RESTARTED = re.compile(r"frontend worker (\d+) started again \(pid (\d+)\)")
# A lone request waits this long for company: it is still queued when its client gives up.
QUEUED = "dynamic_batching { max_queue_delay_microseconds: 30000000 preferred_batch_size: [8] }"


def _repository(root: Path) -> Path:
    repo = root / "models"
    add_sub_model(repo, "add_sub", datatype="INT32", dims=4, scheduler="")
    identity_model(repo, "identity_fp32", "FP32", [-1])
    add_sub_model(repo, "queued", datatype="INT32", dims=4, scheduler=QUEUED)
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = _repository(tmp_path_factory.mktemp("frontend_processes"))
    with start_server(repo, "--frontend-processes", str(WORKERS), "--model-control-mode", "explicit",
                      "--load-model", "add_sub", "--load-model", "queued") as running:
        yield running


def call(server: RunningServer, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    """One request on a connection of its own (so successive calls land on different workers)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        conn.request(method, path, body=body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def add_sub_body(a: list[int], b: list[int]) -> bytes:
    tensor = {"datatype": "INT32", "shape": [1, len(a)]}
    return json.dumps({"inputs": [dict(tensor, name="INPUT0", data=a), dict(tensor, name="INPUT1", data=b)]}).encode()


def success_count(server: RunningServer, model: str) -> int:
    status, body = call(server, "GET", f"/v2/models/{model}/stats")
    assert status == 200, body
    return json.loads(body)["model_stats"][0]["inference_stats"]["success"]["count"]


def worker_pids(server: RunningServer) -> list[int]:
    for line in server.output:
        match = _PIDS.search(line)
        if match:
            return [int(pid) for pid in match.group(1).split(",")]
    raise AssertionError("no worker pids in the server's log:\n" + "".join(server.output))


def wait_for_line(server: RunningServer, pattern: re.Pattern[str], timeout: float = 120.0) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(server.output):
            match = pattern.search(line)
            if match:
                return match
        time.sleep(0.05)
    raise AssertionError(f"no line matching {pattern.pattern} in:\n" + "".join(server.output))


def test_json_and_binary_infer(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        a = np.array([[1, 2, 3, 4]], np.int32)
        b = np.array([[10, 20, 30, 40]], np.int32)
        for binary in (False, True):
            inputs = [httpclient.InferInput(f"INPUT{i}", [1, 4], "INT32") for i in (0, 1)]
            inputs[0].set_data_from_numpy(a, binary_data=binary)
            inputs[1].set_data_from_numpy(b, binary_data=binary)
            outputs = [httpclient.InferRequestedOutput(f"OUTPUT{i}", binary_data=binary) for i in (0, 1)]
            result = client.infer("add_sub", inputs, outputs=outputs, request_id=f"r{binary}")
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
            assert result.get_response()["id"] == f"r{binary}"
    finally:
        client.close()


def test_errors_are_the_single_servers(server: RunningServer) -> None:
    # an unknown model is a 404 whatever the body holds (the worker cannot decode it: the core answers)
    status, body = call(server, "POST", "/v2/models/nope/infer", b"{not json")
    assert status == 404 and "nope" in json.loads(body)["error"]
    status, body = call(server, "POST", "/v2/models/add_sub/infer", add_sub_body([1, 2, 3], [1, 2, 3]))
    assert status == 400 and "shape" in json.loads(body)["error"].lower()
    status, body = call(server, "GET", "/v2/no/such/path")
    assert status == 404
    status, _ = call(server, "POST", "/v2/models/add_sub/infer", add_sub_body([1, 2, 3, 4], [0, 0, 0, 0]))
    assert status == 200  # and the server keeps serving


def test_metadata_ready_and_statistics_count_every_request(server: RunningServer) -> None:
    before = success_count(server, "add_sub")
    for i in range(CONNECTIONS):
        status, body = call(server, "POST", "/v2/models/add_sub/infer", add_sub_body([i, 1, 2, 3], [1, 1, 1, 1]))
        assert status == 200, body
        assert json.loads(body)["outputs"][0]["data"] == [i + 1, 2, 3, 4]
    assert success_count(server, "add_sub") == before + CONNECTIONS
    status, body = call(server, "GET", "/v2/models/add_sub")
    assert status == 200 and json.loads(body)["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 4]}
    assert call(server, "GET", "/v2/models/add_sub/ready")[0] == 200
    assert call(server, "GET", "/v2/health/ready")[0] == 200


def metric(server: RunningServer, family: str, model: str, reason: str | None = None) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30).read().decode()
    labels = f'model="{model}",reason="{reason}",version="1"' if reason else f'model="{model}",version="1"'
    match = re.search(rf"^{family}\{{{labels}\}} (\S+)$", text, re.M)
    assert match, text
    return float(match.group(1))


def test_metrics_count_requests_of_every_worker(server: RunningServer) -> None:
    before = metric(server, "nv_inference_request_success", "add_sub")
    for i in range(CONNECTIONS):
        assert call(server, "POST", "/v2/models/add_sub/infer", add_sub_body([i, 0, 0, 0], [0, 0, 0, 0]))[0] == 200
    assert metric(server, "nv_inference_request_success", "add_sub") == before + CONNECTIONS


def test_a_client_gone_cancels_its_request_in_the_core(server: RunningServer) -> None:
    body = add_sub_body([1, 2, 3, 4], [1, 1, 1, 1])
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as conn:
        conn.sendall(b"POST /v2/models/queued/infer HTTP/1.1\r\nHost: naiad\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        wait_until(lambda: metric(server, "nv_inference_pending_request_count", "queued") == 1,
                   "the request to be queued in the core", timeout=30)
    wait_until(lambda: metric(server, "nv_inference_pending_request_count", "queued") == 0,
               "the queued request to be dropped", timeout=30)
    wait_until(lambda: metric(server, "nv_inference_request_failure", "queued", "CANCELED") == 1,
               "the cancelled request to be counted", timeout=30)
    assert metric(server, "nv_inference_request_success", "queued") == 0


def test_a_model_loaded_through_one_worker_is_ready_through_all(server: RunningServer) -> None:
    status, body = call(server, "POST", "/v2/repository/models/identity_fp32/load")
    assert status == 200, body
    for _ in range(CONNECTIONS):
        assert call(server, "GET", "/v2/models/identity_fp32/ready")[0] == 200
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.5]}]})
    status, answer = call(server, "POST", "/v2/models/identity_fp32/infer", body.encode())
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [1.5, 2.5]
    status, body = call(server, "POST", "/v2/repository/models/identity_fp32/unload")
    assert status == 200, body
    for _ in range(CONNECTIONS):
        assert call(server, "GET", "/v2/models/identity_fp32/ready")[0] == 400


def test_system_shared_memory_registered_once_serves_every_worker(server: RunningServer) -> None:
    key = f"/naiad_workers_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    region = shm.create_shared_memory_region("io", key, 64)
    try:
        registrar = httpclient.InferenceServerClient(server.http_url)
        registrar.register_system_shared_memory("io", key, 64)
        registrar.close()
        for i in range(4):
            a = np.array([[i, 2, 3, 4]], np.int32)
            b = np.array([[10, 20, 30, 40]], np.int32)
            shm.set_shared_memory_region(region, [a, b])
            client = httpclient.InferenceServerClient(server.http_url)  # a fresh connection each time
            try:
                inputs = [httpclient.InferInput(f"INPUT{j}", [1, 4], "INT32") for j in (0, 1)]
                inputs[0].set_shared_memory("io", 16)
                inputs[1].set_shared_memory("io", 16, offset=16)
                output = httpclient.InferRequestedOutput("OUTPUT0")
                output.set_shared_memory("io", 16, offset=32)
                result = client.infer("add_sub", inputs, outputs=[output])
                assert result.get_output("OUTPUT0") == {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 4]}
                np.testing.assert_array_equal(shm.get_contents_as_numpy(region, np.int32, [1, 4], offset=32), a + b)
                assert [r["name"] for r in client.get_system_shared_memory_status()] == ["io"]
            finally:
                client.close()
        status, body = call(server, "POST", "/v2/systemsharedmemory/region/io/unregister")
        assert status == 200, body
        assert json.loads(call(server, "GET", "/v2/systemsharedmemory/status")[1]) == []
    finally:
        shm.destroy_shared_memory_region(region)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is not alive
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_killed_worker_is_restarted_and_the_server_keeps_serving(tmp_path: Path) -> None:
    with start_server(_repository(tmp_path), "--frontend-processes", str(WORKERS)) as server:
        pids = worker_pids(server)
        assert len(pids) == WORKERS
        os.kill(pids[0], signal.SIGKILL)
        restarted = wait_for_line(server, _RESTARTED)
        assert int(restarted.group(1)) == 0 and int(restarted.group(2)) not in pids
        for i in range(CONNECTIONS):  # some land on the restarted worker's socket
            status, body = call(server, "POST", "/v2/models/add_sub/infer", add_sub_body([i, 0, 0, 0], [1, 1, 1, 1]))
            assert status == 200, body
        assert success_count(server, "add_sub") == CONNECTIONS
        new_pids = [int(restarted.group(2)), pids[1]]
        assert server.stop() == 0
        for pid in new_pids:  # a clean stop leaves no worker behind
            assert not _alive(pid)
    assert not any("Traceback" in line for line in server.output), "".join(server.output)


def test_flag_refuses_a_bad_count(tmp_path: Path) -> None:
    for bad in ("0", "many"):
        with pytest.raises(RuntimeError) as info:
            start_server(_repository(tmp_path / bad), "--frontend-processes", bad, timeout=60)
        assert "--frontend-processes" in str(info.value)
