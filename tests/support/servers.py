"""Starts the real `naiad serve` process on free loopback ports and waits for its start line."""

from __future__ import annotations

import json
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.waiting import wait_until

READY_PREFIX = "NAIAD_READY "
GRPC_IMPL_ENV = "NAIAD_TEST_GRPC_IMPL"  # run the suite's servers with --grpc-server-impl naiad|grpcio
FRONTEND_PROCESSES_ENV = "NAIAD_TEST_FRONTEND_PROCESSES"  # run the suite's servers with --frontend-processes N


@dataclass
class RunningServer:
    process: subprocess.Popen
    http_port: int | None
    grpc_port: int | None
    metrics_port: int | None
    output: list[str] = field(default_factory=list)
    sagemaker_port: int | None = None  # set when started with --allow-sagemaker
    vertex_ai_port: int | None = None  # set when started with --allow-vertex-ai

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def stop(self, timeout: float = 20.0) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server(repo: Path | str | None, *extra_args: str, timeout: float = 90.0, env: dict[str, str] | None = None) -> RunningServer:
    """Spawn `python -m naiad serve` on port 0 everywhere; returns once it printed its ports.

    `env` adds environment variables (e.g. the cloud platforms' SAGEMAKER_* / AIP_*); repo None
    leaves --model-repository out (Vertex AI's AIP_STORAGE_URI names it then)."""
    command = [
        sys.executable, "-m", "naiad", "serve",
        *(["--model-repository", str(repo)] if repo is not None else []),
        "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
        "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
        *extra_args,
    ]
    impl = os.environ.get(GRPC_IMPL_ENV)
    if impl and not any(arg.startswith("--grpc-server-impl") for arg in extra_args):
        command += ["--grpc-server-impl", impl]
    processes = os.environ.get(FRONTEND_PROCESSES_ENV)
    if processes and not any(arg.startswith("--frontend-processes") for arg in extra_args):
        command += ["--frontend-processes", processes, "--frontend-core-connections", "0"]  # every connection through a worker
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **(env or {}))
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    output: list[str] = []
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        # One reader for the whole life of the process: keeps the pipe drained and hands lines over.
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        try:
            line = lines.get(timeout=max(remaining, 0.001))
        except queue.Empty:
            break
        if line is None:
            break
        if line.startswith(READY_PREFIX):
            ports = json.loads(line[len(READY_PREFIX):])
            return RunningServer(process, ports["http_port"], ports["grpc_port"], ports["metrics_port"], output,
                                 ports.get("sagemaker_port"), ports.get("vertex_ai_port"))
    process.kill()
    process.wait()
    raise RuntimeError("naiad serve did not start:\n" + "".join(output))


def frontend_worker_pids(server: RunningServer, label: str) -> list[int]:
    """The pids of the frontend worker processes serving `label` ("HTTP/REST" or "gRPC"), from the server's log."""
    pattern = re.compile(re.escape(label) + r" served by \d+ frontend worker processes \(pids ([\d, ]+)\)")
    for line in server.output:
        match = pattern.search(line)
        if match:
            return [int(pid) for pid in match.group(1).split(",")]
    raise AssertionError("no worker pids in the server's log:\n" + "".join(server.output))


def wait_for_line(server: RunningServer, pattern: re.Pattern[str] | str, timeout: float = 60.0) -> re.Match[str]:
    """The first match of `pattern` (a regex, or text to find as is) in the server's output, once printed."""
    regex = pattern if isinstance(pattern, re.Pattern) else re.compile(re.escape(pattern))

    def found() -> re.Match[str] | None:
        return next((match for line in list(server.output) if (match := regex.search(line))), None)

    try:
        return wait_until(found, f"a line matching {regex.pattern!r}", timeout, interval=0.05)
    except AssertionError as exc:
        raise AssertionError(f"{exc}, in:\n" + "".join(server.output)) from None


def client_error(call, *args, **kwargs):
    """The InferenceServerException a tritonclient call raises (the test fails if it does not)."""
    import pytest
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as info:
        call(*args, **kwargs)
    return info.value


def post_json(url: str, doc: dict, timeout: float = 60.0) -> tuple[int, bytes]:
    """POST a JSON document; (status, body) for any answer, error statuses included."""
    request = urllib.request.Request(url, json.dumps(doc).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def raw_exchange(port: int, payload: bytes, chunks: list[bytes] | None = None, *, end_write: bool = False,
                 timeout: float = 30) -> bytes:
    """Send raw bytes on a new loopback connection (then the extra chunks; with end_write, end our
    side so the server sees EOF) and read until the server closes or `timeout` passes in silence."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        try:
            conn.sendall(payload)
            for chunk in chunks or []:
                conn.sendall(chunk)
            if end_write:
                conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may close first (an early 4xx): what it sent is still readable
        received = []
        while True:
            try:
                piece = conn.recv(1 << 20)
            except (ConnectionResetError, TimeoutError):
                break
            if not piece:
                break
            received.append(piece)
    return b"".join(received)
