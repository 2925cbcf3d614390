"""Triton's own perf_analyzer (2.60) drives the real server, unchanged, over HTTP and gRPC: plain requests,
system shared memory, sequences, a decoupled model over a gRPC stream and a request-rate sweep. Each run
must succeed, and the server's statistics must count at least the requests perf_analyzer reports.

perf_analyzer is found through $NAIAD_PERF_ANALYZER (a command, e.g. a wrapper script), else at the default
install location of Triton's perf_analyzer wheel under a Debian trixie root, as a setup script leaves it:
$PERF_ANALYZER_HOME (default ~/.cache/perf-analyzer-2.60)/trixie, run through that root's own loader (the
binary needs glibc 2.38). Without either the tests are skipped with the reason."""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.onnx_models import accumulator_model, add_sub_model
from tests.support.servers import RunningServer, start_server

ECHO_CONFIG = """backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 4 ] } ]
"""
ECHO_PY = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            for _ in range(3):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def perf_analyzer_command() -> list[str] | None:
    """The command that runs perf_analyzer here, or None when it is not installed."""
    override = os.environ.get("NAIAD_PERF_ANALYZER")
    if override:
        return [override]
    home = Path(os.environ.get("PERF_ANALYZER_HOME", Path.home() / ".cache" / "perf-analyzer-2.60"))
    root = home / "trixie"
    binary, loader = root / "usr/local/bin/perf_analyzer", root / "lib64/ld-linux-x86-64.so.2"
    if binary.is_file() and loader.is_file():
        return [str(loader), "--library-path", str(root / "usr/lib/x86_64-linux-gnu"), str(binary)]
    return None


PERF_ANALYZER = perf_analyzer_command()
pytestmark = pytest.mark.skipif(
    PERF_ANALYZER is None,
    reason="perf_analyzer 2.60 is not installed: set NAIAD_PERF_ANALYZER to its command, or install it under "
    "$PERF_ANALYZER_HOME (default ~/.cache/perf-analyzer-2.60)/trixie",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("perf_analyzer_repo")
    add_sub_model(repo)
    accumulator_model(repo)
    (repo / "echo" / "1").mkdir(parents=True)
    (repo / "echo" / "config.pbtxt").write_text(ECHO_CONFIG)
    (repo / "echo" / "1" / "model.py").write_text(ECHO_PY)
    with start_server(repo) as running:
        yield running


def success_count(server: RunningServer, model: str) -> int:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/stats", timeout=30) as answer:
        return json.load(answer)["model_stats"][0]["inference_stats"]["success"]["count"]


def get_json(server: RunningServer, path: str) -> object:
    with urllib.request.urlopen(f"http://{server.http_url}{path}", timeout=30) as answer:
        return json.load(answer)


MODES = {
    "plain": ("add_sub", []),
    "shm": ("add_sub", ["--shared-memory", "system"]),
    "sequence": ("accumulator", ["--sequence-length", "4"]),
    "request_rate": ("add_sub", ["--request-rate-range", "50"]),
}


def run_perf_analyzer(server: RunningServer, protocol: str, model: str, extra: list[str]) -> int:
    """Run one short measurement; returns the client-side request count perf_analyzer reports."""
    url = server.grpc_url if protocol == "grpc" else server.http_url
    command = [*PERF_ANALYZER, "-m", model, "-u", url, "-i", protocol, "--measurement-mode", "count_windows",
               "--measurement-request-count", "20", "--max-trials", "10", "-s", "1000", *extra]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    match = re.search(r"Request count: (\d+)", output)
    assert match is not None, output[-3000:]
    return int(match.group(1))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("mode", list(MODES))
def test_perf_analyzer_modes(server: RunningServer, protocol: str, mode: str) -> None:
    model, extra = MODES[mode]
    before = success_count(server, model)
    reported = run_perf_analyzer(server, protocol, model, extra)
    assert reported > 0
    assert success_count(server, model) - before >= reported
    if mode == "shm":  # perf_analyzer unregistered what it registered
        assert get_json(server, "/v2/systemsharedmemory/status") == []
    with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=30) as answer:
        assert answer.status == 200


def test_perf_analyzer_streams_a_decoupled_model(server: RunningServer) -> None:
    before = success_count(server, "echo")
    reported = run_perf_analyzer(server, "grpc", "echo", ["--streaming"])
    assert reported > 0
    assert success_count(server, "echo") - before >= reported
