"""Graceful scale-down as Kubernetes drives it: on SIGTERM readiness goes false first (so the Service stops
sending traffic) while accepted requests finish, then the process exits 0."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request

import tritonclient.grpc as grpcclient

from tests.support.onnx_models import slow_model
from tests.support.servers import start_server


def _ready_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except (urllib.error.URLError, ConnectionError):
        return None


def test_sigterm_turns_readiness_off_before_in_flight_requests_finish(tmp_path):
    slow_model(tmp_path, "slow", matmuls=32)
    server = start_server(tmp_path)
    results: list[tuple[int, float]] = []

    def call(value: float) -> None:
        body = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [value]}]}).encode()
        request = urllib.request.Request(f"http://{server.http_url}/v2/models/slow/infer", data=body)
        with urllib.request.urlopen(request, timeout=60) as response:
            results.append((response.status, json.loads(response.read())["outputs"][0]["data"][0]))

    try:
        assert _ready_status(server.http_url) == 200
        threads = [threading.Thread(target=call, args=(v,)) for v in (5.0, 6.0)]
        for thread in threads:
            thread.start()
        # the single instance runs one request while the other waits: both are accepted and in flight
        deadline = time.monotonic() + 30
        queued = False
        while time.monotonic() < deadline and not queued:
            text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).read().decode()
            queued = 'nv_inference_pending_request_count{model="slow",version="1"} 1' in text
        assert queued, "the second request never queued behind the first"

        server.process.send_signal(signal.SIGTERM)
        seen_not_ready = False
        in_flight_then = 0
        grpc_ready_then = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and server.process.poll() is None:
            if _ready_status(server.http_url) == 400:
                in_flight_then = sum(thread.is_alive() for thread in threads)
                client = grpcclient.InferenceServerClient(server.grpc_url)
                grpc_ready_then = client.is_server_ready(client_timeout=5)
                client.close()
                seen_not_ready = True
                break
        assert seen_not_ready, "readiness never went false while the server was draining"
        assert in_flight_then >= 1, "readiness went false only after the requests had finished"
        assert grpc_ready_then is False
        for thread in threads:
            thread.join(60)
        assert sorted((status, round(value)) for status, value in results) == [(200, 5), (200, 6)]
        assert server.process.wait(60) == 0
    finally:
        server.stop()
