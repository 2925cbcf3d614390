"""Sequence batcher: a request queued behind its sequence's END is refused, not left waiting forever."""

import asyncio

import numpy as np

import naiad
from naiad.protocol.errors import ErrorCode, NaiadError
from naiad.protocol.types import InferenceRequest, InferInput
from tests.support.onnx_models import accumulator_model


def _request(value: float, cid: int, start: bool = False, end: bool = False) -> InferenceRequest:
    x = np.full((1, 1), value, np.float32)
    return InferenceRequest(model_name="accumulator", inputs=[InferInput("INPUT", "FP32", (1, 1), x)],
                            sequence_id=cid, sequence_start=start, sequence_end=end)


def test_a_request_queued_after_the_end_fails(tmp_path):
    accumulator_model(tmp_path)
    with naiad.Server(model_repository=str(tmp_path)) as srv:
        async def both():
            await srv.infer_async(_request(1, 5, start=True))
            # Sent together: the second one is queued in the sequence while its END runs.
            return await asyncio.gather(srv.infer_async(_request(2, 5, end=True)), srv.infer_async(_request(3, 5)),
                                        return_exceptions=True)

        ended, late = asyncio.run_coroutine_threadsafe(asyncio.wait_for(both(), 30), srv._loop).result()
        assert ended.output("OUTPUT").data[0, 0] == 3
        assert isinstance(late, NaiadError) and late.code is ErrorCode.INVALID_ARG
        assert "arrived after the END of its sequence" in late.message
        # The slot was freed once: a new sequence with the same id starts from scratch.
        fresh = asyncio.run_coroutine_threadsafe(srv.infer_async(_request(7, 5, start=True)), srv._loop).result()
        assert fresh.output("OUTPUT").data[0, 0] == 7
