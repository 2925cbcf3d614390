"""The real `naiad serve`: TensorFlow GraphDefs whose sequence control inputs and implicit state are graph feeds.

Triton's TensorFlow sequence examples (simple_sequence, simple_dyna_sequence) are TF1 graphs with
START/END/READY/CORRID placeholders that the sequence batcher fills from `control_input`; the
graphs here have the same shape. Every answer is checked over a gRPC stream and over HTTP.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support import framework_models as fm
from tests.support.servers import RunningServer, start_server

pytest.importorskip("tensorflow")

VALUES = [11, 7, 5, 3, 2, 0, 1]


def _control(name: str, kind: str) -> str:
    return f'{{ name: "{name}" control [ {{ kind: {kind} int32_false_true: [ 0, 1 ] }} ] }}'


SIMPLE_CONTROLS = ", ".join((_control("START", "CONTROL_SEQUENCE_START"), _control("READY", "CONTROL_SEQUENCE_READY")))
DYNA_CONTROLS = ", ".join((
    _control("START", "CONTROL_SEQUENCE_START"), _control("END", "CONTROL_SEQUENCE_END"),
    _control("READY", "CONTROL_SEQUENCE_READY"),
    '{ name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }',
))


def _config(name: str, max_batch_size: int, strategy: str, controls: str, extra: str = "", count: int = 1) -> str:
    return f"""name: "{name}"
platform: "tensorflow_graphdef"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: 60000000
  {strategy}
  control_input [ {controls} ]
  {extra}
}}
instance_group [ {{ kind: KIND_CPU count: {count} }} ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("tf_sequence") / "models"
    fm.save_tf_sequence_graphdef(fm.version_dir(repo, "simple_sequence") / "model.graphdef", batching=True, dyna=False)
    fm.write_config(repo / "simple_sequence", _config("simple_sequence", 8, "direct { }", SIMPLE_CONTROLS))
    fm.save_tf_sequence_graphdef(fm.version_dir(repo, "dyna_sequence") / "model.graphdef", batching=True, dyna=True)
    fm.write_config(repo / "dyna_sequence", _config(
        "dyna_sequence", 8, "oldest { max_candidate_sequences: 6 preferred_batch_size: [ 4 ] }", DYNA_CONTROLS))
    fm.save_tf_sequence_graphdef(fm.version_dir(repo, "dyna_nobatch") / "model.graphdef", batching=False, dyna=True)
    # Without batching an instance holds one sequence: two instances for two sequences at once.
    fm.write_config(repo / "dyna_nobatch", _config("dyna_nobatch", 0, "", DYNA_CONTROLS, count=2))
    # A SavedModel whose config names no tensors: auto-complete must leave START and READY to the batcher.
    fm.save_tf_sequence_savedmodel(fm.version_dir(repo, "saved_sequence") / "model.savedmodel")
    fm.write_config(repo / "saved_sequence", f"""platform: "tensorflow_savedmodel"
max_batch_size: 8
sequence_batching {{ control_input [ {SIMPLE_CONTROLS} ] }}
""")
    # A control input the graph has no placeholder for: a load error naming it.
    fm.save_tf_sequence_graphdef(fm.version_dir(repo, "missing_control") / "model.graphdef", batching=True, dyna=False)
    fm.write_config(repo / "missing_control", _config("missing_control", 8, "direct { }", DYNA_CONTROLS))
    fm.save_tf_state_graphdef(fm.version_dir(repo, "state_sum") / "model.graphdef")
    state = """state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" } } ]"""
    fm.write_config(repo / "state_sum", _config("state_sum", 8, "direct { }", _control("START", "CONTROL_SEQUENCE_START"), state))
    with start_server(repo) as running:
        yield running


def _expected(model: str, cid: int, inputs: list[int]) -> list[int]:
    """What the graph answers for one sequence's inputs (the first request has START, the last END)."""
    if model == "state_sum":
        return [int(total) for total in np.cumsum(inputs)]
    answers = [value + (1 if step == 0 else 0) for step, value in enumerate(inputs)]
    if model not in ("simple_sequence", "saved_sequence"):
        answers[-1] += cid
    return answers


MODELS = ["simple_sequence", "dyna_sequence", "dyna_nobatch", "state_sum", "saved_sequence"]


def _shape(model: str) -> list[int]:
    return [1] if model == "dyna_nobatch" else [1, 1]


@pytest.mark.parametrize("model", MODELS)
def test_two_sequences_on_a_grpc_stream(server: RunningServer, model: str) -> None:
    """Both sequences sent at once on one stream, as Triton's sequence stream client example does."""
    sequences = {1000: [0] + VALUES, 1001: [100] + [-v for v in VALUES]}
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for cid, inputs in sequences.items():
            for step, value in enumerate(inputs):
                tensor = grpcclient.InferInput("INPUT", _shape(model), "INT32")
                tensor.set_data_from_numpy(np.full(_shape(model), value, np.int32))
                client.async_stream_infer(model, [tensor], request_id=f"{cid}_{step}", sequence_id=cid,
                                          sequence_start=step == 0, sequence_end=step == len(inputs) - 1)
        got: dict[str, int] = {}
        for _ in range(sum(len(inputs) for inputs in sequences.values())):
            result, error = answers.get(timeout=60)
            assert error is None, error
            got[result.get_response().id] = int(result.as_numpy("OUTPUT").reshape(-1)[0])
        client.stop_stream()
    for cid, inputs in sequences.items():
        assert [got[f"{cid}_{step}"] for step in range(len(inputs))] == _expected(model, cid, inputs)


@pytest.mark.parametrize("model", MODELS)
def test_interleaved_sequences_over_http(server: RunningServer, model: str) -> None:
    sequences = {7: [3, 4, 5], 8: [10, 20, 30]}
    got: dict[int, list[int]] = {cid: [] for cid in sequences}
    with httpclient.InferenceServerClient(server.http_url) as client:
        for step in range(3):
            for cid, inputs in sequences.items():
                tensor = httpclient.InferInput("INPUT", _shape(model), "INT32")
                tensor.set_data_from_numpy(np.full(_shape(model), inputs[step], np.int32))
                result = client.infer(model, [tensor], sequence_id=cid, sequence_start=step == 0, sequence_end=step == 2)
                got[cid].append(int(result.as_numpy("OUTPUT").reshape(-1)[0]))
    assert got == {cid: _expected(model, cid, inputs) for cid, inputs in sequences.items()}


def test_control_inputs_are_not_client_inputs_of_an_auto_completed_savedmodel(server: RunningServer) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        metadata = client.get_model_metadata("saved_sequence")
    assert [t["name"] for t in metadata["inputs"]] == ["INPUT"]
    assert [t["name"] for t in metadata["outputs"]] == ["OUTPUT"]


def test_a_control_input_missing_from_the_graph_fails_the_load_with_its_name(server: RunningServer) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        index = {entry["name"]: entry for entry in client.get_model_repository_index()}
        assert index["missing_control"]["state"] == "UNAVAILABLE"
        assert "'END:0' refers to a Tensor which does not exist" in index["missing_control"]["reason"]
        assert client.is_model_ready("simple_sequence")
