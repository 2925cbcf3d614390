"""Every HTTP-style port of a real server (HTTP, metrics, SageMaker, Vertex AI, OpenAI) shares one listener
set-up: the same header deadline drops a client that never finishes its headers, and the port keeps serving."""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest

from tests.support.onnx_models import add_sub_model
from tests.support.servers import READY_PREFIX, start_server

HEADER_TIMEOUT_SECS = 1
VERTEX_ENV = {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": "0", "AIP_HEALTH_ROUTE": "/health",
              "AIP_PREDICT_ROUTE": "/predict"}
# A path each listener answers 200 to, once the slow client is gone.
HEALTHY_PATHS = {"http_port": "/v2/health/ready", "metrics_port": "/metrics", "sagemaker_port": "/ping",
                 "vertex_ai_port": "/health", "openai_port": "/v1/models"}


@pytest.fixture(scope="module")
def ports(tmp_path_factory) -> dict[str, int]:
    repo = tmp_path_factory.mktemp("repo")
    add_sub_model(repo, "add_sub")
    with start_server(repo, "--allow-http=true", "--allow-sagemaker=true", "--sagemaker-port=0",
                      "--vertex-ai-default-model=add_sub", "--openai-port=0",
                      f"--http-header-timeout-secs={HEADER_TIMEOUT_SECS}", env=VERTEX_ENV) as server:
        line = next(out for out in server.output if out.startswith(READY_PREFIX))
        yield json.loads(line[len(READY_PREFIX):])


def _closed_after(port: int, sent: bytes, limit: float) -> float:
    """Seconds until the server closes a connection that sent `sent` and nothing more."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=limit) as sock:
        sock.sendall(sent)
        while sock.recv(4096):  # a 408 may come first; the close is what counts
            pass
    return time.monotonic() - started


@pytest.mark.parametrize("key", sorted(HEALTHY_PATHS))
def test_every_port_drops_an_unfinished_header_and_keeps_serving(ports, key):
    port = ports[key]
    assert port, f"{key} did not open"
    waited = _closed_after(port, b"GET / HTTP/1.1\r\nHost: naiad\r\nX-Slow: ", limit=HEADER_TIMEOUT_SECS + 20)
    assert waited >= HEADER_TIMEOUT_SECS * 0.9
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{HEALTHY_PATHS[key]}", timeout=10) as reply:
        assert reply.status == 200
