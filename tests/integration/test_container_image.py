"""The built CPU image, run for real: non-root, serves the example models over HTTP and gRPC,
reports healthy through its own HEALTHCHECK, and stops cleanly on SIGTERM.

Opt-in: needs a Docker engine and an image built from this tree, named by NAIAD_TEST_IMAGE
(see docs/deploy.md, "Building the images"). CI has no Docker engine, so it skips there.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.waiting import wait_until

IMAGE = os.environ.get("NAIAD_TEST_IMAGE", "")

pytestmark = pytest.mark.skipif(
    not IMAGE or shutil.which("docker") is None,
    reason="set NAIAD_TEST_IMAGE to a built naiad image (and run a Docker engine) to test the container",
)


def _docker(*args: str, timeout: float = 60.0) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"docker {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def container():
    """The image on the host network with free ports (works with or without a bridge network)."""
    http, grpc, metrics = _free_port(), _free_port(), _free_port()
    name = f"naiad-test-{uuid.uuid4().hex[:8]}"
    _docker(
        "run", "-d", "--name", name, "--network", "host", "-e", f"NAIAD_HEALTH_PORT={http}",
        IMAGE, "--model-repository=/models", f"--http-port={http}", f"--grpc-port={grpc}",
        f"--metrics-port={metrics}", "--exit-timeout-secs=20",
    )
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http}")

        def ready() -> bool:
            try:
                return client.is_server_ready()
            except Exception:
                return False

        wait_until(ready, "the container's server to be ready", timeout=90, interval=0.5)
        yield name, http, grpc
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)


def _add_sub_inputs(module):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.float32)
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return a, b, inputs


def test_runs_as_non_root_user(container):
    name, _, _ = container
    assert _docker("exec", name, "id", "-u") == "10001"
    assert json.loads(_docker("inspect", "--format", "{{json .Config.User}}", name)) == "10001:10001"


def test_serves_example_models_over_http_and_grpc(container):
    _, http, grpc = container
    a, b, inputs = _add_sub_inputs(httpclient)
    result = httpclient.InferenceServerClient(f"127.0.0.1:{http}").infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    a, b, inputs = _add_sub_inputs(grpcclient)
    result = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}").infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_healthcheck_reports_healthy(container):
    name, _, _ = container

    def healthy() -> bool:
        return _docker("inspect", "--format", "{{.State.Health.Status}}", name) == "healthy"

    wait_until(healthy, "HEALTHCHECK to report healthy", timeout=60, interval=0.5)


def test_sigterm_drains_and_exits_zero(container):
    """Last in the module: `docker stop` sends SIGTERM; the server drains and exits 0."""
    name, _, _ = container
    _docker("stop", "--time", "30", name, timeout=60)
    assert _docker("inspect", "--format", "{{.State.ExitCode}}", name) == "0"
    assert "NAIAD_READY" in subprocess.run(["docker", "logs", name], capture_output=True, text=True).stdout
