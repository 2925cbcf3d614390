"""Framework backends side by side: Naiad's throughput at concurrency 16 with dynamic batching vs the framework
called in-process at the batch size the server formed.

    .venv/bin/python benchmarks/framework_bench.py                           # every installed framework
    .venv/bin/python benchmarks/framework_bench.py --frameworks xgboost pytorch --duration 5 --rounds 3
    .venv/bin/python benchmarks/framework_bench.py --output benchmarks/results/frameworks.json

Models (built here, with each framework's own API, from fixed seeds; each is "compute-heavy": one batch-1
call in-process takes about 0.5 ms or more on the benchmark VM):
  xgboost     FIL, XGBoost binary:logistic, 100 trees of depth 6, 32 features (the issue's tree-model case)
  lightgbm    FIL, LightGBM binary, 100 trees of 64 leaves, 32 features
  sklearn     FIL, scikit-learn RandomForestClassifier (100 trees, depth 10) through a Treelite checkpoint
  pytorch     TorchScript MLP 512-2048-2048-16
  openvino    the same MLP as an OpenVINO IR (FP32 weights, f32 precision hint)
  tensorflow  the same MLP as a SavedModel

Method: the server runs pinned to --server-core with one instance and one framework thread per model
(dynamic_batching {}); the closed-loop load generator (benchmarks/load.py's HTTP binary clients) runs on
--client-core with 16 clients sending batch-1 requests. The batch size formed is read from the model's
statistics (inference_count / execution_count). The ceiling is the framework called in-process, one call at
a time, one thread, pinned to the server's core, on batches of that size: rows/s = batch / time per call.
Every answer is checked once against the framework before timing.

Tree-model peers (the issue's XGBoost bar; --tree-concurrency 32, every server pinned to --server-core, run
one after the other in each round, the order alternating between rounds):
  - real Triton 2.51 (--triton-venv, default $TRITON_VENV or .venv-triton, started by benchmarks/start_triton.sh, with
    `pip install xgboost-cpu==3.2.0` in that venv): its Python backend calling xgboost's inplace_predict on the
    same xgboost.json (one instance, nthread 1, max_batch_size 4096, dynamic_batching {}), against Naiad over
    HTTP binary and gRPC (--tree-protocols);
  - MLServer 1.7.1 (--mlserver-venv, default .venv-bench/mlserver, made by setup_peers.sh plus
    `pip install --no-deps mlserver-xgboost==1.7.1 xgboost-cpu==3.2.0` plus `pip install scipy scikit-learn`)
    with its own XGBoost runtime (mlserver_xgboost.XGBoostModel, `debug: false`, `parallel_workers: 0`) on the
    same file, against Naiad over HTTP JSON (MLServer has no binary REST extension).
--skip-ceilings runs only these peers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import load

ROOT = Path(__file__).resolve().parents[1]
FEATURES = 32
MLP = (512, 2048, 2048, 16)
SEED = 11


@dataclass
class Case:
    framework: str
    model: str
    input_name: str
    output_name: str
    width: int
    predict: Callable[[np.ndarray], np.ndarray]  # in-process framework call, (rows, width) -> outputs
    tolerance: float = 0.0


@dataclass
class Row:
    framework: str
    model: str
    infer_per_sec: float
    p50_ms: float
    p99_ms: float
    batch_formed: float
    ceiling_rows_per_sec: float
    batch1_ms: float
    ratio: float
    errors: int


def _config(name: str, backend: str, inputs: str, outputs: str, max_batch: int, params: dict[str, str]) -> str:
    text = (f'name: "{name}"\nbackend: "{backend}"\nmax_batch_size: {max_batch}\n{inputs}{outputs}'
            "instance_group [{ kind: KIND_CPU count: 1 }]\ndynamic_batching { }\n")
    return text + "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in params.items())


def _io(kind: str, name: str, dims: list[int]) -> str:
    return f'{kind} [{{ name: "{name}" data_type: TYPE_FP32 dims: {dims} }}]\n'


def _table(rows: int = 20000) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(SEED).standard_normal((rows, FEATURES)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] * x[:, 2] - 0.5 * x[:, 3] + 0.3 * np.sin(2 * x[:, 4]) > 0).astype(np.int64)
    return x, y


def _fil(repo: Path, name: str, filename: str, model_type: str) -> Path:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(_config(
        name, "fil", _io("input", "input__0", [FEATURES]), _io("output", "output__0", [1]), 4096,
        {"model_type": model_type, "cpu_nthread": "1"}))
    return repo / name / "1" / filename


def build_xgboost(repo: Path) -> Case:
    import xgboost as xgb

    x, y = _table()
    params = {"objective": "binary:logistic", "max_depth": 6, "eta": 0.1, "nthread": 2, "seed": SEED}
    booster = xgb.train(params, xgb.DMatrix(x, label=y), num_boost_round=100)
    booster.save_model(str(_fil(repo, "xgboost_100x6", "xgboost.json", "xgboost_json")))
    booster.set_param({"nthread": 1})
    return Case("xgboost", "xgboost_100x6", "input__0", "output__0", FEATURES,
                lambda a: booster.inplace_predict(a, validate_features=False).reshape(-1, 1))


def build_lightgbm(repo: Path) -> Case:
    import lightgbm as lgb

    x, y = _table()
    params = {"objective": "binary", "num_leaves": 64, "verbose": -1, "num_threads": 2, "seed": SEED}
    booster = lgb.train(params, lgb.Dataset(x, label=y), num_boost_round=100)
    booster.save_model(str(_fil(repo, "lightgbm_100x64", "model.txt", "lightgbm")))
    return Case("lightgbm", "lightgbm_100x64", "input__0", "output__0", FEATURES,
                lambda a: booster.predict(a, num_threads=1).astype(np.float32).reshape(-1, 1))


def build_sklearn(repo: Path) -> Case:
    import treelite
    from sklearn.ensemble import RandomForestClassifier

    x, y = _table(5000)
    forest = RandomForestClassifier(n_estimators=100, max_depth=10, random_state=SEED, n_jobs=2).fit(x, y)
    forest.set_params(n_jobs=1)
    path = _fil(repo, "sklearn_rf_100", "checkpoint.tl", "treelite_checkpoint")
    treelite.sklearn.import_model(forest).serialize(str(path))
    config = (repo / "sklearn_rf_100" / "config.pbtxt").read_text()
    (repo / "sklearn_rf_100" / "config.pbtxt").write_text(
        config + 'parameters { key: "is_classifier" value: { string_value: "true" } }\n')
    return Case("sklearn", "sklearn_rf_100", "input__0", "output__0", FEATURES,
                lambda a: forest.predict(a).astype(np.float32).reshape(-1, 1))


def _mlp_weights() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(SEED)
    return [((rng.standard_normal((i, o)) * np.sqrt(2.0 / i)).astype(np.float32), (rng.standard_normal(o) * 0.01).astype(np.float32))
            for i, o in zip(MLP[:-1], MLP[1:])]


def _mlp_config(repo: Path, name: str, backend: str, in_name: str, out_name: str, params: dict[str, str], filename: str) -> Path:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(_config(
        name, backend, _io("input", in_name, [MLP[0]]), _io("output", out_name, [MLP[-1]]), 64, params))
    return repo / name / "1" / filename


def build_pytorch(repo: Path) -> Case:
    import warnings

    import torch

    torch.set_num_threads(1)
    layers: list[torch.nn.Module] = []
    for k, (w, b) in enumerate(_mlp_weights()):
        linear = torch.nn.Linear(*w.shape)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(w.T))
            linear.bias.copy_(torch.from_numpy(b))
        layers += [linear] + ([torch.nn.ReLU()] if k < len(MLP) - 2 else [])
    module = torch.nn.Sequential(*layers).eval()
    path = _mlp_config(repo, "pytorch_mlp", "pytorch", "INPUT__0", "OUTPUT__0", {"INTRA_OP_THREAD_COUNT": "1", "INTER_OP_THREAD_COUNT": "1"}, "model.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(module)
    scripted.save(str(path))

    def predict(a: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return scripted(torch.from_numpy(a)).numpy()

    return Case("pytorch", "pytorch_mlp", "INPUT__0", "OUTPUT__0", MLP[0], predict, 1e-4)


def build_openvino(repo: Path) -> Case:
    import openvino as ov
    import openvino.opset13 as ops

    x = ops.parameter([-1, MLP[0]], np.float32, name="X")
    y = x
    for k, (w, b) in enumerate(_mlp_weights()):
        y = ops.add(ops.matmul(y, ops.constant(w), False, False), ops.constant(b))
        if k < len(MLP) - 2:
            y = ops.relu(y)
    y.output(0).get_tensor().set_names({"Y"})
    path = _mlp_config(repo, "openvino_mlp", "openvino", "X", "Y",
                       {"INFERENCE_NUM_THREADS": "1", "NUM_STREAMS": "1", "INFERENCE_PRECISION_HINT": "f32"}, "model.xml")
    ov.save_model(ov.Model([y], [x], "mlp"), str(path), compress_to_fp16=False)
    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(path)), "CPU",
                                  {"INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1, "INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    return Case("openvino", "openvino_mlp", "X", "Y", MLP[0], lambda a: request.infer({"X": a})[compiled.outputs[0]], 1e-4)


def build_tensorflow(repo: Path) -> Case:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    weights = [(tf.constant(w), tf.constant(b)) for w, b in _mlp_weights()]

    class Mlp(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, MLP[0]], tf.float32, name="x")])
        def serve(self, x):
            for k, (w, b) in enumerate(weights):
                x = tf.matmul(x, w) + b
                if k < len(weights) - 1:
                    x = tf.nn.relu(x)
            return {"y": x}

    (repo / "tensorflow_mlp" / "1").mkdir(parents=True)
    module = Mlp()
    tf.saved_model.save(module, str(repo / "tensorflow_mlp" / "1" / "model.savedmodel"), signatures={"serving_default": module.serve})
    (repo / "tensorflow_mlp" / "config.pbtxt").write_text(_config(
        "tensorflow_mlp", "tensorflow", _io("input", "x", [MLP[0]]), _io("output", "y", [MLP[-1]]), 64, {}))
    fn = module.serve.get_concrete_function()
    return Case("tensorflow", "tensorflow_mlp", "x", "y", MLP[0], lambda a: fn(x=tf.constant(a))["y"].numpy(), 1e-4)


BUILDERS = {"xgboost": build_xgboost, "lightgbm": build_lightgbm, "sklearn": build_sklearn,
            "pytorch": build_pytorch, "openvino": build_openvino, "tensorflow": build_tensorflow}
PACKAGES = {"xgboost": "xgboost", "lightgbm": "lightgbm", "sklearn": "treelite", "pytorch": "torch",
            "openvino": "openvino", "tensorflow": "tensorflow"}


def per_call_seconds(fn: Callable[[np.ndarray], np.ndarray], batch: np.ndarray, seconds: float = 1.0) -> float:
    """Best-of-5 mean time of one call, after a warm-up."""
    for _ in range(5):
        fn(batch)
    best = float("inf")
    for _ in range(5):
        calls, start = 0, time.perf_counter()
        while True:
            fn(batch)
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds / 5:
                break
        best = min(best, elapsed / calls)
    return best


def start_server(repo: Path, core: int) -> tuple[subprocess.Popen, int, int]:
    command = ["taskset", "-c", str(core), sys.executable, "-m", "naiad", "serve", "--model-repository", str(repo),
               "--http-address", "127.0.0.1", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
               "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1"]
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    deadline = time.monotonic() + 300
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("NAIAD_READY "):
            ports = json.loads(line[len("NAIAD_READY "):])
            return process, ports["http_port"], ports["grpc_port"]
        if time.monotonic() > deadline:
            break
    process.kill()
    raise SystemExit("naiad serve did not start")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_mlserver(venv: Path, work: Path, model_file: Path, core: int) -> tuple[subprocess.Popen, int]:
    root = work / "mlserver_repo"
    (root / "xgboost_100x6").mkdir(parents=True)
    port = free_port()
    (root / "settings.json").write_text(json.dumps({
        "debug": False, "parallel_workers": 0, "host": "127.0.0.1", "http_port": port, "grpc_port": free_port(),
        "metrics_port": free_port(), "load_models_at_startup": True}))
    (root / "xgboost_100x6" / "model-settings.json").write_text(json.dumps({
        "name": "xgboost_100x6", "implementation": "mlserver_xgboost.XGBoostModel", "parameters": {"uri": str(model_file)}}))
    log = open(work / "mlserver.log", "w")
    process = subprocess.Popen(["taskset", "-c", str(core), str(venv / "bin" / "mlserver"), "start", str(root)],
                               stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/xgboost_100x6/ready", timeout=2) as r:
                if r.status == 200:
                    return process, port
        except OSError:
            time.sleep(0.5)
    process.kill()
    raise SystemExit(f"mlserver did not start; see {work / 'mlserver.log'}")


TRITON_MODEL_PY = '''import numpy as np
import xgboost as xgb
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.booster = xgb.Booster()
        self.booster.load_model(f"{args['model_repository']}/{args['model_version']}/xgboost.json")
        self.booster.set_param({"nthread": 1})

    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, "input__0").as_numpy() for r in requests]
        x = np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
        y = self.booster.inplace_predict(x, validate_features=False).astype(np.float32).reshape(-1, 1)
        responses, offset = [], 0
        for a in arrays:
            out = pb_utils.Tensor("output__0", y[offset:offset + len(a)])
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            offset += len(a)
        return responses
'''


def start_triton(venv: Path, work: Path, model_file: Path, core: int) -> tuple[subprocess.Popen, int, int]:
    """Real Triton 2.51, its Python backend calling xgboost (one instance, nthread 1, dynamic batching)."""
    import shutil

    model_dir = work / "triton_repo" / "xgboost_100x6"
    (model_dir / "1").mkdir(parents=True)
    shutil.copy(model_file, model_dir / "1" / "xgboost.json")
    (model_dir / "1" / "model.py").write_text(TRITON_MODEL_PY)
    (model_dir / "config.pbtxt").write_text(_config(
        "xgboost_100x6", "python", _io("input", "input__0", [FEATURES]), _io("output", "output__0", [1]), 4096, {}))
    http, grpc, metrics = free_port(), free_port(), free_port()
    log = open(work / "triton.log", "w")
    process = subprocess.Popen(["taskset", "-c", str(core), "bash", str(ROOT / "benchmarks" / "start_triton.sh"),
                                str(work / "triton_repo"), str(http), str(grpc), str(metrics)],
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                               env=dict(os.environ, TRITON_VENV=str(venv), OMP_NUM_THREADS="1"))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/xgboost_100x6/ready", timeout=2) as r:
                if r.status == 200:
                    return process, http, grpc
        except OSError:
            time.sleep(0.5)
    stop_group(process)
    raise SystemExit(f"tritonserver did not start; see {work / 'triton.log'}")


def stop_group(process: subprocess.Popen) -> None:
    import signal

    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def model_counts(port: int, model: str) -> tuple[int, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats", timeout=10) as response:
        stats = json.loads(response.read())["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def drive(case: Case, port: int, concurrency: int, duration: float, warmup: float, protocol: str = "http-binary",
          output_name: str = "") -> load.LoadResult:
    x = np.random.default_rng(1).standard_normal((1, case.width)).astype(np.float32)
    expected = case.predict(x)
    output = output_name or case.output_name

    def check(out: dict[str, np.ndarray]) -> None:
        np.testing.assert_allclose(out[output].reshape(expected.shape), expected, rtol=max(case.tolerance, 1e-6), atol=case.tolerance)

    workload = load.Workload(case.model, [(case.input_name, "FP32", x)], [output], check)
    load.check_once(protocol, "127.0.0.1", port, workload)
    samples = load.Samples()
    start_at = time.perf_counter()
    budget = load.Budget(10_000_000, start_at + warmup + duration)
    loop = load._new_event_loop()
    try:
        loop.run_until_complete(load._run_clients(protocol, "127.0.0.1", port, workload, concurrency, budget,
                                                  samples, warmup + duration + 60, 1))
    finally:
        loop.close()
    return load.summarize(protocol, case.model, concurrency, np.asarray(samples.starts, np.int64),
                          np.asarray(samples.ends, np.int64), samples.errors, samples.first_error,
                          start_at + warmup, start_at + warmup + duration)


def measure(case: Case, port: int, args: argparse.Namespace) -> Row:
    os.sched_setaffinity(0, {args.client_core})
    before = model_counts(port, case.model)
    result = drive(case, port, args.concurrency, args.duration, args.warmup)
    after = model_counts(port, case.model)
    executions = max(after[1] - before[1], 1)
    batch = (after[0] - before[0]) / executions
    os.sched_setaffinity(0, {args.server_core})  # the ceiling runs where the server ran (now idle)
    rows = max(1, round(batch))
    x = np.random.default_rng(2).standard_normal((rows, case.width)).astype(np.float32)
    ceiling = rows / per_call_seconds(case.predict, x)
    batch1 = per_call_seconds(case.predict, x[:1]) * 1000
    return Row(case.framework, case.model, result.infer_per_sec, result.p50_ms, result.p99_ms, batch, ceiling,
               batch1, result.infer_per_sec / ceiling, result.errors)


@dataclass
class PeerRow:
    """One server driven with the XGBoost tree model in the tree-peer comparison."""

    round: int
    server: str
    protocol: str
    infer_per_sec: float
    p50_ms: float
    p99_ms: float
    batch_formed: float
    errors: int


def tree_peers(case: Case, servers: dict[str, dict[str, int]], args: argparse.Namespace, round_index: int) -> list[PeerRow]:
    """Naiad vs real Triton (same protocols) and Naiad vs MLServer (HTTP JSON), interleaved, order alternating."""
    os.sched_setaffinity(0, {args.client_core})
    rows: list[PeerRow] = []
    pairs = [(protocol, ["naiad", "triton"]) for protocol in args.tree_protocols] + [("http-json", ["naiad", "mlserver"])]
    for protocol, names in pairs:
        names = [n for n in names if n in servers and protocol in servers[n]]
        if round_index % 2:
            names.reverse()
        for name in names:
            port = servers[name][protocol]
            before = model_counts(servers[name]["http-json"], case.model) if name != "mlserver" else (0, 0)
            result = drive(case, port, args.tree_concurrency, args.duration, args.warmup, protocol,
                           "predict" if name == "mlserver" else "")
            after = model_counts(servers[name]["http-json"], case.model) if name != "mlserver" else (0, 1)
            batch = (after[0] - before[0]) / max(after[1] - before[1], 1) if name != "mlserver" else float("nan")
            rows.append(PeerRow(round_index, name, protocol, result.infer_per_sec, result.p50_ms, result.p99_ms, batch,
                                result.errors))
            print(f"  round {round_index + 1} {name:8s} {protocol:11s} c={args.tree_concurrency}: {result.infer_per_sec:7.0f}/s "
                  f"p50 {result.p50_ms:.2f} ms p99 {result.p99_ms:.2f} ms batch {batch:.1f}"
                  + (f" ({result.errors} errors)" if result.errors else ""), flush=True)
    return rows


def print_tree_peers(rows: list[PeerRow], concurrency: int) -> None:
    if not rows:
        return
    print(f"\nXGBoost 100x6 tree peers, concurrency {concurrency}, one core per server (best round; median in brackets)")
    for protocol in dict.fromkeys(r.protocol for r in rows):
        best = {}
        for name in dict.fromkeys(r.server for r in rows if r.protocol == protocol):
            values = sorted(r.infer_per_sec for r in rows if r.protocol == protocol and r.server == name)
            best[name] = (values[-1], values[len(values) // 2])
            print(f"  {protocol:11s} {name:8s} {values[-1]:7.0f}/s  [{values[len(values) // 2]:.0f}]")
        for peer in ("triton", "mlserver"):
            if peer in best and "naiad" in best:
                per_round = [n.infer_per_sec / t.infer_per_sec
                             for n in rows if n.protocol == protocol and n.server == "naiad"
                             for t in rows if t.protocol == protocol and t.server == peer and t.round == n.round]
                print(f"  {protocol:11s} naiad / {peer}: best {best['naiad'][0] / best[peer][0]:.2f}x, "
                      f"per round {', '.join(f'{r:.2f}' for r in per_round)}")


def main() -> int:
    parser = argparse.ArgumentParser(description="Naiad framework backends vs the framework in-process")
    parser.add_argument("--frameworks", nargs="+", default=list(BUILDERS), choices=list(BUILDERS))
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tree-concurrency", type=int, default=32, help="concurrency of the XGBoost peer comparison")
    parser.add_argument("--tree-protocols", nargs="+", default=["http-binary", "grpc"], choices=["http-binary", "grpc"],
                        help="protocols of the Naiad vs Triton comparison (MLServer is always HTTP JSON)")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=1, help="repeat; the fastest round per model is reported")
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--client-core", type=int, default=1)
    parser.add_argument("--output", type=Path, help="write every round's rows as JSON")
    parser.add_argument("--mlserver-venv", type=Path, default=Path(os.environ.get("NAIAD_BENCH_VENVS", ".venv-bench")) / "mlserver",
                        help="MLServer venv with mlserver-xgboost for the XGBoost peer (skipped when absent)")
    parser.add_argument("--triton-venv", type=Path, default=Path(os.environ.get("TRITON_VENV", ".venv-triton")),
                        help="venv of benchmarks/start_triton.sh with xgboost installed (skipped when absent)")
    parser.add_argument("--skip-ceilings", action="store_true", help="only the XGBoost tree-peer comparison")
    args = parser.parse_args()
    import importlib.util

    wanted = [f for f in args.frameworks if importlib.util.find_spec(PACKAGES[f]) is not None]
    for missing in sorted(set(args.frameworks) - set(wanted)):
        print(f"skipping {missing}: {PACKAGES[missing]} is not installed")
    os.sched_setaffinity(0, {args.server_core})
    with tempfile.TemporaryDirectory(prefix="naiad-fw-bench-") as work:
        repo = Path(work) / "models"
        repo.mkdir()
        cases = [BUILDERS[f](repo) for f in wanted]
        process, port, grpc_port = start_server(repo, args.server_core)
        peers: dict[str, subprocess.Popen] = {}
        servers = {"naiad": {"http-json": port, "http-binary": port, "grpc": grpc_port}}
        xgb_case = next((c for c in cases if c.framework == "xgboost"), None)
        rounds: list[list[Row]] = []
        peer_rows: list[PeerRow] = []
        try:
            model_file = repo / "xgboost_100x6" / "1" / "xgboost.json"
            if xgb_case is not None and (args.mlserver_venv / "bin" / "mlserver").exists():
                peers["mlserver"], mlserver_port = start_mlserver(args.mlserver_venv, Path(work), model_file, args.server_core)
                servers["mlserver"] = {"http-json": mlserver_port}
            if xgb_case is not None and (args.triton_venv / "bin" / "python").exists():
                peers["triton"], http, grpc = start_triton(args.triton_venv, Path(work), model_file, args.server_core)
                servers["triton"] = {"http-json": http, "http-binary": http, "grpc": grpc}
            for r in range(args.rounds):
                if not args.skip_ceilings:
                    rounds.append([measure(case, port, args) for case in cases])
                if xgb_case is not None:
                    peer_rows += tree_peers(xgb_case, servers, args, r)
        finally:
            process.terminate()
            process.wait(30)
            for peer in peers.values():
                stop_group(peer)
    if rounds:
        best = [max((r[i] for r in rounds), key=lambda row: row.infer_per_sec) for i in range(len(cases))]
        print(f"\nconcurrency {args.concurrency}, HTTP binary, batch-1 requests, server on core {args.server_core}, "
              f"{args.rounds} round(s) of {args.duration:g} s (fastest shown)")
        print(f"{'framework':11s} {'model':16s} {'naiad/s':>9s} {'p50 ms':>7s} {'p99 ms':>7s} {'batch':>6s} "
              f"{'ceiling/s':>10s} {'b1 ms':>6s} {'ratio':>6s}")
        for row in best:
            print(f"{row.framework:11s} {row.model:16s} {row.infer_per_sec:9.0f} {row.p50_ms:7.2f} {row.p99_ms:7.2f} "
                  f"{row.batch_formed:6.1f} {row.ceiling_rows_per_sec:10.0f} {row.batch1_ms:6.2f} {row.ratio:5.2f}x"
                  + (f"  ({row.errors} errors)" if row.errors else ""))
    print_tree_peers(peer_rows, args.tree_concurrency)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                           "rounds": [[asdict(r) for r in rows] for rows in rounds],
                                           "tree_peers": [asdict(r) for r in peer_rows]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
