"""The real `naiad serve`: stateful ONNX and TorchScript models whose instance runs in a worker process
(INSTANCE_PROCESS) under the sequence batcher, with the `direct` and `oldest` strategies.

The models sum a sequence's inputs through implicit state (STATE_IN/STATE_OUT), restart the sum on
START and echo CORRID: interleaved sequences each get their own running sum. A worker killed in the
middle of a sequence (between two of its requests, or while it executes one) fails that sequence
clearly (its instance lost what it held), and sequences started afterwards are served by the restarted
worker.
"""

from __future__ import annotations

import os
import signal
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.onnx_models import accumulator_model, write_config
from tests.support.process_tree import descendants, kill_while_executing
from tests.support.servers import RunningServer, start_server
from tests.support.waiting import wait_until

pytest.importorskip("onnxruntime")

PROCESS = '\nparameters { key: "INSTANCE_PROCESS" value: { string_value: "true" } }\n'
STRATEGIES = {
    "direct": "direct { }",
    "oldest": "oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 2000 }",
}


@pytest.fixture(scope="module", params=sorted(STRATEGIES))
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp(f"process_sequences_{request.param}")
    model_dir = accumulator_model(repo, "acc", STRATEGIES[request.param], idle_us=60_000_000)
    with (model_dir / "config.pbtxt").open("a") as config:
        config.write(PROCESS)
    with start_server(repo, timeout=180) as running:
        yield running


def _step(client: httpclient.InferenceServerClient, cid: int, value: float, start: bool = False,
          end: bool = False) -> tuple[float, int]:
    tensor = httpclient.InferInput("INPUT", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.full((1, 1), value, np.float32))
    result = client.infer("acc", [tensor], sequence_id=cid, sequence_start=start, sequence_end=end)
    return float(result.as_numpy("OUTPUT").item()), int(result.as_numpy("CID").item())


def _worker(server: RunningServer, not_this: int = 0) -> int:
    """The pid of the model's (one) worker process, once there is exactly one other than `not_this`."""
    def found() -> int:
        pids = [pid for pid in descendants(server.process.pid) if pid != not_this]
        return pids[0] if len(pids) == 1 else 0
    return wait_until(found, "the instance's worker process", timeout=120)


def test_interleaved_sequences_carry_their_state_through_the_worker(server: RunningServer) -> None:
    values = {cid: [float(cid), 1.0, 2.0, 0.5] for cid in (101, 102, 103)}

    def run(cid: int) -> list[tuple[float, int]]:
        client = httpclient.InferenceServerClient(server.http_url)
        steps = values[cid]
        return [_step(client, cid, v, start=i == 0, end=i == len(steps) - 1) for i, v in enumerate(steps)]

    with ThreadPoolExecutor(3) as pool:
        answers = dict(zip(values, pool.map(run, values)))
    for cid, steps in values.items():
        assert answers[cid] == [(float(s), cid) for s in np.cumsum(steps)]

    # The same over gRPC, and a correlation ID reused after END starts again from zero.
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("INPUT", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.full((1, 1), 4.0, np.float32))
    sums = [float(grpc.infer("acc", [tensor], sequence_id=101, sequence_start=i == 0, sequence_end=i == 1)
                  .as_numpy("OUTPUT").item()) for i in range(2)]
    assert sums == [4.0, 8.0]
    assert server.process.pid not in descendants(server.process.pid) and len(descendants(server.process.pid)) == 1


def test_a_worker_killed_mid_sequence_fails_that_sequence_clearly_and_later_ones_are_served(
        server: RunningServer) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    assert _step(http, 201, 1.0, start=True) == (1.0, 201)
    assert _step(http, 201, 2.0) == (3.0, 201)
    victim = _worker(server)
    os.kill(victim, signal.SIGKILL)

    with pytest.raises(InferenceServerException) as lost:  # the worker is gone, or was replaced meanwhile
        _step(http, 201, 4.0)
    assert "201" in str(lost.value) or "not healthy" in str(lost.value), str(lost.value)

    replacement = _worker(server, not_this=victim)
    assert replacement != victim

    def serves() -> bool:
        try:
            return _step(http, 202, 5.0, start=True) == (5.0, 202)
        except InferenceServerException:
            return False  # still restarting: requests fail fast until the new worker is ready

    wait_until(serves, "a new sequence served by the restarted worker", timeout=120)
    assert _step(http, 202, 1.5) == (6.5, 202)
    assert _step(http, 202, 0.5, end=True) == (7.0, 202)

    # The interrupted sequence does not go on as if nothing happened: its instance lost what it held.
    with pytest.raises(InferenceServerException) as after:
        _step(http, 201, 8.0)
    assert "201" in str(after.value), str(after.value)
    # Started again, it is a sequence like any other.
    assert _step(http, 201, 2.0, start=True) == (2.0, 201)
    assert _step(http, 201, 3.0, end=True) == (5.0, 201)
    assert server.process.poll() is None and http.is_server_live()


