"""`--frontend-core-connections K` with `--frontend-processes`: the core serves each port's first K
connections itself and hands the others to the workers, which start once a port first has more than
K connections open; a stopped worker holds up only the connections handed to it, and while no worker
is up the core serves every new connection."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.support.onnx_models import add_sub_model
from tests.support.process_tree import alive
from tests.support.servers import RunningServer, frontend_worker_pids, start_server, wait_for_line
from tests.support.waiting import wait_until

STALLED_SECS = 1.0  # how long a request handed to a stopped worker is seen to wait
_RESTARTED = re.compile(r"HTTP/REST frontend worker 0 started again")


def _repository(root: Path) -> Path:
    repo = root / "models"
    add_sub_model(repo, "add_sub", datatype="INT32", dims=4, scheduler="")
    return repo


def _start(root: Path, keep: int) -> RunningServer:
    return start_server(_repository(root), "--frontend-processes", "1", "--frontend-core-connections", str(keep),
                        "--grpc-server-impl", "naiad")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """K=1, its workers started (test_workers_start_when_a_port_first_has_more_than_k_connections)."""
    with _start(tmp_path_factory.mktemp("core_connections"), 1) as running:
        with _held_http(running, 2), _held_grpc(running, 2):
            wait_for_line(running, "HTTP/REST served by 1 frontend worker processes")
            wait_for_line(running, "gRPC served by 1 frontend worker processes")
        time.sleep(0.5)  # the core has seen those connections close (until then they count against K)
        yield running


@contextlib.contextmanager
def _held_http(server: RunningServer, count: int) -> Iterator[list[socket.socket]]:
    """`count` HTTP connections open at once, each answered once."""
    with contextlib.ExitStack() as stack:
        conns = [stack.enter_context(socket.create_connection(("127.0.0.1", server.http_port))) for _ in range(count)]
        for i, conn in enumerate(conns):
            assert _exchange(conn, [i, 0, 0, 0]) == (200, [i + 1, 1, 1, 1])
        yield conns


@contextlib.contextmanager
def _held_grpc(server: RunningServer, count: int) -> Iterator[None]:
    """`count` gRPC connections open at once, each answered once."""
    with contextlib.ExitStack() as stack:
        clients = [stack.enter_context(_grpc_client(server)) for _ in range(count)]
        for i, client in enumerate(clients):
            assert _grpc_add_sub(client, [i, 0, 0, 0]) == [i + 1, 1, 1, 1]
        yield


def test_workers_start_when_a_port_first_has_more_than_k_connections(tmp_path: Path) -> None:
    with _start(tmp_path, 2) as server:
        assert any("HTTP/REST: 1 frontend worker processes start once more than 2" in line for line in server.output)
        with _held_http(server, 2):  # K connections: the core serves them, no worker starts
            time.sleep(0.5)
            assert not any("served by" in line for line in server.output), "".join(server.output)
        with _held_http(server, 3):  # one more than K: the workers start (the core answers meanwhile)
            wait_for_line(server, "HTTP/REST served by 1 frontend worker processes")
        worker = frontend_worker_pids(server, "HTTP/REST")[0]
        assert alive(worker)
        assert not any("gRPC served by" in line for line in server.output)  # each port starts its own when needed
        time.sleep(0.5)  # the core has seen those connections close (until then they count against K)
        with _held_http(server, 2) as kept, stopped(worker):  # from now on the third goes to the worker
            assert _exchange(kept[0], [7, 0, 0, 0], timeout=30) == (200, [8, 1, 1, 1])  # the core's own
            handed = _sent_to_the_stopped_worker(server)
        assert _response(handed) == (200, [10, 10, 10, 10])  # nothing lost
        handed.close()


def _sent_to_the_stopped_worker(server: RunningServer) -> socket.socket:
    """A new connection with a request sent on it, seen to wait: handed to the stopped worker."""
    conn = socket.create_connection(("127.0.0.1", server.http_port))
    conn.sendall(_request([9, 9, 9, 9]))
    conn.settimeout(STALLED_SECS)
    with pytest.raises(TimeoutError):
        conn.recv(1)
    return conn


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _request(a: list[int]) -> bytes:
    tensor = {"datatype": "INT32", "shape": [1, 4]}
    body = json.dumps({"inputs": [dict(tensor, name="INPUT0", data=a), dict(tensor, name="INPUT1", data=[1, 1, 1, 1])]})
    return (f"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: naiad\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}").encode()


def _response(sock: socket.socket, timeout: float = 60.0) -> tuple[int, list[int]]:
    """The status and OUTPUT0 of one HTTP response read from `sock`."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, data
        body += chunk
    return int(head.split()[1]), json.loads(body)["outputs"][0]["data"]


