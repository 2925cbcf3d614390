"""The judged check of `naiad perf`: pointed at Naiad and at real Triton 2.51 (Python-backend add_sub), its
request counts must equal the server's own statistics within 1% and its throughput the server's counters
within 5%. Triton runs only where its venv exists (benchmarks/start_triton.sh); CI has none, so the Triton
half is skipped there with the reason."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from naiad.tools.perf import PerfOptions, run_perf
from naiad.tools.v2client import HttpControl
from tests.support.servers import start_server
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
TRITON_SCRIPT = ROOT / "benchmarks" / "start_triton.sh"
TRITON_VENV = Path(os.environ.get("TRITON_VENV", ROOT / ".venv-triton"))  # as benchmarks/start_triton.sh

CONFIG = """backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
MODEL_PY = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return responses
"""


def python_add_sub(repo: Path) -> Path:
    (repo / "add_sub" / "1").mkdir(parents=True)
    (repo / "add_sub" / "config.pbtxt").write_text(CONFIG)
    (repo / "add_sub" / "1" / "model.py").write_text(MODEL_PY)
    return repo


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Endpoint:
    def __init__(self, http: str, grpc: str, metrics: str) -> None:
        self.http, self.grpc, self.metrics = http, grpc, metrics


def start_triton(repo: Path, log: Path) -> tuple[subprocess.Popen, Endpoint]:
    http, grpc, metrics = free_port(), free_port(), free_port()
    process = subprocess.Popen(["bash", str(TRITON_SCRIPT), str(repo), str(http), str(grpc), str(metrics)],
                               stdout=log.open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True)

    def ready() -> bool:  # polled: Triton prints no machine-readable start line
        if process.poll() is not None:
            raise RuntimeError(f"tritonserver exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/add_sub/ready", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    try:
        wait_until(ready, "tritonserver to be ready", timeout=180, interval=0.2)
    except AssertionError:
        os.killpg(process.pid, signal.SIGKILL)
        raise RuntimeError(f"tritonserver not ready in 180 s:\n{log.read_text()[-3000:]}") from None
    return process, Endpoint(f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", f"127.0.0.1:{metrics}")


def stop_triton(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


@pytest.fixture(scope="module", params=["naiad", "triton"])
def endpoint(request, tmp_path_factory) -> Iterator[Endpoint]:
    repo = python_add_sub(tmp_path_factory.mktemp(f"{request.param}_repo"))
    if request.param == "naiad":
        with start_server(repo) as server:
            yield Endpoint(server.http_url, server.grpc_url, f"127.0.0.1:{server.metrics_port}")
        return
    if not (TRITON_VENV / "bin" / "python").exists():
        pytest.skip(f"real Triton needs its venv at {TRITON_VENV} (benchmarks/start_triton.sh sets it up); "
                    "CI has none")
    process, triton = start_triton(repo, tmp_path_factory.mktemp("triton_log") / "tritonserver.log")
    try:
        yield triton
    finally:
        stop_triton(process)


def server_success(http_url: str) -> int:
    control = HttpControl(http_url)
    try:
        return control.stats("add_sub").success_count
    finally:
        control.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_counts_and_throughput_match_the_servers_statistics(endpoint, protocol):
    before = server_success(endpoint.http)
    options = PerfOptions(model="add_sub", url=endpoint.http if protocol == "http" else endpoint.grpc,
                          protocol=protocol, concurrency_range=(1, 4, 3), batch_size=2, measurement_interval_ms=1000,
                          stability_percentage=50, max_trials=6, warmup_request_count=20, progress="off")
    with open(os.devnull, "w") as sink:
        result = run_perf(options, out=sink)
    after = server_success(endpoint.http)
    # the whole run: every request the tool completed is one the server counted (bar: within 1%)
    assert result.client_completed > 0
    assert abs(result.client_completed - (after - before)) <= 0.01 * (after - before)
    assert result.server_delta.success_count == after - before
    for level in result.levels:
        m = level.measurement
        counted = m.server_delta
        # per level: the client's count and throughput against the server's counters over the same windows
        assert abs(m.count - counted.success_count) <= max(0.01 * counted.success_count, 2 * level.value), level.label
        server_throughput = counted.inference_count / (m.duration_ns / 1e9)
        assert m.throughput == pytest.approx(server_throughput, rel=0.05), level.label
    # batch 2 per request (over the whole run: per window a request may be executed but not yet answered)
    assert result.server_delta.inference_count == 2 * result.server_delta.success_count
