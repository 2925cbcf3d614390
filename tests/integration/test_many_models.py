"""Many models on one server: unloading frees memory, budgets, pinned models, Python workers, failures."""

import os
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import helper, numpy_helper

from tests.integration.test_python_backend_support import (
    ADD_SUB_CONFIG,
    ADD_SUB_PY,
    add_sub,
    write_model,
)
from tests.support.onnx_models import _save, _tensor, add_sub_model, write_config
from tests.support.process_tree import descendants, tree_rss
from tests.support.servers import client_error, start_server
from tests.support.waiting import wait_until


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _big_model(repo, name: str, rows: int = 2048, cols: int = 4096) -> None:
    """Y = X @ W with a 32 MB weight: big enough that its memory shows in RSS."""
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"])], "big",
                              [_tensor("X", "FP32", ["b", rows])], [_tensor("Y", "FP32", ["b", cols])], initializer=[weight])
    _save(helper.make_model(graph), repo / name / "1" / "model.onnx")
    write_config(repo / name, f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 4\n'
                 f'input [{{ name: "X" data_type: TYPE_FP32 dims: [{rows}] }}]\n'
                 f'output [{{ name: "Y" data_type: TYPE_FP32 dims: [{cols}] }}]\n'
                 'instance_group [{ kind: KIND_CPU count: 1 }]\n')


def test_unloading_returns_rss_to_within_5_percent(tmp_path):
    _big_model(tmp_path, "big")
    with start_server(tmp_path, "--model-control-mode=explicit") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        x = httpclient.InferInput("X", [1, 2048], "FP32")
        x.set_data_from_numpy(np.ones((1, 2048), np.float32))
        # onnxruntime keeps one-time process state (allocators, kernel registry) after its first
        # session: warm it with one load/unload so only the model's own memory is compared
        client.load_model("big")
        client.infer("big", [x])
        client.unload_model("big")
        before = _rss(server.process.pid)
        client.load_model("big")
        client.infer("big", [x])
        loaded = _rss(server.process.pid)
        assert loaded - before > 30e6  # the 32 MB weight is really resident
        client.unload_model("big")
        wait_until(lambda: client.get_model_repository_index()[0].get("state") == "UNAVAILABLE", "big to be unloaded",
                   timeout=10, interval=0.05)
        after = _rss(server.process.pid)
        assert after <= before * 1.05, (before, loaded, after)


def test_a_model_loaded_at_start_up_still_frees_its_memory_on_unload(tmp_path):
    """The heap alive at the end of start-up is frozen out of garbage collection (runtime/memory.py):
    a model loaded then must still give its memory back when it is unloaded."""
    _big_model(tmp_path, "big")
    with start_server(tmp_path, "--model-control-mode=explicit", "--load-model=big") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        x = httpclient.InferInput("X", [1, 2048], "FP32")
        x.set_data_from_numpy(np.ones((1, 2048), np.float32))
        client.infer("big", [x])
        loaded = _rss(server.process.pid)
        client.unload_model("big")
        wait_until(lambda: client.get_model_repository_index()[0].get("state") == "UNAVAILABLE", "big to be unloaded",
                   timeout=10, interval=0.05)
        after = _rss(server.process.pid)
        assert loaded - after > 25e6, (loaded, after)  # most of the 32 MB weight is released


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_round_robin_over_many_models_under_a_budget(tmp_path, protocol):
    count = 40
    for i in range(count):
        add_sub_model(tmp_path, f"m{i:02d}")
    budget = "1"  # one byte: every new model evicts the idle ones, so the server keeps unloading and reloading
    with start_server(tmp_path, "--model-control-mode=explicit", "--load-on-demand=true",
                      f"--model-memory-budget={budget}") as server:
        a = np.ones((1, 16), np.float32)
        if protocol == "http":
            client = httpclient.InferenceServerClient(server.http_url)
            module = httpclient
        else:
            client = grpcclient.InferenceServerClient(server.grpc_url)
            module = grpcclient
        for _ in range(2):
            for i in range(count):
                inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
                inputs[0].set_data_from_numpy(a * i)
                inputs[1].set_data_from_numpy(a)
                result = client.infer(f"m{i:02d}", inputs)  # any failure raises
                assert result.as_numpy("OUTPUT0")[0, 0] == i + 1
        index = httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
        evicted = [e for e in index if "evicted" in e.get("reason", "")]
        assert evicted, index
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
        loads = float(next(line for line in metrics.splitlines() if line.startswith("naiad_model_loads ")).split()[1])
        assert loads >= count  # every model loaded at least once, several more than once


def _inputs(module=httpclient, value: float = 1.0):
    a = np.full((1, 16), value, np.float32)
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.ones_like(a))
    return inputs


