"""A request its caller cancels counts once, as a CANCELED failure (Triton's reason), never as a success."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import naiad
from naiad.protocol.types import InferenceRequest, InferInput
from naiad.scheduling.base import Scheduler
from tests.support.onnx_models import add_sub_model, slow_model
from tests.support.waiting import wait_until_async

# A lone request waits this long for company: long enough to be cancelled while queued.
QUEUED = "dynamic_batching { max_queue_delay_microseconds: 30000000 preferred_batch_size: [8] }"

# One instance, dynamic batcher (a lone request goes straight to the idle instance). Each execution
# runs SECONDS in full and answers how many executions so far saw their request cancelled.
SLEEPER_CONFIG = """\
backend: "python"
max_batch_size: 4
dynamic_batching { }
instance_group [ { kind: KIND_CPU count: 1 } ]
input [ { name: "SECONDS" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "SAW_CANCELLED" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

SLEEPER_PY = """\
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.saw_cancelled = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = float(pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy().reshape(-1)[0])
            cancelled = False
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                cancelled = cancelled or request.is_cancelled()
                time.sleep(0.02)  # model code: an execution of `seconds` that checks for cancellation
            self.saw_cancelled += int(cancelled)
            seen = np.array([[self.saw_cancelled]], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SAW_CANCELLED", seen)]))
        return responses
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[naiad.Server]:
    repo: Path = tmp_path_factory.mktemp("cancelled") / "models"
    add_sub_model(repo, "queued_unary", dims=4, scheduler=QUEUED)
    add_sub_model(repo, "queued_stream", dims=4, scheduler=QUEUED)
    add_sub_model(repo, "plain", dims=4, scheduler="")
    slow_model(repo, "slow", matmuls=160)  # about 0.7 s per execution on one thread
    (repo / "sleeper" / "1").mkdir(parents=True)
    (repo / "sleeper" / "config.pbtxt").write_text(SLEEPER_CONFIG)
    (repo / "sleeper" / "1" / "model.py").write_text(SLEEPER_PY)
    with naiad.Server(model_repository=str(repo)) as srv:
        yield srv


def _request(model: str) -> InferenceRequest:
    a = np.ones((1, 4), np.float32)
    return InferenceRequest(model_name=model, inputs=[InferInput("INPUT0", "FP32", a.shape, a), InferInput("INPUT1", "FP32", a.shape, a)])


def _on_loop(server: naiad.Server, coroutine):
    return asyncio.run_coroutine_threadsafe(coroutine, server._loop).result(30)


async def _until_queued(server: naiad.Server, model: str) -> None:
    scheduler = server.models.lookup(model).scheduler
    await wait_until_async(lambda: scheduler.pending() == 1, f"the request to '{model}' to queue")


def _counts(server: naiad.Server, model: str) -> tuple[int, int, dict[str, int]]:
    stats = server.model_statistics(model)["model_stats"][0]["inference_stats"]
    return stats["success"]["count"], stats["fail"]["count"], dict(server.models.lookup(model).stats.failures)


def test_cancelled_while_queued_is_one_canceled_failure(server: naiad.Server) -> None:
    async def cancel_queued() -> None:
        task = asyncio.ensure_future(server.infer_async(_request("queued_unary")))
        await _until_queued(server, "queued_unary")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    _on_loop(server, cancel_queued())
    assert _counts(server, "queued_unary") == (0, 1, {"REJECTED": 0, "CANCELED": 1, "BACKEND": 0, "OTHER": 0})
    assert server.models.lookup("queued_unary").scheduler.pending() == 0
    metrics = server.metrics.render()
    assert 'nv_inference_request_failure{model="queued_unary",reason="CANCELED",version="1"} 1' in metrics
    assert 'nv_inference_request_success{model="queued_unary",version="1"} 0' in metrics


def test_stream_cancelled_while_queued_is_one_canceled_failure(server: naiad.Server) -> None:
    async def cancel_stream() -> None:
        async def consume() -> None:
            async for _ in server.infer_stream(_request("queued_stream"), errors_inline=True):
                pass

        task = asyncio.ensure_future(consume())
        await _until_queued(server, "queued_stream")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    _on_loop(server, cancel_stream())
    assert _counts(server, "queued_stream") == (0, 1, {"REJECTED": 0, "CANCELED": 1, "BACKEND": 0, "OTHER": 0})


def test_stream_left_at_its_final_response_is_a_success(server: naiad.Server) -> None:
    async def stop_at_final() -> list[bool]:
        finals = []
        stream = server.infer_stream(_request("plain"))
        async for _response, final in stream:
            finals.append(final)
            if final:
                break  # as an ensemble step stops reading: the generator is closed at its last yield
        await stream.aclose()
        return finals

    assert _on_loop(server, stop_at_final()) == [True]
    assert _counts(server, "plain") == (1, 0, {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": 0})


def _slow_request() -> InferenceRequest:
    x = np.ones(1, np.float32)
    return InferenceRequest(model_name="slow", inputs=[InferInput("X", "FP32", x.shape, x)])


def _sleeper_request(seconds: float) -> InferenceRequest:
    x = np.full((1, 1), seconds, np.float32)
    return InferenceRequest(model_name="sleeper", inputs=[InferInput("SECONDS", "FP32", x.shape, x)])


async def _until_executing(scheduler: Scheduler) -> None:
    """The one request in flight is no longer waiting: an instance took it."""
    await wait_until_async(lambda: scheduler.inflight() == 1 and scheduler.pending() == 0,
                           "the request to start executing")


async def _cancel_then_send_another(server: naiad.Server, model: str, first: InferenceRequest,
                                    second: InferenceRequest) -> tuple[int, object]:
    """Cancel `first` while it executes, send `second`: how many requests wait for an instance a moment
    later (the cancelled execution still runs), and the second response."""
    scheduler = server.models.lookup(model).scheduler
    task = asyncio.ensure_future(server.infer_async(first))
    await _until_executing(scheduler)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    following = asyncio.ensure_future(server.infer_async(second))
    await asyncio.sleep(0.1)
    waiting = scheduler.pending()
    return waiting, await following


def _assert_two_executions_one_canceled(server: naiad.Server, model: str) -> None:
    stats = server.model_statistics(model)["model_stats"][0]
    assert (stats["execution_count"], stats["inference_count"]) == (2, 2)
    assert _counts(server, model) == (1, 1, {"REJECTED": 0, "CANCELED": 1, "BACKEND": 0, "OTHER": 0})
    metrics = server.metrics.render()
    for line in (f'nv_inference_exec_count{{model="{model}",version="1"}} 2',
                 f'nv_inference_count{{model="{model}",version="1"}} 2',
                 f'nv_inference_request_success{{model="{model}",version="1"}} 1',
                 f'nv_inference_request_failure{{model="{model}",reason="CANCELED",version="1"}} 1',
                 f'nv_inference_request_failure{{model="{model}",reason="BACKEND",version="1"}} 0'):
        assert line in metrics, line


def test_cancelled_while_executing_holds_the_instance_and_counts_the_execution(server: naiad.Server) -> None:
    waiting, response = _on_loop(server, _cancel_then_send_another(server, "slow", _slow_request(), _slow_request()))
    assert waiting == 1, "the next request was handed to the instance still executing the cancelled one"
    assert response.output("Y").data.tolist() == pytest.approx([1.0])
    _assert_two_executions_one_canceled(server, "slow")


def test_python_model_cancelled_while_executing(server: naiad.Server) -> None:
    scenario = _cancel_then_send_another(server, "sleeper", _sleeper_request(1.0), _sleeper_request(0.0))
    waiting, response = _on_loop(server, scenario)
    assert waiting == 1, "the next request was sent to the worker still executing the cancelled one"
    assert response.output("SAW_CANCELLED").data.tolist() == [[1]]  # request.is_cancelled() turned true
    _assert_two_executions_one_canceled(server, "sleeper")