TORCH_CONFIG = """
name: "acc_torch"
backend: "pytorch"
max_batch_size: 4
input [
  { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "LOOPS" data_type: TYPE_INT64 dims: [ 1 ] }
]
output [
  { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "CID" data_type: TYPE_INT64 dims: [ 1 ] }
]
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  direct { }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT64 } ] }
  ]
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 1 ]
            initial_state { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: "zero" } } ]
}
instance_group [ { count: 1 kind: KIND_CPU } ]
""" + PROCESS


@pytest.fixture(scope="module")
def torch_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    torch = pytest.importorskip("torch")

    class Accumulate(torch.nn.Module):
        """OUTPUT = STATE_IN * (1 - START) + INPUT after LOOPS turns of a scalar loop; CORRID echoed; the
        sequence batcher's controls and state are forward() arguments by name, as Triton's PyTorch backend has them."""

        def forward(self, INPUT: torch.Tensor, LOOPS: torch.Tensor, START: torch.Tensor, CORRID: torch.Tensor,
                    STATE_IN: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            spin = torch.zeros(1)
            for _ in range(int(LOOPS.max().item())):
                spin = spin + 1.0
            total = STATE_IN * (1.0 - START) + INPUT + spin * 0.0
            return total, CORRID, total

    model_dir = tmp_path_factory.mktemp("process_sequences_torch") / "acc_torch"
    (model_dir / "1").mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`torch.jit.script` is deprecated", category=DeprecationWarning)
        torch.jit.script(Accumulate().eval()).save(str(model_dir / "1" / "model.pt"))
    write_config(model_dir, TORCH_CONFIG)
    with start_server(model_dir.parent, timeout=180) as running:
        yield running


def _torch_step(url: str, cid: int, value: float, start: bool = False, end: bool = False,
                loops: int = 0) -> tuple[float, int]:
    client = httpclient.InferenceServerClient(url, network_timeout=300)
    inputs = [httpclient.InferInput("INPUT", [1, 1], "FP32"), httpclient.InferInput("LOOPS", [1, 1], "INT64")]
    inputs[0].set_data_from_numpy(np.full((1, 1), value, np.float32))
    inputs[1].set_data_from_numpy(np.full((1, 1), loops, np.int64))
    result = client.infer("acc_torch", inputs, sequence_id=cid, sequence_start=start, sequence_end=end)
    return float(result.as_numpy("OUTPUT").item()), int(result.as_numpy("CID").item())


def test_a_torchscript_sequence_model_in_a_worker_survives_a_worker_killed_while_executing(
        torch_server: RunningServer) -> None:
    url = torch_server.http_url
    with ThreadPoolExecutor(2) as pool:  # two interleaved sequences, each with its own sum
        first = pool.submit(lambda: [_torch_step(url, 301, v, start=i == 0, end=i == 2) for i, v in enumerate((1, 2, 3))])
        second = pool.submit(lambda: [_torch_step(url, 302, v, start=i == 0, end=i == 2) for i, v in enumerate((5, 5, 5))])
        assert first.result() == [(1.0, 301), (3.0, 301), (6.0, 301)]
        assert second.result() == [(5.0, 302), (10.0, 302), (15.0, 302)]

    assert _torch_step(url, 303, 1.0, start=True) == (1.0, 303)
    victim = _worker(torch_server)
    error = kill_while_executing(victim, lambda: _torch_step(url, 303, 2.0, loops=10**9))
    assert isinstance(error, InferenceServerException) and "not healthy" in str(error), error

    _worker(torch_server, not_this=victim)

    def serves() -> bool:
        try:
            return _torch_step(url, 304, 4.0, start=True) == (4.0, 304)
        except InferenceServerException:
            return False  # still restarting

    wait_until(serves, "a new sequence served by the restarted worker", timeout=120)
    assert _torch_step(url, 304, 1.0, end=True) == (5.0, 304)
    with pytest.raises(InferenceServerException) as lost:
        _torch_step(url, 303, 3.0)
    assert "sequence 303" in str(lost.value) and "START" in str(lost.value), str(lost.value)
    assert _torch_step(url, 303, 3.0, start=True, end=True) == (3.0, 303)
