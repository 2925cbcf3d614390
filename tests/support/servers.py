"""Starts the real `naiad serve` process on free loopback ports and waits for its start line."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

READY_PREFIX = "NAIAD_READY "


@dataclass
class RunningServer:
    process: subprocess.Popen
    http_port: int | None
    grpc_port: int | None
    metrics_port: int | None
    output: list[str] = field(default_factory=list)

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

    def __enter__(self) -> "RunningServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server(repo: Path | str, *extra_args: str, timeout: float = 60.0) -> RunningServer:
    """Spawn `python -m naiad serve` on port 0 everywhere; returns once it printed its ports."""
    command = [
        sys.executable, "-m", "naiad", "serve",
        "--model-repository", str(repo),
        "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
        "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
        *extra_args,
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert process.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    output: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not selector.select(timeout=max(deadline - time.monotonic(), 0)):
            break
        line = process.stdout.readline()
        if not line:
            break
        output.append(line)
        if line.startswith(READY_PREFIX):
            ports = json.loads(line[len(READY_PREFIX):])
            server = RunningServer(process, ports["http_port"], ports["grpc_port"], ports["metrics_port"], output)
            _drain(process, output)
            return server
    process.kill()
    process.wait()
    raise RuntimeError("naiad serve did not start:\n" + "".join(output))


def _drain(process: subprocess.Popen, output: list[str]) -> None:
    """Keep reading the server's output in the background so its pipe never fills up."""
    import threading

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)

    threading.Thread(target=pump, daemon=True).start()
