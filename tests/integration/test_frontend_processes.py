"""`naiad serve --frontend-processes N`: the HTTP/REST and gRPC ports served by worker processes give the
one server's answers (statistics, model control, shared memory, metrics, errors), and survive a worker's death."""

from __future__ import annotations

import http.client
import json
import os
import queue
import re
import signal
import socket
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tests.support.onnx_models import add_sub_model, identity_model
from tests.support.process_tree import alive
from tests.support.python_models import write_counter_model
from tests.support.servers import RunningServer, frontend_worker_pids, start_server, wait_for_line
from tests.support.waiting import wait_until

WORKERS = 2
CONNECTIONS = 16  # fresh connections per check: the core hands them to the workers in turn
THROUGH_WORKERS = ("--frontend-core-connections", "0")  # the core keeps none: every connection reaches a worker
_RESTARTED = re.compile(r"HTTP/REST frontend worker (\d+) started again \(pid (\d+)\)")
_GRPC_RESTARTED = re.compile(r"gRPC frontend worker (\d+) started again \(pid (\d+)\)")
GRPC = ("--grpc-server-impl", "naiad")  # the workers' gRPC server, whatever the suite's default
# A lone request waits this long for company: it is still queued when its client gives up.
QUEUED = "dynamic_batching { max_queue_delay_microseconds: 30000000 preferred_batch_size: [8] }"


def _repository(root: Path) -> Path:
    repo = root / "models"
    add_sub_model(repo, "add_sub", datatype="INT32", dims=4, scheduler="")
    identity_model(repo, "identity_fp32", "FP32", [-1])
    add_sub_model(repo, "queued", datatype="INT32", dims=4, scheduler=QUEUED)
    add_sub_model(repo, "queued_grpc", datatype="INT32", dims=4, scheduler=QUEUED)
    write_counter_model(repo)  # decoupled
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = _repository(tmp_path_factory.mktemp("frontend_processes"))
    with start_server(repo, "--frontend-processes", str(WORKERS), *THROUGH_WORKERS, "--model-control-mode", "explicit",
                      "--load-model", "add_sub", "--load-model", "queued", "--load-model", "queued_grpc",
                      "--load-model", "counter",
                      *GRPC) as running:
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


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:  # ended meanwhile
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


TWO_CPUS = pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2
                              or "NAIAD_WORKER_CPUS" in os.environ,
                              reason="needs two usable CPUs (Linux) and no NAIAD_WORKER_CPUS of the caller's")


@TWO_CPUS
def test_frontend_workers_keep_off_one_cpu_left_to_the_server_process(server: RunningServer) -> None:
    usable = os.sched_getaffinity(0)
    frontends = frontend_worker_pids(server, "HTTP/REST") + frontend_worker_pids(server, "gRPC")
    models = [pid for pid in _children(server.process.pid) if pid not in frontends]
    assert frontends and models, "the frontend workers and the counter model's Python worker"
    for pid in frontends:
        assert os.sched_getaffinity(pid) == usable - {min(usable)}, pid
    for pid in [server.process.pid, *models]:  # the server process (and its threads), a model's worker: anywhere
        assert os.sched_getaffinity(pid) == usable, pid
    assert any("frontend workers run on CPUs" in line for line in server.output)


@TWO_CPUS
def test_an_empty_cpu_list_leaves_the_worker_processes_anywhere(tmp_path: Path) -> None:
    usable = os.sched_getaffinity(0)
    with start_server(_repository(tmp_path), "--frontend-processes", "1", *THROUGH_WORKERS, "--model-control-mode",
                      "explicit", "--load-model", "counter", *GRPC, env={"NAIAD_WORKER_CPUS": ""}) as running:
        children = _children(running.process.pid)
        assert len(children) >= 3  # an HTTP worker, a gRPC worker, the counter model's worker
        for pid in children:
            assert os.sched_getaffinity(pid) == usable, pid
        assert not any("frontend workers run on CPUs" in line for line in running.output)


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


