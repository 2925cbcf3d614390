"""Any backend's instances in worker processes (parameter INSTANCE_PROCESS): a TorchScript model and an ONNX
model serve from workers of their own, the server process never loads their frameworks (the ONNX model's
config is auto-completed in a throw-away worker), a killed worker fails its in-flight request and is
restarted, and a bad parameter value fails the load clearly while the server keeps serving."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.framework_models import write_config
from tests.support.onnx_models import add_sub_onnx
from tests.support.process_tree import descendants, kill_while_executing, maps_library
from tests.support.servers import RunningServer, start_server
from tests.support.waiting import wait_until

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

PROCESS = 'parameters { key: "INSTANCE_PROCESS" value: { string_value: "true" } }'

TORCH_CONFIG = """
name: "spin_torch"
backend: "pytorch"
max_batch_size: 8
input [
  { name: "x" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "loops" data_type: TYPE_INT64 dims: [ 1 ] }
]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
""" + PROCESS

# Inputs and outputs left out: auto-completed from the ONNX file.
ONNX_CONFIG = """
name: "add_sub_process"
backend: "onnxruntime"
max_batch_size: 8
instance_group [ { count: 2 kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 20000 }
""" + PROCESS


class Spin(torch.nn.Module):
    """OUTPUT__0 = 2x + 1, after `loops` turns of a scalar loop: a long execution on request."""

    def forward(self, x: torch.Tensor, loops: torch.Tensor) -> torch.Tensor:
        acc = torch.zeros(1)
        for _ in range(int(loops.max().item())):
            acc = acc + 1.0
        return x * 2.0 + 1.0 + acc * 0.0


def _write_torch(repo: Path) -> None:
    model_dir = repo / "spin_torch"
    (model_dir / "1").mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`torch.jit.script` is deprecated", category=DeprecationWarning)
        torch.jit.script(Spin().eval()).save(str(model_dir / "1" / "model.pt"))
    write_config(model_dir, TORCH_CONFIG)


def _write_onnx(repo: Path) -> None:
    model_dir = repo / "add_sub_process"
    (model_dir / "1").mkdir(parents=True)
    add_sub_onnx(model_dir / "1" / "model.onnx")
    write_config(model_dir, ONNX_CONFIG)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("process_instances")
    _write_torch(repo)
    _write_onnx(repo)
    bad = repo / "bad_process"
    (bad / "1").mkdir(parents=True)
    add_sub_onnx(bad / "1" / "model.onnx")
    write_config(bad, ONNX_CONFIG.replace("add_sub_process", "bad_process").replace('"true"', '"sometimes"'))
    broken = repo / "broken_process"
    (broken / "1").mkdir(parents=True)
    (broken / "1" / "model.onnx").write_bytes(b"not an onnx model")
    write_config(broken, ONNX_CONFIG.replace("add_sub_process", "broken_process"))
    with start_server(repo, "--model-control-mode=explicit", "--load-model=spin_torch",
                      "--load-model=add_sub_process", timeout=180) as running:
        yield running


def _workers(server: RunningServer) -> set[int]:
    return set(descendants(server.process.pid))


def _spin(client: httpclient.InferenceServerClient, x: np.ndarray, loops: int) -> np.ndarray:
    inputs = [httpclient.InferInput("x", list(x.shape), "FP32"), httpclient.InferInput("loops", [x.shape[0], 1], "INT64")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(np.full((x.shape[0], 1), loops, np.int64))
    return client.infer("spin_torch", inputs).as_numpy("OUTPUT__0")


def _maps_torch(pid: int) -> bool:
    return maps_library(pid, "libtorch")


def _torch_worker(server: RunningServer, not_this: int = 0) -> int:
    """The PyTorch instance's worker: the one worker that mapped libtorch (the ONNX workers do not)."""
    def found() -> int:
        pids = [pid for pid in _workers(server) if pid != not_this and _maps_torch(pid)]
        return pids[0] if len(pids) == 1 else 0
    return wait_until(found, "the worker process of the PyTorch instance", timeout=120)


def test_torchscript_model_runs_in_a_worker_process_and_serves(server: RunningServer) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(_spin(http, x, 3), x * 2 + 1)

    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = [grpcclient.InferInput("x", [1, 4], "FP32"), grpcclient.InferInput("loops", [1, 1], "INT64")]
    inputs[0].set_data_from_numpy(np.ones((1, 4), np.float32))
    inputs[1].set_data_from_numpy(np.ones((1, 1), np.int64))
    np.testing.assert_allclose(grpc.infer("spin_torch", inputs).as_numpy("OUTPUT__0"), np.full((1, 4), 3.0))
    # Instances are worker processes of the server (three: one PyTorch, two ONNX), not the server itself.
    workers = _workers(server)
    assert len(workers) == 3 and server.process.pid not in workers
    assert _torch_worker(server) in workers


def test_the_server_process_never_loads_the_frameworks_of_process_instances(server: RunningServer) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    config = http.get_model_config("add_sub_process")  # auto-completed from the ONNX file, in a worker
    assert sorted(t["name"] for t in config["input"]) == ["INPUT0", "INPUT1"]
    assert [t["dims"] for t in config["output"]] == [[16], [16]]
    out0, _ = _add_sub(http, np.ones((1, 16), np.float32), np.ones((1, 16), np.float32))
    np.testing.assert_allclose(out0, np.full((1, 16), 2.0))
    workers = _workers(server)
    assert any(maps_library(pid, "onnxruntime") for pid in workers) and _torch_worker(server) in workers
    assert not maps_library(server.process.pid, "libtorch")
    assert not maps_library(server.process.pid, "onnxruntime")


def test_killed_torch_worker_fails_its_request_then_restarts(server: RunningServer) -> None:
    http = httpclient.InferenceServerClient(server.http_url, network_timeout=300)
    x = np.ones((1, 4), np.float32)
    np.testing.assert_allclose(_spin(http, x, 1), x * 2 + 1)
    victim = _torch_worker(server)

    error = kill_while_executing(
        victim, lambda: _spin(httpclient.InferenceServerClient(server.http_url, network_timeout=300), x, 10**9))
    assert isinstance(error, InferenceServerException) and "not healthy" in str(error), error

    replacement = _torch_worker(server, not_this=victim)
    assert replacement != victim

    def serves() -> bool:
        try:
            return bool(np.allclose(_spin(http, x, 1), x * 2 + 1))
        except InferenceServerException:
            return False  # still restarting: requests fail fast until the new worker is ready

    wait_until(serves, "the restarted PyTorch instance to serve", timeout=120)
    for rows in (1, 3, 8):
        batch = np.random.default_rng(rows).standard_normal((rows, 4)).astype(np.float32)
        np.testing.assert_allclose(_spin(http, batch, 2), batch * 2 + 1, rtol=1e-6)
    assert server.process.poll() is None


def _add_sub(client: httpclient.InferenceServerClient, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    inputs = [httpclient.InferInput("INPUT0", list(a.shape), "FP32"), httpclient.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub_process", inputs)
    return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")


def test_onnx_model_with_process_instances_batches_and_splits_back(server: RunningServer) -> None:
    rng = np.random.default_rng(0)
    pairs = [(rng.standard_normal((rows, 16)).astype(np.float32), rng.standard_normal((rows, 16)).astype(np.float32))
             for rows in (1, 2, 3, 1, 2, 1, 1, 3)]
    results: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(pairs)

    def call(index: int) -> None:
        results[index] = _add_sub(httpclient.InferenceServerClient(server.http_url), *pairs[index])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(pairs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for (a, b), result in zip(pairs, results):
        assert result is not None
        np.testing.assert_allclose(result[0], a + b, rtol=1e-6)
        np.testing.assert_allclose(result[1], a - b, rtol=1e-6)
    stats = httpclient.InferenceServerClient(server.http_url).get_inference_statistics("add_sub_process")
    assert int(stats["model_stats"][0]["inference_stats"]["success"]["count"]) >= len(pairs)


def test_bad_instance_process_value_fails_the_load_and_the_server_keeps_serving(server: RunningServer) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException) as info:
        http.load_model("bad_process")
    assert "INSTANCE_PROCESS must be true or false" in str(info.value)
    assert not http.is_model_ready("bad_process")
    out0, out1 = _add_sub(http, np.ones((1, 16), np.float32), np.full((1, 16), 2.0, np.float32))
    np.testing.assert_allclose(out0, np.full((1, 16), 3.0))
    np.testing.assert_allclose(out1, np.full((1, 16), -1.0))


def test_an_auto_completion_failing_in_its_worker_fails_the_load_clearly(server: RunningServer) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException) as info:
        http.load_model("broken_process")
    assert "unable to load ONNX model" in str(info.value)  # the backend's own words, from the worker
    assert not http.is_model_ready("broken_process")
    out0, _ = _add_sub(http, np.ones((1, 16), np.float32), np.ones((1, 16), np.float32))
    np.testing.assert_allclose(out0, np.full((1, 16), 2.0))
    assert not maps_library(server.process.pid, "onnxruntime")
