"""Latency summaries (quantile windows, Triton's families) and the per-interval system gauges."""

import asyncio
import math
import re
import threading

import numpy as np
import pytest

import naiad
from naiad.observability.metrics import parse_metrics_config
from naiad.observability.summary import (
    DEFAULT_QUANTILES,
    MAX_AGE_SECS,
    WindowSummary,
    parse_quantiles,
)
from naiad.observability.system_metrics import SystemMetrics
from tests.support.onnx_models import add_sub_model, ensemble_model


def test_parse_quantiles():
    assert parse_quantiles(None) == DEFAULT_QUANTILES == ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))
    assert parse_quantiles('"0.9:0.01, 0.5:0.05"') == ((0.5, 0.05), (0.9, 0.01))
    for bad in ("0.5", "x:0.1", "1.5:0.01"):
        with pytest.raises(ValueError, match="summary_quantiles"):
            parse_quantiles(bad)
    with pytest.raises(ValueError, match="summary_quantiles"):
        parse_metrics_config(["summary_latencies=true", "summary_quantiles=0.5"])


def test_window_quantiles_sum_count_and_expiry():
    now = [100.0]
    summary = WindowSummary(clock=lambda: now[0])
    for value in range(1, 101):  # 1..100
        summary.observe(value)
    values, total, count = summary.snapshot(((0.5, 0.05), (0.9, 0.01), (0.99, 0.001)))
    assert values == [(0.5, 50.0), (0.9, 90.0), (0.99, 99.0)] and total == 5050 and count == 100
    now[0] += MAX_AGE_SECS / 2
    summary.observe(1000)
    assert summary.snapshot(((1.0, 0.0),))[0] == [(1.0, 1000.0)]
    now[0] += MAX_AGE_SECS / 2 + 1  # the first 100 left the window; sum and count never forget
    values, total, count = summary.snapshot(((0.5, 0.05),))
    assert values == [(0.5, 1000.0)] and total == 6050 and count == 101
    now[0] += MAX_AGE_SECS
    values, _, count = summary.snapshot(((0.5, 0.05),))
    assert math.isnan(values[0][1]) and count == 101


def _series(text: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\S+) (\S+)$", text, re.MULTILINE)}


@pytest.fixture()
def repo(tmp_path):
    add_sub_model(tmp_path, "m")
    ensemble_model(tmp_path, "ens", [("m", {"INPUT0": "IN0", "INPUT1": "IN1"}, {"OUTPUT0": "OUT0"})],
                   inputs=[("IN0", "FP32", [16]), ("IN1", "FP32", [16])], outputs=[("OUT0", "FP32", [16])])
    return tmp_path


def test_summary_families_agree_with_requests_and_statistics(repo):
    with naiad.Server(model_repository=str(repo), metrics_config={"summary_latencies": "true",
                                                                  "summary_quantiles": "0.5:0.05,0.9:0.01"}) as server:
        a = np.ones((2, 16), np.float32)
        for _ in range(7):
            server.infer("m", {"INPUT0": a, "INPUT1": a})
        text = server.metrics.render()
        stats = server.model_statistics("m")["model_stats"][0]["inference_stats"]
    series = _series(text)
    labels = 'model="m",version="1"'
    assert "# TYPE nv_inference_request_summary_us summary" in text
    keys = {"request": "success", "queue": "queue", "compute_input": "compute_input",
            "compute_infer": "compute_infer", "compute_output": "compute_output"}
    for name, stat in keys.items():
        family = f"nv_inference_{name}_summary_us"
        assert series[f"{family}_count{{{labels}}}"] == 7 == stats[stat]["count"]
        assert series[f"{family}_sum{{{labels}}}"] == stats[stat]["ns"] // 1000
        median = series[f'{family}{{model="m",quantile="0.5",version="1"}}']
        p90 = series[f'{family}{{model="m",quantile="0.9",version="1"}}']
        assert 0 <= median <= p90 <= series[f"{family}_sum{{{labels}}}"]
        assert f'{family}{{model="m",quantile="0.99",version="1"}}' not in series  # only the configured quantiles
    assert series[f"nv_inference_request_summary_us_sum{{{labels}}}"] == series[f"nv_inference_request_duration_us{{{labels}}}"]
    assert series[f"nv_inference_request_summary_us_count{{{labels}}}"] == series[f"nv_inference_request_success{{{labels}}}"]
    assert 'nv_inference_request_summary_us_count{model="ens",version="1"} 0' in text  # every loaded model has series


