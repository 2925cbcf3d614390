"""The real `naiad serve`: hundreds of queued gRPC requests whose deadlines pass all leave the queue.

The model's only instance is held busy; QUEUED requests fill its bounded queue, their client
deadlines expire, and then: the pending-request metric is back to 0, the queue admits new
requests again (the cancelled ones no longer count against max_queue_size), and once the
instance is free every live request is answered.
"""

from __future__ import annotations

import re
import threading
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support.servers import RunningServer, client_error, start_server
from tests.support.waiting import wait_until

QUEUED = 400

# Runs while the gate file exists (the test removes it); marks that it started.
GATED_PY = """\
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json
        params = json.loads(args["model_config"])["parameters"]
        self.gate = params["GATE_FILE"]["string_value"]

    def execute(self, requests):
        open(self.gate + ".started", "w").close()
        while os.path.exists(self.gate):
            time.sleep(0.01)  # model code: holds its instance until the test removes the gate
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2)])
                for r in requests]
"""


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cancel_flood_gate") / "gate"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, gate: Path) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("cancel_flood") / "models"
    (repo / "gated" / "1").mkdir(parents=True)
    (repo / "gated" / "1" / "model.py").write_text(GATED_PY)
    (repo / "gated" / "config.pbtxt").write_text(f"""backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
dynamic_batching {{ default_queue_policy {{ max_queue_size: {QUEUED} }} }}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "GATE_FILE" value: {{ string_value: "{gate}" }} }}
""")
    with start_server(repo) as running:
        yield running


def _pending(server: RunningServer) -> int:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    match = re.search(r'^nv_inference_pending_request_count\{model="gated",version="1"\} (\d+)', text, re.M)
    assert match is not None, text
    return int(match.group(1))


def _inputs(value: float) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("X", [1], "FP32")
    tensor.set_data_from_numpy(np.array([value], np.float32))
    return [tensor]


def test_queued_requests_past_their_deadline_leave_the_queue(server: RunningServer, gate: Path) -> None:
    gate.touch()
    answers: dict[str, object] = {}
    done = threading.Event()

    def record(key: str, result=None, error=None) -> None:  # tritonclient passes result= and error=
        answers[key] = error if error is not None else float(result.as_numpy("Y")[0])
        if len(answers) == QUEUED + 2:
            done.set()

    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        try:
            client.async_infer("gated", _inputs(1), partial(record, "busy"))
            wait_until(lambda: Path(f"{gate}.started").exists(), "the instance is busy", timeout=60, interval=0.05)
            for k in range(QUEUED):
                client.async_infer("gated", _inputs(2), partial(record, f"q{k}"), client_timeout=3)
            wait_until(lambda: _pending(server) == QUEUED, f"{QUEUED} requests queued", timeout=60, interval=0.05)
            error = client_error(client.infer, "gated", _inputs(3))
            assert "Exceeds maximum queue size" in str(error)
            # Their deadlines pass: every one leaves the queue.
            wait_until(lambda: _pending(server) == 0, "the timed-out requests left the queue", timeout=60, interval=0.05)
            client.async_infer("gated", _inputs(4), partial(record, "after"))
            wait_until(lambda: _pending(server) == 1, "a new request is admitted", timeout=60, interval=0.05)
        finally:
            gate.unlink(missing_ok=True)
        assert done.wait(60), f"{QUEUED + 2 - len(answers)} requests never answered"
    assert answers["busy"] == 2.0 and answers["after"] == 8.0
    timed_out = [answers[f"q{k}"] for k in range(QUEUED)]
    assert all("Deadline" in str(e) or "DEADLINE" in str(e) for e in timed_out), timed_out[:3]
    assert _pending(server) == 0