def test_a_killed_worker_is_restarted_and_the_server_keeps_serving(tmp_path: Path) -> None:
    with start_server(_repository(tmp_path), "--frontend-processes", str(WORKERS), *THROUGH_WORKERS, *GRPC) as server:
        pids = frontend_worker_pids(server, "HTTP/REST")
        grpc_pids = frontend_worker_pids(server, "gRPC")
        assert len(pids) == WORKERS and len(grpc_pids) == WORKERS
        os.kill(pids[0], signal.SIGKILL)
        os.kill(grpc_pids[0], signal.SIGKILL)
        restarted = wait_for_line(server, _RESTARTED)
        assert int(restarted.group(1)) == 0 and int(restarted.group(2)) not in pids
        grpc_restarted = wait_for_line(server, _GRPC_RESTARTED)
        assert int(grpc_restarted.group(1)) == 0 and int(grpc_restarted.group(2)) not in grpc_pids
        for i in range(CONNECTIONS):  # every worker gets some, the restarted one too
            status, body = call(server, "POST", "/v2/models/add_sub/infer", add_sub_body([i, 0, 0, 0], [1, 1, 1, 1]))
            assert status == 200, body
        for i in range(CONNECTIONS):  # a fresh connection each: some reach the restarted gRPC worker
            np.testing.assert_array_equal(grpc_add_sub(server, [i, 0, 0, 0], [1, 1, 1, 1])[0], [[i + 1, 1, 1, 1]])
        assert success_count(server, "add_sub") == 2 * CONNECTIONS
        new_pids = [int(restarted.group(2)), pids[1], int(grpc_restarted.group(2)), grpc_pids[1]]
        assert server.stop() == 0
        for pid in new_pids:  # a clean stop leaves no worker behind
            assert not alive(pid)
    assert not any("Traceback" in line for line in server.output), "".join(server.output)


def test_a_signal_to_the_whole_process_group_stops_the_workers_without_starting_them_again(tmp_path: Path) -> None:
    """`kill -TERM -PGID` or a service manager stopping every process of the server: the workers drain
    and exit with the core, which does not replace them meanwhile."""
    with start_server(_repository(tmp_path), "--frontend-processes", "1", *THROUGH_WORKERS, *GRPC) as server:
        workers = frontend_worker_pids(server, "HTTP/REST") + frontend_worker_pids(server, "gRPC")
        for pid in [server.process.pid, *workers]:
            os.kill(pid, signal.SIGTERM)
        assert server.process.wait(60) == 0
        for pid in workers:
            assert not alive(pid)
    output = "".join(server.output)
    assert "starting it again" not in output and "started again" not in output, output
    assert '"stopped"' in output, output


def test_flag_refuses_a_bad_count(tmp_path: Path) -> None:
    for bad in ("-1", "65", "many"):
        with pytest.raises(RuntimeError) as info:
            start_server(_repository(tmp_path / bad), "--frontend-processes", bad, timeout=60)
        assert "--frontend-processes" in str(info.value)


def test_one_worker_serves_each_port_beside_the_core_and_zero_serves_them_in_it(tmp_path: Path) -> None:
    """1: one worker per port (the layout for two cores); 0: the ports in the server process."""
    for count, workers in (("1", 1), ("0", 0)):
        with start_server(_repository(tmp_path / count), "--frontend-processes", count, *THROUGH_WORKERS,
                          "--model-control-mode", "explicit", "--load-model", "add_sub", *GRPC) as server:
            if workers:
                assert len(frontend_worker_pids(server, "HTTP/REST")) == len(frontend_worker_pids(server, "gRPC")) == workers
            else:
                assert not any("frontend worker" in line for line in server.output), "".join(server.output)
            status, body = call(server, "POST", "/v2/models/add_sub/infer", add_sub_body([1, 2, 3, 4], [1, 1, 1, 1]))
            assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2, 3, 4, 5], body
            np.testing.assert_array_equal(grpc_add_sub(server, [1, 2, 3, 4], [1, 1, 1, 1])[0], [[2, 3, 4, 5]])
            assert success_count(server, "add_sub") == 2


# ---------------------------------------------------------------- gRPC (Naiad's own HTTP/2 server or grpcio in every worker)


