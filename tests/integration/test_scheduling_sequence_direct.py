"""The real `naiad serve`, sequence batcher `direct` strategy: slot padding and minimum_slot_utilization.

The model reports the batch it saw: ROWS (rows in the execution), ROW (this request's row, i.e.
its slot) and NREADY (rows whose READY control was true), so padding is visible from outside.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import helper, numpy_helper

from tests.support.onnx_models import _save, _tensor
from tests.support.servers import RunningServer, start_server

DELAY_S = 0.5


def _slots_model(repo: Path, name: str, max_batch_size: int, direct: str) -> None:
    zero = numpy_helper.from_array(np.zeros((1, 1), np.float32), "ZERO")
    one = numpy_helper.from_array(np.ones((1, 1), np.float32), "ONE")
    first = numpy_helper.from_array(np.array(0, np.int64), "FIRST")
    axes = numpy_helper.from_array(np.array([0], np.int64), "AXES")
    nodes = [
        helper.make_node("Mul", ["INPUT", "ZERO"], ["Z"]),
        helper.make_node("Add", ["Z", "ONE"], ["ONES"]),
        helper.make_node("Shape", ["INPUT"], ["SHAPE"]),
        helper.make_node("Gather", ["SHAPE", "FIRST"], ["B"]),
        helper.make_node("Cast", ["B"], ["BF"], to=1),
        helper.make_node("Add", ["Z", "BF"], ["ROWS"]),
        helper.make_node("CumSum", ["ONES", "FIRST"], ["COUNT"]),
        helper.make_node("Sub", ["COUNT", "ONE"], ["ROW"]),
        helper.make_node("ReduceSum", ["READY", "AXES"], ["RS"], keepdims=1),
        helper.make_node("Add", ["Z", "RS"], ["NREADY"]),
    ]
    graph = helper.make_graph(
        nodes, name,
        [_tensor("INPUT", "FP32", ["b", 1]), _tensor("READY", "FP32", ["b", 1])],
        [_tensor(n, "FP32", ["b", 1]) for n in ("ROWS", "ROW", "NREADY")],
        initializer=[zero, one, first, axes],
    )
    _save(helper.make_model(graph), repo / name / "1" / "model.onnx")
    outputs = ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [1] }}' for n in ("ROWS", "ROW", "NREADY"))
    (repo / name / "config.pbtxt").write_text(f"""name: "{name}"
backend: "onnxruntime"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [1] }} ]
output [ {outputs} ]
sequence_batching {{
  max_sequence_idle_microseconds: 30000000
  direct {{ {direct} }}
  control_input [ {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY fp32_false_true: [0, 1] }} ] }} ]
}}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
""")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("sequence_direct") / "models"
    _slots_model(repo, "slots", 4, "")
    _slots_model(repo, "slots_util", 2, f"max_queue_delay_microseconds: {int(DELAY_S * 1e6)} minimum_slot_utilization: 1.0")
    with start_server(repo) as running:
        yield running


def _send(url: str, model: str, cid: int, start: bool = False, end: bool = False) -> tuple[dict[str, float], float]:
    """One sequence request; returns what the model saw for it and the latency."""
    with httpclient.InferenceServerClient(url) as client:
        tensor = httpclient.InferInput("INPUT", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 1), np.float32))
        began = time.monotonic()
        result = client.infer(model, [tensor], sequence_id=cid, sequence_start=start, sequence_end=end)
        elapsed = time.monotonic() - began
    return {n: float(result.as_numpy(n)[0, 0]) for n in ("ROWS", "ROW", "NREADY")}, elapsed


def _batch_sizes(url: str, model: str) -> dict[int, int]:
    with httpclient.InferenceServerClient(url) as client:
        stats = client.get_inference_statistics(model)["model_stats"][0]
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}


def test_direct_batches_have_one_row_per_slot_and_pad_the_empty_ones(server: RunningServer) -> None:
    url = server.http_url
    assert _send(url, "slots", 101, start=True)[0] == {"ROWS": 1, "ROW": 0, "NREADY": 1}
    # The second sequence takes slot 1: a lone request of it still runs in row 1, slot 0 padded.
    assert _send(url, "slots", 102, start=True)[0] == {"ROWS": 2, "ROW": 1, "NREADY": 1}
    assert _send(url, "slots", 101)[0] == {"ROWS": 2, "ROW": 0, "NREADY": 1}
    assert _send(url, "slots", 101, end=True)[0] == {"ROWS": 2, "ROW": 0, "NREADY": 1}
    # Sequence 101 ended, slot 0 is free but slot 1 is still the highest in use.
    assert _send(url, "slots", 102)[0] == {"ROWS": 2, "ROW": 1, "NREADY": 1}
    # A new sequence reuses the lowest free slot.
    assert _send(url, "slots", 103, start=True)[0] == {"ROWS": 2, "ROW": 0, "NREADY": 1}
    assert _send(url, "slots", 102, end=True)[0] == {"ROWS": 2, "ROW": 1, "NREADY": 1}
    # Only slot 0 left in use: no padding row any more.
    assert _send(url, "slots", 103, end=True)[0] == {"ROWS": 1, "ROW": 0, "NREADY": 1}
    assert _batch_sizes(url, "slots") == {1: 2, 2: 6}


def test_minimum_slot_utilization_waits_for_ready_slots_or_the_delay(server: RunningServer) -> None:
    url = server.http_url
    seen, elapsed = _send(url, "slots_util", 201, start=True)
    assert seen == {"ROWS": 1, "ROW": 0, "NREADY": 1}
    assert elapsed >= DELAY_S * 0.9, "a lone request below the minimum utilization waits for the queue delay"
    seen, elapsed = _send(url, "slots_util", 202, start=True)
    assert seen == {"ROWS": 2, "ROW": 1, "NREADY": 1} and elapsed >= DELAY_S * 0.9
    # Both slots ready: the batch is full and runs at once, both requests in one execution.
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda cid: _send(url, "slots_util", cid, end=True), (201, 202)))
    for (seen, elapsed), row in zip(results, (0, 1)):
        assert seen == {"ROWS": 2, "ROW": row, "NREADY": 2}
        assert elapsed < DELAY_S * 0.8


def test_a_refused_sequence_request_answers_on_the_grpc_stream(server: RunningServer) -> None:
    """Scheduler refusals (here: no START for a new sequence) reach a streaming client as an error."""
    messages: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: messages.put((result, error)))
        tensor = grpcclient.InferInput("INPUT", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 1), np.float32))
        client.async_stream_infer("slots", [tensor], sequence_id=999)
        result, error = messages.get(timeout=30)
        client.stop_stream()
    assert result is None and "must specify the START flag on the first request of the sequence" in str(error)
