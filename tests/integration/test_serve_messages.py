"""What `naiad serve` tells a new user: start-up summary, the usual mistakes, shutdown.

Each test runs the real `naiad serve` process and asserts its messages and exit codes."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.onnx_models import add_sub_model, slow_model, write_config
from tests.support.servers import post_json, start_server, wait_for_line
from tests.support.waiting import wait_until

FREE_PORTS = ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]


def _run(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "naiad", "serve", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """add_sub (loads), broken (a config that does not parse), raiser (a Python model whose initialize raises)."""
    root = tmp_path_factory.mktemp("repo")
    add_sub_model(root, "add_sub")
    write_config(root / "broken", 'name: "broken"\nbackend: "onnxruntime"\nmax_batch_size: nope\n')
    (root / "broken" / "1").mkdir()
    raiser = root / "raiser"
    write_config(raiser, 'name: "raiser"\nbackend: "python"\n'
                 'input [{ name: "X" data_type: TYPE_FP32 dims: [1] }]\noutput [{ name: "Y" data_type: TYPE_FP32 dims: [1] }]\n')
    (raiser / "1").mkdir()
    (raiser / "1" / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        raise RuntimeError('init exploded')\n"
        "    def execute(self, requests):\n"
        "        return []\n")
    return root


def test_start_up_prints_version_settings_model_table_and_endpoints(repo):
    with start_server(repo, "--exit-timeout-secs", "7", "--http-thread-count", "4") as server:
        log = "".join(server.output)
    from naiad import __version__

    assert f"Naiad {__version__}" in log
    # only what differs from the defaults, with the flag's name
    assert "| --exit-timeout-secs " in log and "| 7 " in log
    assert "--log-verbose" not in log
    assert "--http-thread-count is ignored" in log  # a tritonserver flag Naiad has nothing to do with
    # Triton's model table, with the failures' reasons
    assert "| Model " in log and "| Version | Status" in log
    assert "| add_sub " in log and "| READY " in log
    broken_row = next(line for line in log.splitlines() if line.startswith("| broken "))
    assert "UNAVAILABLE" in broken_row and "nope" in broken_row
    raiser_row = next(line for line in log.splitlines() if line.startswith("| raiser "))
    assert "UNAVAILABLE" in raiser_row and "init exploded" in raiser_row
    # the reason's traceback continues on rows of its own, not squeezed with literal \n
    assert any(line.startswith("|") and "model.py(3): initialize" in line for line in log.splitlines()), log
    assert "1 model ready, 2 failed" in log
    assert "loaded 1/3 models, 2 failed" in log  # progress counts loaded and failed apart
    assert f"HTTP/REST http://127.0.0.1:{server.http_port}/v2" in log
    assert f"gRPC 127.0.0.1:{server.grpc_port}" in log and f"metrics http://127.0.0.1:{server.metrics_port}/metrics" in log
    assert "\\n" not in "".join(line for line in log.splitlines() if line.startswith("|"))


def test_model_directory_given_as_repository_names_the_parent(repo):
    process = _run("--model-repository", str(repo / "add_sub"), *FREE_PORTS)
    assert process.returncode == 1
    assert f"--model-repository {repo / 'add_sub'} is a model directory" in process.stderr
    assert "config.pbtxt" in process.stderr and "version folder 1" in process.stderr
    assert f"--model-repository {repo}" in process.stderr.replace(f"{repo}/add_sub", "")
    assert "Traceback" not in process.stderr


def test_port_in_use_fails_before_loading_and_names_the_flag(repo):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = _run("--model-repository", str(repo), "--http-address", "127.0.0.1", "--http-port", str(port),
                       "--grpc-port", "0", "--metrics-port", "0")
    assert process.returncode == 1
    assert f"--http-port {port} is in use" in process.stderr
    assert "--http-port 0 picks a free one" in process.stderr
    output = process.stdout + process.stderr
    assert "loaded" not in output and "| Model" not in output  # no model was loaded for nothing
    assert "exit timeout" not in output and "in flight" not in output


def test_two_endpoints_on_one_port_are_refused(repo):
    process = _run("--model-repository", str(repo), "--http-port", "0", "--grpc-port", "18123", "--metrics-port", "18123")
    assert process.returncode == 1
    assert "--metrics-port 18123 is also --grpc-port" in process.stderr


def test_no_repository_prints_usage_and_exits_2():
    process = _run()
    assert process.returncode == 2
    assert process.stderr.startswith("usage: naiad serve --model-repository PATH")
    assert "--model-repository is required" in process.stderr


def test_empty_repository_is_a_warning(tmp_path):
    with start_server(tmp_path) as server:
        log = "".join(server.output)
    assert f"model repository '{tmp_path}' has no model directories" in log
    assert "0 models ready, 0 failed" in log


def test_help_shows_required_repository_and_every_default():
    process = _run("--help")
    assert process.returncode == 0
    assert process.stdout.startswith("usage: naiad serve --model-repository PATH [options]")
    assert process.stdout.index("required:\n  --model-repository PATH") < process.stdout.index("  --http-port")
    for flag in ("--model-control-mode", "--exit-timeout-secs", "--repository-poll-secs", "--log-verbose"):
        block = process.stdout.split(f"  {flag} ", 1)[1].split("\n  --", 1)[0]
        assert "(default: " in " ".join(block.split()), (flag, block)


def _two_in_flight(server, results: list) -> list[threading.Thread]:
    """Two requests to the one-instance `slow` model: one executing, one queued behind it."""
    def call(value: float) -> None:
        try:
            results.append(post_json(f"http://{server.http_url}/v2/models/slow/infer",
                                     {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [value]}]}, 300))
        except OSError as exc:  # a forced exit closes the connection
            results.append(exc)

    callers = [threading.Thread(target=call, args=(v,)) for v in (1.0, 2.0)]
    for caller in callers:
        caller.start()
    wait_until(lambda: 'nv_inference_pending_request_count{model="slow",version="1"} 1' in urllib.request.urlopen(
        f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode(),
        "the second request to queue behind the first", timeout=60)
    return callers


def test_sigterm_logs_the_drain_and_a_second_signal_exits_at_once(tmp_path):
    slow_model(tmp_path, "slow", matmuls=200)  # seconds per request: still running at the second signal
    server = start_server(tmp_path, "--exit-timeout-secs", "600")
    results: list = []
    callers = _two_in_flight(server, results)
    server.process.send_signal(signal.SIGTERM)
    wait_for_line(server, "draining 2 request(s) (up to 600 s)", timeout=30)
    sent = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(60) == 128 + signal.SIGTERM
    assert time.monotonic() - sent < 60  # not the 600 s exit timeout
    for caller in callers:
        caller.join(60)
    log = "".join(server.output)
    assert "received SIGTERM: shutting down (send it again to exit at once)" in log
    assert "received SIGTERM again: cancelling" in log and "exiting now" in log
    assert "exited without draining" in log
    assert len(results) == 2 and not any(isinstance(r, tuple) and r[0] == 200 for r in results)


def test_sigint_drain_completes_and_says_so(tmp_path):
    slow_model(tmp_path, "slow", matmuls=24)
    server = start_server(tmp_path)
    results: list = []
    callers = _two_in_flight(server, results)
    server.process.send_signal(signal.SIGINT)
    for caller in callers:
        caller.join(120)
    assert server.process.wait(60) == 0
    log = "".join(server.output)
    assert "received SIGINT: shutting down (send it again to exit at once)" in log
    assert "draining 2 request(s) (up to 30 s)" in log and "drained 2 request(s) in" in log
    assert sorted(r[0] for r in results) == [200, 200]
    assert "exit timeout" not in log
