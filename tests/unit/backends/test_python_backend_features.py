"""Python backend features: dynamic batching, async execute, senders in default mode, is_ready, logging, model control."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from naiad import ErrorCode, NaiadError, Server
from naiad.protocol.types import InferenceRequest, InferInput
from tests.integration.test_python_backend_support import (
    SIMPLE_CONFIG,
    add_sub,
    write_model,
)
from tests.support.waiting import wait_until

BATCH_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 200000 }
"""

BATCH_PY = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.05)  # an execution long enough for requests to queue behind it
        count = np.array([[len(requests)]], dtype=np.int32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("COUNT", count)]) for _ in requests]
"""

ASYNC_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "MET" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

ASYNC_PY = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.started = 0
        self.both = None

    async def execute(self, requests):
        if self.both is None:
            self.both = asyncio.Event()
        self.started += 1
        if self.started >= 2:
            self.both.set()
        try:
            await asyncio.wait_for(self.both.wait(), 20)
            met = 1
        except asyncio.TimeoutError:
            met = 0
        return [pb_utils.InferenceResponse([pb_utils.Tensor("MET", np.array([met], dtype=np.int32))]) for _ in requests]
"""

SENDER_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy() * 3
            request.get_response_sender().send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value)]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

READY_PY = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.flag = os.path.join(args["model_repository"], "not_ready")

    def is_ready(self):
        return not os.path.exists(self.flag)

    def execute(self, requests):
        pb_utils.Logger.log_info("hello from the model")
        pb_utils.Logger.log_warn("careful from the model")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.ones(1, np.float32))]) for _ in requests]
"""

CONTROL_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        states = []
        states.append(pb_utils.is_model_ready("target"))
        pb_utils.load_model("target")
        states.append(pb_utils.is_model_ready("target"))
        pb_utils.unload_model("target")
        try:
            pb_utils.load_model("does_not_exist")
            failed = 0
        except pb_utils.TritonModelException:
            failed = 1
        states.append(failed)
        value = np.array(states, dtype=np.float32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value)]) for _ in requests]
"""

DECOUPLED_RAISE_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        sender = requests[0].get_response_sender()
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([7], dtype=np.int32))]))
        raise pb_utils.TritonModelException("gave up after one response")
"""

DECOUPLED_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("features")
    write_model(repo, "batched", BATCH_CONFIG, BATCH_PY)
    write_model(repo, "async_model", ASYNC_CONFIG, ASYNC_PY)
    write_model(repo, "sender", SIMPLE_CONFIG, SENDER_PY)
    write_model(repo, "ready_flag", SIMPLE_CONFIG, READY_PY)
    write_model(repo, "decoupled_raise", DECOUPLED_CONFIG, DECOUPLED_RAISE_PY)
    with Server(model_repository=str(repo)) as running:
        yield running, repo


def run(server: Server, coroutine, timeout: float = 60.0):
    return asyncio.run_coroutine_threadsafe(coroutine, server._loop).result(timeout)


def _request(model: str, name: str, array: np.ndarray, datatype: str = "FP32") -> InferenceRequest:
    return InferenceRequest(model, [InferInput(name, datatype, tuple(array.shape), array)])


def test_dynamic_batching_gives_the_model_several_requests(server):
    server, _ = server

    async def burst():
        return await asyncio.gather(*(server.infer_async(_request("batched", "INPUT0", np.ones((1, 1), np.float32)))
                                      for _ in range(8)))

    counts = [int(r.output("COUNT").data[0, 0]) for r in run(server, burst())]
    assert max(counts) > 1  # requests arrived together, each with its own batch dimension
    assert sum(1 for c in counts if c > 1) >= max(counts)


def test_async_execute_runs_batches_concurrently_in_one_instance(server):
    server, _ = server

    async def two():
        return await asyncio.gather(*(server.infer_async(_request("async_model", "INPUT0", np.ones(1, np.float32)))
                                      for _ in range(2)))

    assert [int(r.output("MET").data[0]) for r in run(server, two())] == [1, 1]


def test_default_mode_model_may_use_the_sender(server):
    server, _ = server
    out = server.infer("sender", {"INPUT0": np.array([1.0, 2.0], np.float32)})
    np.testing.assert_array_equal(out["OUTPUT0"], [3.0, 6.0])


def test_is_ready_and_logger(server, caplog):
    server, repo = server
    with caplog.at_level(logging.INFO, logger="naiad.python"):
        server.infer("ready_flag", {"INPUT0": np.ones(1, np.float32)})
        wait_until(lambda: "hello from the model" in caplog.text and "careful from the model" in caplog.text)
    assert "model.py:" in caplog.text
    assert server.model_ready("ready_flag")
    (repo / "ready_flag" / "not_ready").touch()
    try:
        wait_until(lambda: not server.model_ready("ready_flag"))
    finally:
        (repo / "ready_flag" / "not_ready").unlink()
    wait_until(lambda: server.model_ready("ready_flag"))


def test_decoupled_exception_after_a_response(server):
    server, _ = server

    async def collect():
        items = []
        try:
            async for response, final in server.infer_stream(_request("decoupled_raise", "IN", np.array([1], np.int32), "INT32")):
                items.append((int(response.output("OUT").data[0]) if response else None, final))
        except NaiadError as exc:
            items.append(exc)
        return items

    items = run(server, collect())
    assert items[0] == (7, False)
    assert isinstance(items[-1], NaiadError) and items[-1].code == ErrorCode.INTERNAL
    assert "gave up after one response" in items[-1].message


def test_model_control_from_python(tmp_path):
    write_model(tmp_path, "controller", SIMPLE_CONFIG, CONTROL_PY)
    add_sub(tmp_path, "target")
    with Server(model_repository=str(tmp_path), model_control_mode="explicit", load_models=["controller"]) as server:
        out = server.infer("controller", {"INPUT0": np.ones(1, np.float32)})
        assert list(out["OUTPUT0"]) == [0.0, 1.0, 1.0]
        entry = next(e for e in server.repository_index() if e["name"] == "target")
        assert entry["state"] == "UNAVAILABLE" and entry["reason"] == "unloaded"
