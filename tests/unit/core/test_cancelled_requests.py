"""A request its caller cancels counts once, as a CANCELED failure (Triton's reason), never as a success."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import naiad
from naiad.protocol.types import InferenceRequest, InferInput
from tests.support.onnx_models import add_sub_model

# A lone request waits this long for company: long enough to be cancelled while queued.
QUEUED = "dynamic_batching { max_queue_delay_microseconds: 30000000 preferred_batch_size: [8] }"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[naiad.Server]:
    repo: Path = tmp_path_factory.mktemp("cancelled") / "models"
    add_sub_model(repo, "queued_unary", dims=4, scheduler=QUEUED)
    add_sub_model(repo, "queued_stream", dims=4, scheduler=QUEUED)
    add_sub_model(repo, "plain", dims=4, scheduler="")
    with naiad.Server(model_repository=str(repo)) as srv:
        yield srv


def _request(model: str) -> InferenceRequest:
    a = np.ones((1, 4), np.float32)
    return InferenceRequest(model_name=model, inputs=[InferInput("INPUT0", "FP32", a.shape, a), InferInput("INPUT1", "FP32", a.shape, a)])


def _on_loop(server: naiad.Server, coroutine):
    return asyncio.run_coroutine_threadsafe(coroutine, server._loop).result(30)


async def _until_queued(server: naiad.Server, model: str) -> None:
    scheduler = server.models.lookup(model).scheduler
    for _ in range(1000):
        if scheduler.pending() == 1:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"the request to '{model}' never queued")


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
