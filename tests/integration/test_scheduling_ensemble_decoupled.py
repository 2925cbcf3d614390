"""The real `naiad serve`: an ensemble with a decoupled step is decoupled and streams over gRPC.

Pipeline: counter (Python, decoupled: COUNT responses VALUE=0..COUNT-1) -> plus (ONNX, +100).
Each counter response runs `plus` separately and becomes one ensemble response (RAW, OUT).
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import helper, numpy_helper

from tests.support.onnx_models import _save, _tensor
from tests.support.python_models import COUNTER_CONFIG, COUNTER_PY
from tests.support.servers import RunningServer, client_error, start_server

WAIT = 30.0

PLUS_CONFIG = """\
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# Not declared decoupled: the decoupled step makes it so.
ENSEMBLE_CONFIG = """\
platform: "ensemble"
max_batch_size: 0
input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "RAW" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "counter" model_version: -1 input_map { key: "COUNT" value: "COUNT" } output_map { key: "VALUE" value: "RAW" } },
  { model_name: "plus" model_version: -1 input_map { key: "X" value: "RAW" } output_map { key: "Y" value: "OUT" } }
] }
"""

# Two decoupled steps feeding one step: their responses cannot be paired, so the load fails.
MIXED_CONFIG = """\
platform: "ensemble"
max_batch_size: 0
input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "counter" model_version: -1 input_map { key: "COUNT" value: "COUNT" } output_map { key: "VALUE" value: "R1" } },
  { model_name: "counter" model_version: -1 input_map { key: "COUNT" value: "COUNT" } output_map { key: "VALUE" value: "R2" } },
  { model_name: "join" model_version: -1 input_map [ { key: "A" value: "R1" }, { key: "B" value: "R2" } ] output_map { key: "C" value: "OUT" } }
] }
"""


JOIN_CONFIG = """\
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "A" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "B" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "C" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def _join_onnx(path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Add", ["A", "B"], ["C"])], "join",
        [_tensor("A", "INT32", [1]), _tensor("B", "INT32", [1])], [_tensor("C", "INT32", [1])],
    )
    _save(helper.make_model(graph), path)


def _plus_onnx(path: Path) -> None:
    hundred = numpy_helper.from_array(np.array([100], np.int32), "HUNDRED")
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "HUNDRED"], ["Y"])], "plus",
        [_tensor("X", "INT32", [1])], [_tensor("Y", "INT32", [1])], initializer=[hundred],
    )
    _save(helper.make_model(graph), path)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo: Path = tmp_path_factory.mktemp("ensemble_decoupled") / "models"
    for name, config in (("counter", COUNTER_CONFIG), ("plus", PLUS_CONFIG), ("join", JOIN_CONFIG), ("pipeline", ENSEMBLE_CONFIG), ("mixed", MIXED_CONFIG)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
    (repo / "counter" / "1" / "model.py").write_text(COUNTER_PY)
    _plus_onnx(repo / "plus" / "1" / "model.onnx")
    _join_onnx(repo / "join" / "1" / "model.onnx")
    with start_server(repo, "--exit-on-error=false") as running:
        yield running


def _stream(server: RunningServer, count: int) -> list[tuple[dict[str, list[int]] | str, bool]]:
    """Every message of one stream request: (outputs or error text, final flag)."""
    messages: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: messages.put((result, error)))
        tensor = grpcclient.InferInput("COUNT", [1], "INT32")
        tensor.set_data_from_numpy(np.array([count], np.int32))
        client.async_stream_infer("pipeline", [tensor], request_id=f"r{count}", enable_empty_final_response=True)
        seen: list[tuple[dict[str, list[int]] | str, bool]] = []
        while True:
            result, error = messages.get(timeout=WAIT)
            if error is not None:
                seen.append((str(error), True))
                break
            response = result.get_response()
            assert response.id == f"r{count}"
            final = response.parameters["triton_final_response"].bool_param
            seen.append(({o.name: result.as_numpy(o.name).tolist() for o in response.outputs}, final))
            if final:
                break
        client.stop_stream()
    return seen


def test_a_decoupled_step_makes_the_ensemble_decoupled(server: RunningServer) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.get_model_config("pipeline").config.model_transaction_policy.decoupled is True
        tensor = grpcclient.InferInput("COUNT", [1], "INT32")
        tensor.set_data_from_numpy(np.array([2], np.int32))
        assert "decoupled" in client_error(client.infer, "pipeline", [tensor]).message()
    with httpclient.InferenceServerClient(server.http_url) as client:
        tensor = httpclient.InferInput("COUNT", [1], "INT32")
        tensor.set_data_from_numpy(np.array([2], np.int32))
        assert "decoupled" in client_error(client.infer, "pipeline", [tensor]).message()


def test_each_response_of_the_decoupled_step_streams_through_the_pipeline(server: RunningServer) -> None:
    seen = _stream(server, 3)
    data = [outputs for outputs, _ in seen if outputs]
    assert data == [{"OUT": [100 + i], "RAW": [i]} for i in range(3)] or \
        sorted(data, key=lambda o: o["RAW"]) == [{"OUT": [100 + i], "RAW": [i]} for i in range(3)]
    assert [final for _, final in seen] == [False] * (len(seen) - 1) + [True]
    assert len(seen) in (3, 4)  # the final flag rides on the last response, or comes alone


def test_zero_responses_give_only_the_final_flag(server: RunningServer) -> None:
    assert _stream(server, 0) == [({}, True)]


def test_a_step_error_ends_the_stream_naming_the_step(server: RunningServer) -> None:
    seen = _stream(server, -1)
    assert len(seen) == 1
    assert "in ensemble 'pipeline', step 0 ('counter')" in seen[0][0] and "count must not be negative" in seen[0][0]


def test_a_step_mixing_two_decoupled_models_fails_the_load(server: RunningServer) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert index["pipeline"]["state"] == "READY"
        assert index["mixed"]["state"] == "UNAVAILABLE"
        assert "receives inputs originated from different decoupled models" in index["mixed"]["reason"]