def test_summaries_are_off_by_default(repo):
    with naiad.Server(model_repository=str(repo)) as server:
        assert "summary_us" not in server.metrics.render()


class _FakeOs:
    """/proc readings that change on every read, so a stale gauge is visible."""

    def __init__(self) -> None:
        self.reads = 0
        self.lock = threading.Lock()

    def cpu(self):
        with self.lock:
            self.reads += 1
            return 1000 * self.reads, 250 * self.reads  # 75% busy between any two reads

    def memory(self):
        return {"MemTotal": 1 << 30, "MemAvailable": (1 << 30) - self.reads * 4096}


def test_system_gauges_come_from_the_last_sample_not_the_scrape():
    fake = _FakeOs()
    system = SystemMetrics(read_cpu=fake.cpu, read_memory=fake.memory, read_gpus=lambda: [])
    system.sample()
    first = {f.name: f.samples[0][2] for f in system.families()}
    assert {f.name: f.samples[0][2] for f in system.families()} == first  # scraping reads nothing
    assert first["nv_cpu_utilization"] == 0.75 and first["nv_cpu_memory_used_bytes"] == 2 * 4096
    assert first["nv_pinned_memory_pool_total_bytes"] == 0 and first["nv_pinned_memory_pool_used_bytes"] == 0
    system.sample()
    assert {f.name: f.samples[0][2] for f in system.families()}["nv_cpu_memory_used_bytes"] == 3 * 4096


def test_sampler_refreshes_on_the_interval_and_stops_with_the_server(repo, monkeypatch):
    fake = _FakeOs()
    monkeypatch.setattr("naiad.observability.system_metrics.read_cpu_times", fake.cpu)
    monkeypatch.setattr("naiad.observability.system_metrics.read_meminfo", fake.memory)
    server = naiad.Server(model_repository=str(repo), metrics_interval_ms=200, allow_gpu_metrics=False)
    server.start()
    try:
        system = server.metrics.system

        async def ticks(count: int) -> list[float]:
            """Loop times at which the sample counter moved, `count` times."""
            loop, seen, times = asyncio.get_running_loop(), system.samples, []
            while len(times) < count:
                await asyncio.sleep(0.01)
                if system.samples != seen:
                    seen = system.samples
                    times.append(loop.time())
            return times

        times = asyncio.run_coroutine_threadsafe(asyncio.wait_for(ticks(3), 10), server._loop).result()
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert all(0.15 <= gap <= 0.6 for gap in gaps), gaps  # every 200 ms, give or take a loaded machine
        reads = fake.reads
        assert reads >= 3  # the sampler read the (fake) OS
        used = [line for line in server.metrics.render().splitlines() if line.startswith("nv_cpu_memory_used_bytes ")]
        assert used == [f"nv_cpu_memory_used_bytes {fake.reads * 4096}"] or fake.reads != reads
        assert fake.reads - reads <= 1  # scraping does not read the OS (at most one tick happened meanwhile)
    finally:
        server.stop()
    assert server._metrics_sampler is not None and server._metrics_sampler.done()
    stopped_at, reads = system.samples, fake.reads
    threading.Event().wait(0.5)  # 2.5 intervals: a sampler still running would have ticked
    assert system.samples == stopped_at and fake.reads == reads


def test_cached_model_has_cache_summaries_and_no_request_summary(tmp_path):
    model_dir = add_sub_model(tmp_path, "c")
    (model_dir / "config.pbtxt").write_text((model_dir / "config.pbtxt").read_text() + "response_cache { enable: true }\n")
    with naiad.Server(model_repository=str(tmp_path), response_cache_bytes=1 << 20,
                      metrics_config={"summary_latencies": "true"}) as server:
        a = np.ones((1, 16), np.float32)
        for _ in range(3):
            server.infer("c", {"INPUT0": a, "INPUT1": a})
        text = server.metrics.render()
    series = _series(text)
    labels = 'model="c",version="1"'
    assert series[f"nv_cache_hit_summary_per_model_count{{{labels}}}"] == 2
    assert series[f"nv_cache_miss_summary_per_model_count{{{labels}}}"] == 1
    assert series[f"nv_cache_hit_summary_per_model_sum{{{labels}}}"] == series[f"nv_cache_hit_duration_per_model{{{labels}}}"]
    assert "nv_inference_request_summary_us_count{" not in text  # Triton leaves it out for cached models
    assert series[f"nv_inference_queue_summary_us_count{{{labels}}}"] == 3