def metric_values(server) -> dict[str, float]:
    """Every sample of the metrics endpoint: 'name{labels}' -> value."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30).read().decode()
    samples = [line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#")]
    return {key: float(value) for key, value in samples}


def _states(client) -> dict[str, dict]:
    return {e["name"]: e for e in client.get_model_repository_index()}


def _slow_python_model(repo, name: str, seconds: float, fail: bool = False) -> None:
    """The Python add/sub model with an initialize that takes `seconds` (and then raises if `fail`)."""
    body = f"        import time; time.sleep({seconds})\n"  # a slow load, simulated
    if fail:
        body += "        raise RuntimeError('initialize gave up')\n"
    model_py = ADD_SUB_PY.replace("    def initialize(self, args):\n", "    def initialize(self, args):\n" + body)
    write_model(repo, name, ADD_SUB_CONFIG.format(dt="TYPE_FP32"), model_py)


def test_python_workers_only_for_python_models_and_counted_in_the_budget(tmp_path):
    for i in range(4):
        add_sub_model(tmp_path, f"onnx{i}")
    add_sub(tmp_path, "py0")
    add_sub(tmp_path, "py1")
    with start_server(tmp_path) as server:
        assert len(descendants(server.process.pid)) == 2  # one worker per Python model, none for ONNX
        _, workers = tree_rss(server.process.pid)
        values = metric_values(server)
        worker_rss = workers / 2
        assert values['naiad_model_memory_bytes{model="py0"}'] >= worker_rss / 2  # its worker is measured
        assert values['naiad_model_memory_bytes{model="onnx0"}'] < worker_rss / 2
    # A budget one Python worker fits in but not two: loading the second evicts the first
    budget = int(worker_rss * 1.5)
    with start_server(tmp_path, "--model-control-mode=explicit", "--load-on-demand=true",
                      f"--model-memory-budget={budget}") as server:
        base = sum(tree_rss(server.process.pid))
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.infer("py0", _inputs()).as_numpy("OUTPUT0")[0, 0] == 2
        first_worker = descendants(server.process.pid)
        assert len(first_worker) == 1
        assert client.infer("py1", _inputs(value=2)).as_numpy("OUTPUT0")[0, 0] == 3
        assert _states(client)["py0"]["reason"] == "unloaded (evicted: memory budget)"
        wait_until(lambda: first_worker[0] not in descendants(server.process.pid), timeout=15)
        assert sum(tree_rss(server.process.pid)) <= base + budget
        # Unloading the last one: the server and its children are back within 5% of the start
        client.unload_model("py1")
        wait_until(lambda: not descendants(server.process.pid), timeout=15)
        assert sum(tree_rss(server.process.pid)) <= base * 1.05


def test_one_failure_does_not_delay_the_others(tmp_path):
    for i in range(12):
        add_sub_model(tmp_path, f"m{i:02d}")
    _slow_python_model(tmp_path, "slow_broken", 2.0, fail=True)
    write_config(tmp_path / "bad_config", "name: bad_config\nthis is not a config")
    (tmp_path / "bad_config" / "1").mkdir()
    with start_server(tmp_path, timeout=120) as server:
        log = "".join(server.output)
        failed_at = log.index("failed to load 'slow_broken'")
        for i in range(12):  # all loaded while the slow model was still initializing
            assert log.index(f"successfully loaded 'm{i:02d}'") < failed_at
        assert "loaded 12/14 models, 2 failed" in log  # the failures are not counted as loaded
        states = _states(httpclient.InferenceServerClient(server.http_url))
        assert [n for n, e in states.items() if e.get("state") == "READY"] == [f"m{i:02d}" for i in range(12)]
        assert "initialize gave up" in states["slow_broken"]["reason"]
        assert states["bad_config"] == {"name": "bad_config"}  # unreadable: logged, never a version state
        assert "failed to load 'bad_config'" in log


def test_pinned_models_are_never_evicted(tmp_path):
    for i in range(6):
        add_sub_model(tmp_path, f"m{i}")
    with start_server(tmp_path, "--model-control-mode=explicit", "--load-on-demand=true", "--load-model=m0",
                      "--model-memory-budget=1") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        for _ in range(2):
            for i in range(6):
                assert client.infer(f"m{i}", _inputs(value=i)).as_numpy("OUTPUT0")[0, 0] == i + 1
                assert _states(client)["m0"]["state"] == "READY"
        values = metric_values(server)
        assert values['naiad_model_evictions{reason="memory_budget"}'] >= 9  # m1..m5 evicted, reloaded, evicted
        assert values["naiad_model_loads"] == 1 + 2 * 5  # m0 loaded once, at start


def test_a_request_timing_out_does_not_cancel_the_on_demand_load(tmp_path):
    _slow_python_model(tmp_path, "slow", 1.5)
    with start_server(tmp_path, "--model-control-mode=explicit", "--load-on-demand=true") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        error = client_error(client.infer, "slow", _inputs(), timeout=200_000)  # 0.2 s, in microseconds
        assert "did not finish loading within the request timeout" in str(error)
        assert _states(client)["slow"]["state"] == "LOADING"
        # the load goes on without any further request, and the model serves once it is ready
        wait_until(lambda: _states(client)["slow"]["state"] == "READY", timeout=30, interval=0.05)
        assert client.infer("slow", _inputs()).as_numpy("OUTPUT0")[0, 0] == 2
        assert metric_values(server)["naiad_model_loads"] == 1
