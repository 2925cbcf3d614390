"""The metrics listener of a real server process with --metrics-config summaries and --metrics-interval-ms."""

from __future__ import annotations

import argparse
import re
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

from naiad.cli.flags import add_serve_flags, config_from_args
from tests.support.onnx_models import add_sub_model
from tests.support.servers import start_server


def _scrape(port: int) -> tuple[str, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return reply.read().decode(), reply.headers["Content-Type"]


def _series(text: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\S+) (\S+)$", text, re.MULTILINE)}


def test_summaries_and_interval_over_the_wire(tmp_path):
    add_sub_model(tmp_path, "m")
    with start_server(tmp_path, "--metrics-config", "summary_latencies=true", "--metrics-config",
                      "summary_quantiles=0.5:0.05,0.9:0.01,0.99:0.001", "--metrics-interval-ms", "100") as server:
        with httpclient.InferenceServerClient(server.http_url) as client:
            a = np.ones((1, 16), np.float32)
            inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
            for tensor in inputs:
                tensor.set_data_from_numpy(a)
            for _ in range(9):
                client.infer("m", inputs)
            stats = client.get_inference_statistics("m")["model_stats"][0]["inference_stats"]
        text, content_type = _scrape(server.metrics_port)
        head = urllib.request.Request(f"http://127.0.0.1:{server.metrics_port}/metrics", method="HEAD")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(head, timeout=10)
    assert content_type == "text/plain; charset=utf-8" and refused.value.code == 405
    series = _series(text)
    labels = 'model="m",version="1"'
    assert series[f"nv_inference_request_summary_us_count{{{labels}}}"] == 9 == int(stats["success"]["count"])
    assert series[f"nv_inference_request_summary_us_sum{{{labels}}}"] == int(stats["success"]["ns"]) // 1000
    assert series[f"nv_inference_compute_infer_summary_us_sum{{{labels}}}"] == series[f"nv_inference_compute_infer_duration_us{{{labels}}}"]
    quantiles = [series[f'nv_inference_request_summary_us{{model="m",quantile="{q}",version="1"}}'] for q in ("0.5", "0.9", "0.99")]
    assert 0 < quantiles[0] <= quantiles[1] <= quantiles[2] <= series[f"nv_inference_request_summary_us_sum{{{labels}}}"]
    assert "# TYPE nv_inference_queue_summary_us summary" in text
    assert series["nv_cpu_memory_total_bytes"] > 0 and series["nv_pinned_memory_pool_total_bytes"] == 0


def _config(*argv: str):
    parser = argparse.ArgumentParser()
    add_serve_flags(parser)
    return config_from_args(parser.parse_args(["--model-repository", "/tmp", *argv]))


def test_metrics_flags_parse_and_refuse_bad_values(capsys):
    config = _config("--metrics-interval-ms", "250", "--http-address", "127.0.0.2")
    assert config.metrics_interval_ms == 250 and config.metrics_address == "127.0.0.2"  # follows --http-address
    assert _config("--http-address", "127.0.0.2", "--allow-http", "false").metrics_address == "0.0.0.0"
    assert _config("--metrics-address", "127.0.0.3").metrics_address == "127.0.0.3"
    for bad in (["--metrics-interval-ms", "0"], ["--metrics-interval-ms", "often"]):
        with pytest.raises(SystemExit):
            _config(*bad)
    with pytest.raises(SystemExit) as err:
        _config("--metrics-config", "summary_quantiles=0.5")
    assert "summary_quantiles" in str(err.value.code)
