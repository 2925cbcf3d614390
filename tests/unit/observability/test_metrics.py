"""Metric families: Triton's exact names (no _total), labels, failure reasons, histograms, cache."""

import asyncio
import re

import numpy as np
import pytest

import naiad
from naiad.protocol.errors import NaiadError
from naiad.protocol.types import InferenceRequest, InferInput
from tests.support.onnx_models import add_sub_model


def _value(text: str, series: str) -> float:
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    assert match, f"{series} not in metrics:\n{text}"
    return float(match.group(1))


@pytest.fixture()
def server(tmp_path):
    add_sub_model(tmp_path, "m")
    config = (tmp_path / "m" / "config.pbtxt").read_text()
    config = config.replace("dynamic_batching { }", "dynamic_batching { default_queue_policy { max_queue_size: 1 } }")
    config += 'metric_tags { key: "team" value: "search" }\n'
    config += 'model_metrics { metric_control [{ metric_identifier { family: "nv_inference_first_response_histogram_ms" } histogram_options { buckets: [1, 10, 100] } }] }\n'
    (tmp_path / "m" / "config.pbtxt").write_text(config)
    with naiad.Server(model_repository=str(tmp_path), metrics_config={"histogram_latencies": "true"}) as srv:
        yield srv


def test_families_and_relationships(server):
    a = np.ones((2, 16), np.float32)
    for _ in range(3):
        server.infer("m", {"INPUT0": a, "INPUT1": a})
    text = server.metrics.render()
    labels = 'model="m",version="1"'
    tagged = f'_team="search",{labels}'
    assert "# TYPE nv_inference_request_success counter" in text and "request_success_total" not in text
    assert _value(text, f"nv_inference_request_success{{{tagged}}}") == 3
    assert _value(text, f"nv_inference_count{{{tagged}}}") == 6
    assert _value(text, f"nv_inference_exec_count{{{tagged}}}") == 3
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
        assert _value(text, f'nv_inference_request_failure{{_team="search",model="m",reason="{reason}",version="1"}}') == 0
    assert _value(text, f"nv_inference_pending_request_count{{{tagged}}}") == 0
    assert _value(text, f'nv_inference_first_response_histogram_ms_bucket{{_team="search",le="+Inf",{labels}}}') == 3
    assert _value(text, f"nv_inference_first_response_histogram_ms_count{{{tagged}}}") == 3
    assert 'le="100"' in text and 'le="500"' not in text  # per-model buckets replace the defaults
    assert _value(text, "nv_cpu_memory_total_bytes") > 0
    assert 0.0 <= _value(text, "nv_cpu_utilization") <= 1.0
    assert _value(text, f"nv_model_load_duration_secs{{{tagged}}}") > 0


def test_queue_full_counts_as_rejected(server):
    async def flood():
        a = np.ones((1, 16), np.float32)
        reqs = [InferenceRequest(model_name="m", inputs=[InferInput("INPUT0", "FP32", (1, 16), a), InferInput("INPUT1", "FP32", (1, 16), a)]) for _ in range(50)]
        return await asyncio.gather(*(server.infer_async(r) for r in reqs), return_exceptions=True)

    results = asyncio.run_coroutine_threadsafe(flood(), server._loop).result()
    refused = [r for r in results if isinstance(r, NaiadError)]
    assert refused and all(r.message == "Exceeds maximum queue size" for r in refused)
    text = server.metrics.render()
    assert _value(text, 'nv_inference_request_failure{_team="search",model="m",reason="REJECTED",version="1"}') == len(refused)
