"""Sequence batcher through the server: per-sequence implicit state, control inputs, errors, idle release."""

import asyncio
import time

import numpy as np
import pytest

import naiad
from naiad.protocol.errors import ErrorCode, NaiadError
from naiad.protocol.types import InferenceRequest, InferInput
from tests.support.onnx_models import accumulator_model
from tests.support.waiting import wait_until


def _send(srv, value, cid, start=False, end=False, model="accumulator"):
    x = np.full((1, 1), value, np.float32)
    request = InferenceRequest(model_name=model, inputs=[InferInput("INPUT", "FP32", (1, 1), x)],
                               sequence_id=cid, sequence_start=start, sequence_end=end)
    return asyncio.run_coroutine_threadsafe(srv.infer_async(request), srv._loop).result()


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { max_candidate_sequences: 4 }"])
def test_interleaved_sequences_keep_their_own_state(tmp_path, strategy):
    accumulator_model(tmp_path, strategy=strategy)
    with naiad.Server(model_repository=str(tmp_path)) as srv:
        assert srv.model_metadata("accumulator")["inputs"] == [{"name": "INPUT", "datatype": "FP32", "shape": [-1, 1]}]
        assert _send(srv, 1, 11, start=True).output("OUTPUT").data[0, 0] == 1
        assert _send(srv, 10, 12, start=True).output("OUTPUT").data[0, 0] == 10
        assert _send(srv, 2, 11).output("OUTPUT").data[0, 0] == 3
        assert _send(srv, 20, 12).output("OUTPUT").data[0, 0] == 30
        last = _send(srv, 3, 11, end=True)
        assert last.output("OUTPUT").data[0, 0] == 6 and last.output("CID").data[0, 0] == 11
        # START again for a finished id begins from the initial state
        assert _send(srv, 5, 11, start=True).output("OUTPUT").data[0, 0] == 5


def test_sequence_rule_errors(tmp_path):
    accumulator_model(tmp_path)
    with naiad.Server(model_repository=str(tmp_path)) as srv:
        with pytest.raises(NaiadError) as err:
            _send(srv, 1, 0)
        assert err.value.code is ErrorCode.INVALID_ARG
        assert "must specify a non-zero or non-empty correlation ID" in err.value.message
        with pytest.raises(NaiadError) as err:
            _send(srv, 1, 99)
        assert "must specify the START flag on the first request of the sequence" in err.value.message
        with pytest.raises(NaiadError) as err:
            _send(srv, 1, "text-id", start=True)
        assert "must use an integer correlation ID" in err.value.message
        x = np.zeros((2, 1), np.float32)
        request = InferenceRequest(model_name="accumulator", inputs=[InferInput("INPUT", "FP32", (2, 1), x)], sequence_id=5, sequence_start=True)
        with pytest.raises(NaiadError) as err:
            asyncio.run_coroutine_threadsafe(srv.infer_async(request), srv._loop).result()
        assert "must specify batch-size 1 due to requirements of sequence batcher" in err.value.message


def test_idle_sequences_are_released(tmp_path):
    accumulator_model(tmp_path, idle_us=100_000)
    with naiad.Server(model_repository=str(tmp_path)) as srv:
        _send(srv, 1, 7, start=True)
        scheduler = srv.models.lookup("accumulator").scheduler
        wait_until(lambda: 7 not in scheduler._sequences, "sequence 7 to be released as idle", timeout=10)
        with pytest.raises(NaiadError) as err:
            _send(srv, 1, 7)
        assert "START flag" in err.value.message
        assert _send(srv, 4, 7, start=True).output("OUTPUT").data[0, 0] == 4


def test_oldest_strategy_waits_the_delay_from_its_oldest_request(tmp_path):
    """A partial batch waits until its oldest request has waited max_queue_delay (Triton's rule), and a
    request arriving meanwhile joins it instead of ending the wait: one execution of two rows."""
    accumulator_model(tmp_path, strategy="oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 400000 }")
    with naiad.Server(model_repository=str(tmp_path)) as srv:
        def send(value, cid):
            x = np.full((1, 1), value, np.float32)
            request = InferenceRequest(model_name="accumulator", inputs=[InferInput("INPUT", "FP32", (1, 1), x)],
                                       sequence_id=cid, sequence_start=True)
            return asyncio.run_coroutine_threadsafe(srv.infer_async(request), srv._loop)

        start = time.perf_counter()
        first = send(1, 21)
        # the second request arrives while the first waits for company
        scheduler = srv.models.lookup("accumulator").scheduler
        wait_until(lambda: scheduler.pending() == 1, "the first request to wait in the batcher", timeout=10)
        second = send(2, 22)
        assert first.result(10).output("OUTPUT").data[0, 0] == 1
        waited = time.perf_counter() - start
        assert second.result(10).output("OUTPUT").data[0, 0] == 2
        assert waited >= 0.35  # the delay counts from the first request, not ended by the second's arrival
        batches = srv.model_statistics("accumulator")["model_stats"][0]["batch_stats"]
        assert [(int(b["batch_size"]), int(b["compute_infer"]["count"])) for b in batches] == [(2, 1)]