@pytest.fixture(scope="module", params=["naiad", "grpcio"])
def grpc_server(request: pytest.FixtureRequest, server: RunningServer,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The module's server (Naiad's own gRPC server in the workers), then one whose workers run grpcio."""
    if request.param == "naiad":
        yield server
        return
    repo = _repository(tmp_path_factory.mktemp("frontend_processes_grpcio"))
    with start_server(repo, "--frontend-processes", str(WORKERS), *THROUGH_WORKERS, "--model-control-mode", "explicit",
                      "--load-model", "add_sub", "--load-model", "queued_grpc", "--load-model", "counter",
                      "--grpc-server-impl", "grpcio") as running:
        yield running


def grpc_inputs(a: list[int], b: list[int]) -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput(f"INPUT{i}", [1, len(a)], "INT32") for i in (0, 1)]
    inputs[0].set_data_from_numpy(np.array([a], np.int32))
    inputs[1].set_data_from_numpy(np.array([b], np.int32))
    return inputs


def grpc_add_sub(server: RunningServer, a: list[int], b: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """add_sub on a client (a connection) of its own, so successive calls land on different workers."""
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        result = client.infer("add_sub", grpc_inputs(a, b), request_id="g")
        assert result.get_response().id == "g"
        return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")


def grpc_error(call, *args, **kwargs) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as info:
        call(*args, **kwargs)
    return info.value.status(), info.value.message()


def test_grpc_infer_metadata_and_statistics_count_every_request(grpc_server: RunningServer) -> None:
    assert len(frontend_worker_pids(grpc_server, "gRPC")) == WORKERS  # gRPC is served by the workers
    with grpcclient.InferenceServerClient(grpc_server.grpc_url) as client:
        before = client.get_inference_statistics("add_sub").model_stats[0].inference_stats.success.count
        metadata = client.get_model_metadata("add_sub")
        assert metadata.name == "add_sub" and metadata.inputs[0].shape == [-1, 4]
        assert client.get_model_config("add_sub").config.name == "add_sub"
        assert client.is_server_ready() and client.is_model_ready("add_sub")
    for i in range(CONNECTIONS):
        total, difference = grpc_add_sub(grpc_server, [i, 2, 3, 4], [1, 1, 1, 1])
        np.testing.assert_array_equal(total, [[i + 1, 3, 4, 5]])
        np.testing.assert_array_equal(difference, [[i - 1, 1, 2, 3]])
    with grpcclient.InferenceServerClient(grpc_server.grpc_url) as client:
        stats = client.get_inference_statistics("add_sub").model_stats[0].inference_stats
    assert stats.success.count == before + CONNECTIONS
    assert success_count(grpc_server, "add_sub") == before + CONNECTIONS  # the same count over HTTP


def test_grpc_errors_are_the_single_servers(grpc_server: RunningServer) -> None:
    with grpcclient.InferenceServerClient(grpc_server.grpc_url) as client:
        # an unknown model is NOT_FOUND whatever its tensors (decoded in the worker or not)
        assert grpc_error(client.infer, "nope", grpc_inputs([1, 2, 3, 4], [1, 2, 3, 4])) == (
            "StatusCode.NOT_FOUND", "Request for unknown model: 'nope' is not found")
        assert grpc_error(client.get_model_metadata, "nope")[0] == "StatusCode.NOT_FOUND"
        status, message = grpc_error(client.infer, "add_sub", grpc_inputs([1, 2, 3], [1, 2, 3]))
        assert status == "StatusCode.INVALID_ARGUMENT" and "shape" in message.lower()
        assert grpc_error(client.infer, "counter", [_count(2)]) == (
            "StatusCode.UNIMPLEMENTED", "ModelInfer RPC doesn't support models with decoupled transaction policy")
        assert grpc_error(client.load_model, "../escape")[0] == "StatusCode.INVALID_ARGUMENT"  # the guard, in the worker
        assert not client.is_model_ready("nope")
    np.testing.assert_array_equal(grpc_add_sub(grpc_server, [1, 2, 3, 4], [0, 0, 0, 0])[0], [[1, 2, 3, 4]])  # still serving


def test_grpc_model_loaded_through_one_worker_is_ready_through_all(grpc_server: RunningServer) -> None:
    with grpcclient.InferenceServerClient(grpc_server.grpc_url) as client:
        client.load_model("identity_fp32")
    for _ in range(CONNECTIONS):
        with grpcclient.InferenceServerClient(grpc_server.grpc_url) as client:
            assert client.is_model_ready("identity_fp32")
    with grpcclient.InferenceServerClient(grpc_server.grpc_url) as client:
        tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.array([[1.5, 2.5]], np.float32))
        np.testing.assert_array_equal(client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0"), [[1.5, 2.5]])
        client.unload_model("identity_fp32")
    for _ in range(CONNECTIONS):
        with grpcclient.InferenceServerClient(grpc_server.grpc_url) as client:
            assert not client.is_model_ready("identity_fp32")
    assert call(grpc_server, "GET", "/v2/models/identity_fp32/ready")[0] == 400  # and over HTTP


def test_grpc_system_shared_memory_registered_once_serves_every_worker(grpc_server: RunningServer) -> None:
    key = f"/naiad_grpc_workers_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    region = shm.create_shared_memory_region("gio", key, 64)
    try:
        with grpcclient.InferenceServerClient(grpc_server.grpc_url) as client:
            client.register_system_shared_memory("gio", key, 64)
        for i in range(4):
            a = np.array([[i, 2, 3, 4]], np.int32)
            b = np.array([[10, 20, 30, 40]], np.int32)
            shm.set_shared_memory_region(region, [a, b])
            with grpcclient.InferenceServerClient(grpc_server.grpc_url) as client:  # a fresh connection each time
                inputs = [grpcclient.InferInput(f"INPUT{j}", [1, 4], "INT32") for j in (0, 1)]
                inputs[0].set_shared_memory("gio", 16)
                inputs[1].set_shared_memory("gio", 16, offset=16)
                output = grpcclient.InferRequestedOutput("OUTPUT0")
                output.set_shared_memory("gio", 16, offset=32)
                client.infer("add_sub", inputs, outputs=[output])
                np.testing.assert_array_equal(shm.get_contents_as_numpy(region, np.int32, [1, 4], offset=32), a + b)
                assert list(client.get_system_shared_memory_status().regions) == ["gio"]
        with grpcclient.InferenceServerClient(grpc_server.grpc_url) as client:
            client.unregister_system_shared_memory("gio")
            assert list(client.get_system_shared_memory_status().regions) == []
        assert json.loads(call(grpc_server, "GET", "/v2/systemsharedmemory/status")[1]) == []
    finally:
        shm.destroy_shared_memory_region(region)


def _count(value: int) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("COUNT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return tensor


def test_grpc_stream_on_a_decoupled_model_is_relayed_both_ways(grpc_server: RunningServer) -> None:
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(grpc_server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer("counter", [_count(3)], request_id="three", enable_empty_final_response=True)
        client.async_stream_infer("counter", [_count(-1)], request_id="bad")
        client.async_stream_infer("counter", [_count(1)], request_id="one")
        got: dict[str, list] = {"three": [], "one": []}
        errors = []
        for _ in range(3 + 1 + 1 + 1):
            result, error = results.get(timeout=60)
            if error is not None:
                errors.append(error.message())
                continue
            response = result.get_response()
            value = int(result.as_numpy("VALUE")[0]) if response.outputs else None
            got[response.id].append((value, response.parameters["triton_final_response"].bool_param))
        client.stop_stream()
    assert got["three"] == [(0, False), (1, False), (2, False), (None, True)]
    assert got["one"] == [(0, False)]
    assert errors == ["count must not be negative, got -1"]


def test_grpc_client_gone_cancels_its_request_in_the_core(grpc_server: RunningServer) -> None:
    with grpcclient.InferenceServerClient(grpc_server.grpc_url) as client:
        status, _ = grpc_error(client.infer, "queued_grpc", grpc_inputs([1, 2, 3, 4], [1, 1, 1, 1]), client_timeout=2.0)
    assert status == "StatusCode.DEADLINE_EXCEEDED"
    wait_until(lambda: metric(grpc_server, "nv_inference_request_failure", "queued_grpc", "CANCELED") == 1,
               "the cancelled request to be counted", timeout=30)
    assert metric(grpc_server, "nv_inference_pending_request_count", "queued_grpc") == 0
    assert metric(grpc_server, "nv_inference_request_success", "queued_grpc") == 0


def test_grpc_stream_messages_sent_at_once_are_all_answered(grpc_server: RunningServer) -> None:
    """The request messages of a stream reach the core in the same read as its start: none is lost."""
    def request(request_id: str, value: int) -> pb.ModelInferRequest:
        message = pb.ModelInferRequest(model_name="add_sub", id=request_id,
                                       raw_input_contents=[np.full(4, value, "<i4").tobytes()] * 2)
        for name in ("INPUT0", "INPUT1"):
            message.inputs.add(name=name, datatype="INT32", shape=[1, 4])
        return message

    with grpc.insecure_channel(grpc_server.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        calls = [stub.ModelStreamInfer(iter([request(f"s{n}-{i}", i) for i in range(5)])) for n in range(4)]
        for n, stream in enumerate(calls):
            responses = list(stream)
            assert [r.infer_response.id for r in responses] == [f"s{n}-{i}" for i in range(5)]
            assert not any(r.error_message for r in responses)


def test_grpc_infer_answers_of_a_repeated_layout_are_the_full_encoding(grpc_server: RunningServer) -> None:
    """A worker remembers a request layout and a response header it has seen: the answers to the same
    layout with other tensors, ids and requested outputs are still right and byte for byte the
    message's own serialization; a request that then goes wrong still reaches the core whole."""
    def request(request_id: str, a: int, b: int, outputs: tuple[str, ...] = ()) -> bytes:
        message = pb.ModelInferRequest(model_name="add_sub", id=request_id,
                                       raw_input_contents=[np.full(4, a, "<i4").tobytes(), np.full(4, b, "<i4").tobytes()])
        for name in ("INPUT0", "INPUT1"):
            message.inputs.add(name=name, datatype="INT32", shape=[1, 4])
        for name in outputs:
            message.outputs.add(name=name)
        return message.SerializeToString()

    with grpc.insecure_channel(grpc_server.grpc_url) as channel:  # one connection: one worker
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        cases = [("r1", 5, 2, ()), ("r2", 7, 3, ()), ("", 1, 1, ()), ("r2", -4, 9, ()), ("o", 6, 1, ("OUTPUT1",)),
                 ("o", 8, 1, ("OUTPUT1",))]
        for request_id, a, b, outputs in cases:
            raw = infer(request(request_id, a, b, outputs), timeout=30)
            answer = pb.ModelInferResponse.FromString(raw)
            assert raw == answer.SerializeToString()
            assert (answer.model_name, answer.id) == ("add_sub", request_id)
            expected = {"OUTPUT0": a + b, "OUTPUT1": a - b}
            names = outputs or ("OUTPUT0", "OUTPUT1")
            assert [(o.name, o.datatype, list(o.shape)) for o in answer.outputs] == [(n, "INT32", [1, 4]) for n in names]
            for name, data in zip(names, answer.raw_output_contents):
                np.testing.assert_array_equal(np.frombuffer(data, "<i4"), [expected[name]] * 4)
        # the remembered layout with a tensor of the wrong size: the core decodes the message as sent
        bad = pb.ModelInferRequest.FromString(request("bad", 1, 1))
        bad.raw_input_contents[1] = b"\0" * 12
        with pytest.raises(grpc.RpcError) as info:
            infer(bad.SerializeToString(), timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "12" in (info.value.details() or ""), info.value.details()
        assert pb.ModelInferResponse.FromString(infer(request("after", 2, 2), timeout=30)).id == "after"


def test_grpc_infer_message_that_does_not_parse_is_the_servers_internal_error(grpc_server: RunningServer) -> None:
    """A ModelInfer message that is not protobuf gets what either gRPC server says of it, and the worker
    keeps serving (a request laid out like one seen before is decoded from its bytes, unparsed)."""
    good = pb.ModelInferRequest(model_name="add_sub",
                                raw_input_contents=[np.full(4, 3, "<i4").tobytes(), np.full(4, 1, "<i4").tobytes()])
    for name in ("INPUT0", "INPUT1"):
        good.inputs.add(name=name, datatype="INT32", shape=[1, 4])
    with grpc.insecure_channel(grpc_server.grpc_url) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        assert pb.ModelInferResponse.FromString(infer(good.SerializeToString(), timeout=30)).model_name == "add_sub"
        with pytest.raises(grpc.RpcError) as info:
            infer(b"\xff\xff\xff", timeout=30)
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert info.value.details() == "Exception deserializing request!"
        answer = pb.ModelInferResponse.FromString(infer(good.SerializeToString(), timeout=30))
        np.testing.assert_array_equal(np.frombuffer(answer.raw_output_contents[0], "<i4"), [4] * 4)
