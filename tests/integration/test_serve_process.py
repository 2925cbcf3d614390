"""`naiad serve` as a process: start-up line, ports, flags, clean shutdown with in-flight requests."""

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.support.onnx_models import add_sub_model, slow_model
from tests.support.servers import start_server


def _post_json(url: str, body: dict, timeout: float = 30.0) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    add_sub_model(root, "add_sub")
    slow_model(root, "slow", matmuls=24)
    return root


def test_start_line_gives_distinct_free_ports(repo):
    with start_server(repo) as server:
        ports = {server.http_port, server.grpc_port, server.metrics_port}
        assert len(ports) == 3 and all(isinstance(p, int) and p > 0 for p in ports)
        log = "".join(server.output)
        assert f"Started HTTPService at 127.0.0.1:{server.http_port}" in log
        assert f"Started GRPCInferenceService at 127.0.0.1:{server.grpc_port}" in log
        with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=10) as response:
            assert response.status == 200
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
        assert 'nv_inference_request_success{model="add_sub",version="1"} 0' in metrics
        assert "# TYPE nv_inference_request_success counter" in metrics


def test_disabled_frontends_are_not_started(repo):
    with start_server(repo, "--allow-grpc=false", "--allow-metrics", "false") as server:
        assert server.grpc_port is None and server.metrics_port is None
        assert server.http_port


def test_sigterm_lets_in_flight_requests_finish(repo):
    server = start_server(repo)
    results: list[tuple[int, dict]] = []

    def call(value: float) -> None:
        body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [value]}]}
        results.append(_post_json(f"http://{server.http_url}/v2/models/slow/infer", body))

    threads = [threading.Thread(target=call, args=(v,)) for v in (3.0, 4.0)]
    for thread in threads:
        thread.start()
    # one request executes on the single instance, the other waits for it: both are in flight
    deadline = time.monotonic() + 30
    seen_pending = False
    while time.monotonic() < deadline and not seen_pending:
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).read().decode()
        seen_pending = 'nv_inference_pending_request_count{model="slow",version="1"} 1' in text
    assert seen_pending, "the second request never queued behind the first"
    server.process.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(30)
    assert sorted(status for status, _ in results) == [200, 200], results
    assert sorted(round(body["outputs"][0]["data"][0]) for _, body in results) == [3, 4]
    assert server.process.wait(30) == 0


def test_missing_repository_flag_is_an_error():
    process = subprocess.run([sys.executable, "-m", "naiad", "serve"], capture_output=True, text=True, timeout=60)
    assert process.returncode != 0
    assert "--model-repository is required" in process.stderr


def test_bad_flag_value_is_an_error(repo):
    process = subprocess.run(
        [sys.executable, "-m", "naiad", "serve", "--model-repository", str(repo), "--allow-http=maybe"],
        capture_output=True, text=True, timeout=60,
    )
    assert process.returncode == 2 and "expected true or false" in process.stderr


def test_unreadable_repository_is_a_start_up_error(tmp_path):
    missing = tmp_path / "does-not-exist"
    process = subprocess.run([sys.executable, "-m", "naiad", "serve", "--model-repository", str(missing),
                              "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"],
                             capture_output=True, text=True, timeout=60)
    assert process.returncode == 1 and "unable to read model repository" in process.stderr


def test_malformed_cloud_url_is_a_clear_start_up_error():
    process = subprocess.run([sys.executable, "-m", "naiad", "serve", "--model-repository", "s3://"],
                             capture_output=True, text=True, timeout=60)
    assert process.returncode == 1 and process.stderr.startswith("naiad: ") and "Traceback" not in process.stderr
