"""Many models on one server: unloading really frees memory; round-robin traffic under a budget."""

import os
import time

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import helper, numpy_helper

from tests.support.onnx_models import _save, _tensor, add_sub_model, write_config
from tests.support.servers import start_server


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
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and client.get_model_repository_index()[0].get("state") != "UNAVAILABLE":
            time.sleep(0.05)
        after = _rss(server.process.pid)
        assert after <= before * 1.05, (before, loaded, after)


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
        for round_ in range(2):
            for i in range(count):
                inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
                inputs[0].set_data_from_numpy(a * i)
                inputs[1].set_data_from_numpy(a)
                result = client.infer(f"m{i:02d}", inputs)  # any failure raises
                assert result.as_numpy("OUTPUT0")[0, 0] == i + 1
        index = httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
        evicted = [e for e in index if "evicted" in e.get("reason", "")]
        assert evicted, index
        import urllib.request

        metrics = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
        loads = float(next(l for l in metrics.splitlines() if l.startswith("naiad_model_loads ")).split()[1])
        assert loads >= count  # every model loaded at least once, several more than once