def _exchange(sock: socket.socket, a: list[int], timeout: float = 60.0) -> tuple[int, list[int]]:
    sock.sendall(_request(a))
    return _response(sock, timeout)


def test_http_the_first_connection_is_served_by_the_core_and_the_next_by_the_worker(server: RunningServer) -> None:
    first = socket.create_connection(("127.0.0.1", server.http_port))
    try:
        assert _exchange(first, [1, 2, 3, 4]) == (200, [2, 3, 4, 5])
        with stopped(frontend_worker_pids(server, "HTTP/REST")[0]):
            assert _exchange(first, [5, 6, 7, 8], timeout=30) == (200, [6, 7, 8, 9])  # the core's own
            second = _sent_to_the_stopped_worker(server)
        assert _response(second) == (200, [10, 10, 10, 10])  # nothing lost
        second.close()
    finally:
        first.close()


def _grpc_client(server: RunningServer) -> grpcclient.InferenceServerClient:
    # a connection of its own (grpc shares connections between channels to one address by default)
    return grpcclient.InferenceServerClient(server.grpc_url, channel_args=[("grpc.use_local_subchannel_pool", 1)])


def _grpc_add_sub(client: grpcclient.InferenceServerClient, a: list[int], timeout: float | None = None) -> list[int]:
    inputs = [grpcclient.InferInput(f"INPUT{i}", [1, 4], "INT32") for i in (0, 1)]
    inputs[0].set_data_from_numpy(np.array([a], np.int32))
    inputs[1].set_data_from_numpy(np.ones((1, 4), np.int32))
    return client.infer("add_sub", inputs, client_timeout=timeout).as_numpy("OUTPUT0")[0].tolist()


def test_grpc_the_first_connection_is_served_by_the_core_and_the_next_by_the_worker(server: RunningServer) -> None:
    with _grpc_client(server) as first, _grpc_client(server) as second:
        assert _grpc_add_sub(first, [1, 2, 3, 4]) == [2, 3, 4, 5]
        with stopped(frontend_worker_pids(server, "gRPC")[0]):
            assert _grpc_add_sub(first, [5, 6, 7, 8], timeout=30) == [6, 7, 8, 9]  # the core's own
            with pytest.raises(InferenceServerException) as info:  # handed to the stopped worker
                _grpc_add_sub(second, [9, 9, 9, 9], timeout=STALLED_SECS)
            assert info.value.status() == str(grpc.StatusCode.DEADLINE_EXCEEDED)
        assert _grpc_add_sub(second, [9, 9, 9, 9], timeout=60) == [10, 10, 10, 10]


def test_with_its_worker_gone_the_core_serves_every_new_connection(tmp_path: Path) -> None:
    with _start(tmp_path, 0) as server:
        worker = frontend_worker_pids(server, "HTTP/REST")[0]
        os.kill(worker, signal.SIGKILL)
        wait_until(lambda: not alive(worker), "the worker to be gone")
        answered_before_restart = 0
        deadline = time.monotonic() + 60
        restarted = False
        while not restarted and time.monotonic() < deadline:  # until the worker is back, then once more
            restarted = any(_RESTARTED.search(line) for line in list(server.output))
            i = answered_before_restart % 100
            with socket.create_connection(("127.0.0.1", server.http_port)) as conn:
                assert _exchange(conn, [i, 0, 0, 0], timeout=30) == (200, [i + 1, 1, 1, 1])
            answered_before_restart += not restarted
        assert restarted and answered_before_restart > 0
