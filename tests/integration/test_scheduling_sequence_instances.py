"""The real `naiad serve`: with two instances, every request of a sequence runs on the instance it started on.

The models keep their per-sequence sums inside each instance (as Triton's sequence example models
do), so a request that lands on the other instance silently starts again from zero. Each answer is
the running sum of the sequence's inputs; every one is checked, over HTTP, gRPC and a gRPC stream,
with the `direct` and `oldest` strategies, integer and string correlation IDs, and implicit state.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.servers import RunningServer, start_server

# Per-instance sums keyed by correlation ID; START, END and READY come from the sequence batcher's
# control inputs. A padding row (READY false) answers 0 and touches nothing.
ACCUMULATE_PY = """\
import numpy as np
import triton_python_backend_utils as pb_utils


def _flag(request, name):
    return bool(pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            total = np.zeros_like(value)
            if _flag(request, "READY"):
                cid = request.correlation_id()
                if _flag(request, "START"):
                    self.sums[cid] = np.zeros_like(value)
                total = self.sums.get(cid, np.zeros_like(value)) + value
                self.sums[cid] = total
                if _flag(request, "END"):
                    del self.sums[cid]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", total)]))
        return responses
"""

# The same as an async execute that reads the sum, sleeps, then writes it: a sequence's next request
# handed over before this one answered would read a stale sum.
ASYNC_ACCUMULATE_PY = ACCUMULATE_PY.replace("import numpy as np", "import asyncio\n\nimport numpy as np").replace(
    "    def execute(self, requests):", "    async def execute(self, requests):").replace(
    "                total = self.sums.get(cid, np.zeros_like(value)) + value",
    "                total = self.sums.get(cid, np.zeros_like(value)) + value\n                await asyncio.sleep(0.02)")

# Implicit state carries the sum; the instance only remembers which sequences started on it and
# refuses a request of any other (which a well-placed request never is).
STATEFUL_PY = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.started = set()

    def execute(self, requests):
        responses = []
        for request in requests:
            cid = request.correlation_id()
            start = bool(pb_utils.get_input_tensor_by_name(request, "START").as_numpy().reshape(-1)[0])
            if start:
                self.started.add(cid)
            elif cid not in self.started:
                error = pb_utils.TritonError(f"sequence {cid} did not start on this instance")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "STATE_IN").as_numpy()
            total = value + (0 if start else state)
            tensors = [pb_utils.Tensor("OUTPUT", total), pb_utils.Tensor("STATE_OUT", total)]
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses
"""

CONTROLS = """\
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]"""

STRATEGIES = {
    "direct": "direct { }",
    "oldest": "oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 1000 }",
}

VALUES = [11, 7, 5, 3, 2, 0, 1]


def _write(repo: Path, name: str, strategy: str, code: str, extra: str = "") -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(code)
    (repo / name / "config.pbtxt").write_text(f"""name: "{name}"
backend: "python"
max_batch_size: 2
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: 60000000
  {strategy}
{CONTROLS}
{extra}
}}
instance_group [ {{ kind: KIND_CPU count: 2 }} ]
""")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("sequence_instances") / "models"
    for strategy, text in STRATEGIES.items():
        _write(repo, f"sum_{strategy}", text, ACCUMULATE_PY)
    state = """  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" } } ]"""
    _write(repo, "sum_async", STRATEGIES["direct"], ASYNC_ACCUMULATE_PY)
    _write(repo, "state_direct", STRATEGIES["direct"], STATEFUL_PY, state)
    with start_server(repo) as running:
        yield running


def _plan(first_values: list[int]) -> tuple[list[list[int]], list[list[int]]]:
    """Inputs of one sequence per first value (then +VALUES or -VALUES, alternately) and the running sums."""
    inputs = [[first] + [v * (1 if k % 2 == 0 else -1) for v in VALUES] for k, first in enumerate(first_values)]
    return inputs, [[int(total) for total in np.cumsum(values)] for values in inputs]


def _http_step(client: httpclient.InferenceServerClient, model: str, cid: int | str, value: int, start: bool, end: bool) -> int:
    tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.full((1, 1), value, np.int32))
    result = client.infer(model, [tensor], sequence_id=cid, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("OUTPUT")[0, 0])


def _grpc_step(client: grpcclient.InferenceServerClient, model: str, cid: int | str, value: int, start: bool, end: bool) -> int:
    tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.full((1, 1), value, np.int32))
    result = client.infer(model, [tensor], sequence_id=cid, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("OUTPUT")[0, 0])


@pytest.mark.parametrize("model", ["sum_direct", "sum_oldest", "state_direct"])
def test_interleaved_sequences_over_http_keep_their_sums(server: RunningServer, model: str) -> None:
    """One request at a time, round robin over three sequences (two slots of one instance, one of the other)."""
    ids = [1000, 1001, "1002"]
    inputs, expected = _plan([0, 100, 20])
    answers: list[list[int]] = [[] for _ in ids]
    with httpclient.InferenceServerClient(server.http_url) as client:
        for step in range(len(inputs[0])):
            for k, cid in enumerate(ids):
                last = step == len(inputs[k]) - 1
                answers[k].append(_http_step(client, model, cid, inputs[k][step], step == 0, last))
    assert answers == expected


@pytest.mark.parametrize("model", ["sum_direct", "sum_oldest", "sum_async", "state_direct"])
def test_concurrent_sequences_over_grpc_keep_their_sums(server: RunningServer, model: str) -> None:
    """Four clients, one sequence each, all at once: the two instances execute in parallel."""
    ids = [2000, 2001, 2002, "2003"]
    inputs, expected = _plan([1, 100, 20, 7])

    def run(k: int) -> list[int]:
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            return [_grpc_step(client, model, ids[k], value, step == 0, step == len(inputs[k]) - 1)
                    for step, value in enumerate(inputs[k])]

    with ThreadPoolExecutor(len(ids)) as pool:
        assert list(pool.map(run, range(len(ids)))) == expected


@pytest.mark.parametrize("model", ["sum_direct", "sum_oldest", "sum_async"])
def test_sequences_sent_at_once_on_a_grpc_stream_keep_their_sums(server: RunningServer, model: str) -> None:
    """Every request of three sequences sent without waiting, on one stream; answers matched by request id."""
    ids = [3000, 3001, "3002"]
    inputs, expected = _plan([0, 100, 20])
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for k, cid in enumerate(ids):
            for step, value in enumerate(inputs[k]):
                tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                tensor.set_data_from_numpy(np.full((1, 1), value, np.int32))
                client.async_stream_infer(model, [tensor], request_id=f"{k}_{step}", sequence_id=cid,
                                          sequence_start=step == 0, sequence_end=step == len(inputs[k]) - 1)
        got: dict[str, int] = {}
        for _ in range(sum(len(i) for i in inputs)):
            result, error = answers.get(timeout=60)
            assert error is None, error
            got[result.get_response().id] = int(result.as_numpy("OUTPUT")[0, 0])
        client.stop_stream()
    assert [[got[f"{k}_{step}"] for step in range(len(inputs[k]))] for k in range(len(ids))] == expected


def test_a_lone_sequence_stays_on_its_instance(server: RunningServer) -> None:
    """Nothing else running: the idle other instance must not take the sequence's next request."""
    with httpclient.InferenceServerClient(server.http_url) as client:
        for cid in (9, 10):
            assert [_http_step(client, "sum_direct", cid, v, i == 0, i == 3) for i, v in enumerate((4, 5, 6, 7))] == [4, 9, 15, 22]
