"""What every request pays in the core: no question to the OS per request, validation remembered per shape."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

import naiad
from naiad.core.request_validation import REMEMBERED_SHAPES, validate_request
from naiad.protocol.errors import ErrorCode, NaiadError
from naiad.protocol.types import InferenceRequest, InferInput
from tests.support.onnx_models import add_sub_model, identity_model


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    add_sub_model(root, "add_sub")
    identity_model(root, "identity", "FP32", [-1])
    with naiad.Server(model_repository=str(root)) as srv:
        yield srv


def _add_sub(rows: int = 1, width: int = 16) -> InferenceRequest:
    data = np.ones((rows, width), np.float32)
    return InferenceRequest("add_sub", [InferInput("INPUT0", "FP32", data.shape, data), InferInput("INPUT1", "FP32", data.shape, data)])


def _on_server(server: naiad.Server, coroutine):
    return asyncio.run_coroutine_threadsafe(coroutine, server._loop).result(60)


def test_requests_do_not_ask_for_the_running_loop(server, monkeypatch):
    """On Python 3.11 asking for the running loop costs a system call (getpid): requests take the server's."""
    asked = 0
    real = asyncio.get_running_loop

    def counting():
        nonlocal asked
        asked += 1
        return real()

    async def requests() -> list[float]:
        results = []
        for _ in range(20):
            response = await server.infer_async(_add_sub())
            results.append(float(response.output("OUTPUT0").data[0, 0]))
        return results

    _on_server(server, requests())  # warm: the first executions run on the instance thread
    monkeypatch.setattr(asyncio, "get_running_loop", counting)
    assert _on_server(server, requests()) == [2.0] * 20
    assert asked == 0


def test_a_remembered_shape_does_not_let_wrong_ones_through(server):
    assert float(_on_server(server, server.infer_async(_add_sub(2))).output("OUTPUT1").data[1, 0]) == 0.0
    for request, message in (
        (_add_sub(2, 15), "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [-1,16], got [2,15]"),
        (_add_sub(9), "inference request batch-size must be <= 8 for 'add_sub'"),
        (_add_sub(0), "inference request batch-size must be >= 1 for 'add_sub'"),
    ):
        with pytest.raises(NaiadError) as err:
            _on_server(server, server.infer_async(request))
        assert err.value.code is ErrorCode.INVALID_ARG
        assert message in err.value.message
    accepted = server.models.lookup("add_sub").accepted_shapes
    for name in ("INPUT0", "INPUT1"):
        assert (2, 16) in accepted[name] and not {(2, 15), (9, 16), (0, 16)} & accepted[name]
    # Inputs whose batch sizes differ are refused even when each shape alone was accepted before.
    mixed = _add_sub(2)
    mixed.inputs[1] = InferInput("INPUT1", "FP32", (1, 16), np.ones((1, 16), np.float32))
    _on_server(server, server.infer_async(_add_sub(1)))
    with pytest.raises(NaiadError, match="input 'INPUT1' batch size does not match other inputs"):
        _on_server(server, server.infer_async(mixed))
    assert float(_on_server(server, server.infer_async(_add_sub(2))).output("OUTPUT0").data[1, 0]) == 2.0


def test_remembered_shapes_are_bounded(server):
    async def requests() -> list[int]:
        sizes = []
        for width in range(1, REMEMBERED_SHAPES + 11):
            data = np.arange(width, dtype=np.float32).reshape(1, width)
            response = await server.infer_async(InferenceRequest("identity", [InferInput("INPUT0", "FP32", data.shape, data)]))
            sizes.append(response.output("OUTPUT0").data.shape[1])
        return sizes

    assert _on_server(server, requests()) == list(range(1, REMEMBERED_SHAPES + 11))
    assert len(server.models.lookup("identity").accepted_shapes["INPUT0"]) == REMEMBERED_SHAPES


def test_a_request_a_frontend_process_received_earlier_is_timed_from_then(server):
    """A frontend worker's hand-over to the core is queue time: the work item starts when the worker had the
    request (so a batching delay is not lengthened by it), never later than now, and a request made here
    starts now."""
    model = server.models.lookup("add_sub")

    async def items() -> tuple[int, int, int, int, int]:
        before = time.perf_counter_ns()
        earlier = _add_sub()
        earlier.received_ns = before - 5_000_000
        future = _add_sub()
        future.received_ns = before + 60_000_000_000  # not a time this clock has reached: ignored
        here = validate_request(model, _add_sub()).enqueue_ns
        return (before, validate_request(model, earlier).enqueue_ns, validate_request(model, future).enqueue_ns,
                here, time.perf_counter_ns())

    before, earlier, future, here, after = _on_server(server, items())
    assert earlier == before - 5_000_000
    assert before <= future <= after and before <= here <= after
    # and the statistics count the request's whole time from then
    stats = model.stats.as_dict()["inference_stats"]["success"]
    request = _add_sub()
    request.received_ns = time.perf_counter_ns() - 200_000_000
    _on_server(server, server.infer_async(request))
    grown = model.stats.as_dict()["inference_stats"]["success"]
    assert grown["count"] == stats["count"] + 1 and grown["ns"] - stats["ns"] >= 200_000_000
