"""Dynamic batching benchmark: what the batcher buys, and Naiad vs real Triton on the example MLP.

    .venv/bin/python benchmarks/batching_bench.py                  # both parts, 3 rounds of 5 s cells
    .venv/bin/python benchmarks/batching_bench.py --parts heavy --rounds 1 --duration 3
    .venv/bin/python benchmarks/batching_bench.py --parts triton --protocols http-binary grpc

Part `heavy`: a compute-heavy ONNX model generated here (mlp_heavy: 256-4096-4096-10 with
softmax, random weights; one batch-1 call in-process takes milliseconds) served by one Naiad
twice, as `heavy_batched` (dynamic_batching {}) and `heavy_plain` (no dynamic batching: each
request runs alone), at concurrency 32. The batch size the batcher formed is read from the
model's statistics (inference_count / execution_count over the cell), and onnxruntime is timed
in-process at batch 1 and at that batch size, pinned to the server's core while the server idles.

Part `triton`: the example mlp_classifier (256-512-512-10) with dynamic batching at concurrency
32, Naiad vs real Triton 2.51 (benchmarks/start_triton.sh) serving the same ONNX file through
its Python backend (a model.py calling onnxruntime on the concatenated batch), dynamic_batching
{} on both, one instance, one onnxruntime thread.

Every server runs under `taskset -c <server core>` (all servers are started first and take
turns cell by cell, the idle ones at ~0% CPU) and the load generator (load.py, closed loop)
under `taskset -c <client core>`. Cells are interleaved round by round; the table reports each
cell's median round, ratios are computed from the medians.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "examples"))

from run_onnx_bench import log, machine_line, run_load  # noqa: E402  (benchmarks/ is not a package)
from servers import start_naiad, start_triton  # noqa: E402

CONCURRENCY = 32
HEAVY_HIDDEN = 4096
ORT_ONE_THREAD = """parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
parameters { key: "inter_op_thread_count" value: { string_value: "1" } }
"""
HEAVY_CONFIG = """name: "{name}"
backend: "onnxruntime"
max_batch_size: 32
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 256 ] }} ]
output [ {{ name: "PROBABILITIES" data_type: TYPE_FP32 dims: [ 10 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{scheduler}
"""

TRITON_MLP_CONFIG = """name: "mlp_classifier"
backend: "python"
max_batch_size: 32
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "PROBABILITIES" data_type: TYPE_FP32 dims: [ 10 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { }
"""
TRITON_MLP_PY = '''import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """The ONNX file next to this model.py, run by onnxruntime on the whole dynamic batch."""

    def initialize(self, args):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        path = os.path.join(os.path.dirname(__file__), "model.onnx")
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy() for r in requests]
        out = self.session.run(["PROBABILITIES"], {"INPUT": np.concatenate(arrays)})[0]
        responses, offset = [], 0
        for array in arrays:
            rows = out[offset:offset + len(array)]
            offset += len(array)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PROBABILITIES", rows)]))
        return responses
'''


# ---------------------------------------------------------------- models

def heavy_onnx(path: Path, hidden: int = HEAVY_HIDDEN, seed: int = 0) -> None:
    """256-hidden-hidden-10 MLP with softmax (INPUT -> PROBABILITIES, dynamic batch)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    sizes = [256, hidden, hidden, 10]
    inits, nodes, current = [], [], "INPUT"
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
        b = np.zeros(n_out, np.float32)
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"B{i}")]
        nodes.append(helper.make_node("Gemm", [current, f"W{i}", f"B{i}"], [f"H{i}"]))
        current = f"H{i}"
        if i < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [current], [f"R{i}"]))
            current = f"R{i}"
    nodes.append(helper.make_node("Softmax", [current], ["PROBABILITIES"], axis=1))
    graph = helper.make_graph(
        nodes, "mlp_heavy",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", 256])],
        [helper.make_tensor_value_info("PROBABILITIES", TensorProto.FLOAT, ["batch", 10])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def mlp_onnx(work: Path) -> Path:
    """The example repository's mlp_classifier directory (ONNX file and config), regenerated."""
    import generate_models

    generate_models.write_repository(work / "examples")
    return work / "examples" / "mlp_classifier" / "1" / "model.onnx"


# ---------------------------------------------------------------- servers

def model_counts(port: int, model: str) -> tuple[int, int, dict[int, int]]:
    """(inference_count, execution_count, executions per batch size) from the v2 statistics extension."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats", timeout=10) as reply:
        stats = json.load(reply)["model_stats"][0]
    sizes = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", [])}
    return int(stats["inference_count"]), int(stats["execution_count"]), sizes


# ---------------------------------------------------------------- in-process onnxruntime

def _one_thread_session(model_path: str):  # -> onnxruntime.InferenceSession
    """onnxruntime on one thread, as the served models are configured."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])


def ort_main(model_path: str, batch: int, duration: float) -> None:
    """Subprocess entry: onnxruntime alone, one thread, batch `batch` back to back."""
    session = _one_thread_session(model_path)
    feeds = {"INPUT": np.random.default_rng(0).standard_normal((batch, 256)).astype(np.float32)}
    for _ in range(3):
        session.run(None, feeds)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < duration:
        session.run(None, feeds)
        calls += 1
    elapsed = time.perf_counter() - start
    print(json.dumps({"batch": batch, "ms_per_call": elapsed / calls * 1e3, "rows_per_sec": calls * batch / elapsed}))


def ort_mix_main(model_path: str, histogram_json: str, duration: float) -> None:
    """Subprocess entry: onnxruntime alone, one thread, replaying the batch sizes of a histogram
    ({size: executions}) in proportion, back to back: its own throughput on the batches formed."""
    histogram = {int(k): v for k, v in json.loads(histogram_json).items() if v}
    session = _one_thread_session(model_path)
    rng = np.random.default_rng(0)
    feeds = {size: {"INPUT": rng.standard_normal((size, 256)).astype(np.float32)} for size in histogram}
    total = sum(histogram.values())
    # One cycle of ~100 executions with the histogram's proportions, shuffled once.
    cycle = [size for size, count in histogram.items() for _ in range(max(1, round(100 * count / total)))]
    rng.shuffle(cycle)
    for size in histogram:
        session.run(None, feeds[size])
    rows, start = 0, time.perf_counter()
    while time.perf_counter() - start < duration:
        for size in cycle:
            session.run(None, feeds[size])
            rows += size
    elapsed = time.perf_counter() - start
    print(json.dumps({"histogram": histogram, "rows_per_sec": rows / elapsed}))


def measure_ort_mix(core: str, model_path: Path, histogram: dict[int, int], duration: float) -> dict:
    cmd = ["taskset", "-c", core, sys.executable, str(Path(__file__).resolve()), "--_ort_mix", str(model_path),
           json.dumps(histogram), str(duration)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 120)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_ort(core: str, model_path: Path, batch: int, duration: float) -> dict:
    cmd = ["taskset", "-c", core, sys.executable, str(Path(__file__).resolve()), "--_ort", str(model_path), str(batch),
           str(duration)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 120)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- parts

def part_heavy(work: Path, args) -> dict:
    # load.py's "mlp*" workload (INPUT[1,256] -> a distribution over 10) fits these models.
    repo = work / "heavy_repo"
    models = ["mlp_heavy_batched", "mlp_heavy_plain"]
    for name in models:
        heavy_onnx(repo / name / "1" / "model.onnx")
        scheduler = "dynamic_batching { }" if name.endswith("batched") else ""
        (repo / name / "config.pbtxt").write_text(HEAVY_CONFIG.format(name=name, scheduler=scheduler) + ORT_ONE_THREAD)
    model_path = repo / models[0] / "1" / "model.onnx"
    server = start_naiad(work, repo, args.server_core, models, args.grpc_impl)
    rounds: list[dict] = []
    try:
        for r in range(args.rounds):
            cells: dict = {}
            for protocol in args.heavy_protocols:
                for model in (models if r % 2 == 0 else models[::-1]):
                    before = model_counts(server.http_port, model)
                    port = server.grpc_port if protocol == "grpc" else server.http_port
                    result = run_load(args.client_core, port, protocol, model, CONCURRENCY, args, model_path)
                    after = model_counts(server.http_port, model)
                    executions = after[1] - before[1]
                    result["formed_batch"] = (after[0] - before[0]) / executions if executions else 0.0
                    result["batch_sizes"] = {size: count - before[2].get(size, 0)
                                             for size, count in after[2].items() if count > before[2].get(size, 0)}
                    cells[f"{model}/{protocol}"] = result
                    log(f"heavy round {r + 1} {model} {protocol}: {result.get('infer_per_sec', 0):.0f}/s "
                        f"batch {result['formed_batch']:.1f} {result.get('error', '')}")
            # onnxruntime alone in the same round, on the server's core while the server idles.
            formed = [c["formed_batch"] for k, c in cells.items() if "batched" in k and c["formed_batch"]]
            batch = max(1, round(float(np.median(formed)))) if formed else 32
            cells["ort_batch1"] = measure_ort(args.server_core, model_path, 1, min(args.duration, 3.0))
            cells["ort_formed"] = measure_ort(args.server_core, model_path, batch, args.duration)
            for protocol in args.heavy_protocols:  # the very batch sizes the batcher formed, in proportion
                sizes = cells[f"{models[0]}/{protocol}"].get("batch_sizes")
                if sizes:
                    cells[f"ort_mix/{protocol}"] = measure_ort_mix(args.server_core, model_path, sizes, args.duration)
            log(f"heavy round {r + 1} onnxruntime: batch 1 {cells['ort_batch1']['ms_per_call']:.2f} ms/call; "
                f"batch {batch} {cells['ort_formed']['rows_per_sec']:.0f} rows/s")
            rounds.append(cells)
    finally:
        server.stop()
    return {"rounds": rounds, "models": models}


def part_triton(work: Path, args) -> dict:
    onnx_path = mlp_onnx(work)
    naiad_repo = work / "mlp_naiad"
    shutil.copytree(onnx_path.parent.parent, naiad_repo / "mlp_classifier")
    with open(naiad_repo / "mlp_classifier" / "config.pbtxt", "a") as f:
        f.write("instance_group [ { count: 1 kind: KIND_CPU } ]\n" + ORT_ONE_THREAD)
    triton_repo = work / "mlp_triton"
    (triton_repo / "mlp_classifier" / "1").mkdir(parents=True)
    shutil.copy(onnx_path, triton_repo / "mlp_classifier" / "1" / "model.onnx")
    (triton_repo / "mlp_classifier" / "config.pbtxt").write_text(TRITON_MLP_CONFIG)
    (triton_repo / "mlp_classifier" / "1" / "model.py").write_text(TRITON_MLP_PY)
    servers = {"naiad": start_naiad(work, naiad_repo, args.server_core, ["mlp_classifier"], args.grpc_impl)}
    try:
        servers["triton"] = start_triton(work, triton_repo, args.server_core, ["mlp_classifier"])
        rounds: list[dict] = []
        for r in range(args.rounds):
            cells = {}
            for protocol in args.protocols:
                order = ["naiad", "triton"] if r % 2 == 0 else ["triton", "naiad"]
                for name in order:
                    server = servers[name]
                    before = model_counts(server.http_port, "mlp_classifier")
                    port = server.grpc_port if protocol == "grpc" else server.http_port
                    result = run_load(args.client_core, port, protocol, "mlp_classifier", CONCURRENCY, args, onnx_path)
                    after = model_counts(server.http_port, "mlp_classifier")
                    executions = after[1] - before[1]
                    result["formed_batch"] = (after[0] - before[0]) / executions if executions else 0.0
                    cells[f"{name}/{protocol}"] = result
                    log(f"triton round {r + 1} {name} {protocol}: {result.get('infer_per_sec', 0):.0f}/s "
                        f"batch {result['formed_batch']:.1f} {result.get('error', '')}")
            rounds.append(cells)
    finally:
        for server in servers.values():
            server.stop()
    return {"rounds": rounds}


# ---------------------------------------------------------------- report

def median_cell(rounds: list[dict], key: str) -> dict:
    cells = [r[key] for r in rounds if key in r and "infer_per_sec" in r[key] and not r[key].get("error")]
    if not cells:
        return {}
    ordered = sorted(cells, key=lambda c: c["infer_per_sec"])
    chosen = dict(ordered[len(ordered) // 2])
    chosen["all"] = [round(c["infer_per_sec"]) for c in cells]
    return chosen


def report(results: dict, args) -> str:
    lines = [f"Run {results['when']} — {results['machine']}; gRPC server: {results['grpc_impl']}; "
             f"{args.rounds} rounds x {args.duration:g} s cells, c={CONCURRENCY}, medians (all rounds in brackets).", ""]
    heavy = results.get("heavy")
    if heavy:
        rounds = heavy["rounds"]
        one = sorted(r["ort_batch1"]["ms_per_call"] for r in rounds)
        lines += [f"**heavy (256-{HEAVY_HIDDEN}-{HEAVY_HIDDEN}-10)**: onnxruntime in-process batch 1 = "
                  f"{one[len(one) // 2]:.2f} ms/call (median; rounds {[round(x, 2) for x in one]})", "",
                  "| protocol | no batching | dynamic batching (mean formed batch) | in-process onnxruntime at the mean batch | "
                  "in-process onnxruntime on the formed batch sizes | batching / none (bar >= 3x) | "
                  "batching / in-process at the mean batch | batching / in-process on the formed sizes (bar >= 0.6) |",
                  "|---|---|---|---|---|---|---|---|"]
        for protocol in args.heavy_protocols:
            plain_key, batched_key = f"{heavy['models'][1]}/{protocol}", f"{heavy['models'][0]}/{protocol}"
            plain, batched = median_cell(rounds, plain_key), median_cell(rounds, batched_key)
            if not plain or not batched:
                lines.append(f"| {protocol} | {plain.get('infer_per_sec', 'error')} | {batched.get('infer_per_sec', 'error')} | | | |")
                continue
            mixed = [r for r in rounds if f"ort_mix/{protocol}" in r]
            ort = sorted(r["ort_formed"]["rows_per_sec"] for r in rounds)
            ort_mix = sorted(r[f"ort_mix/{protocol}"]["rows_per_sec"] for r in mixed)
            speedup = sorted(r[batched_key]["infer_per_sec"] / r[plain_key]["infer_per_sec"] for r in rounds)
            share = sorted(r[batched_key]["infer_per_sec"] / r["ort_formed"]["rows_per_sec"] for r in rounds)
            share_mix = sorted(r[batched_key]["infer_per_sec"] / r[f"ort_mix/{protocol}"]["rows_per_sec"] for r in mixed)
            lines.append(
                f"| {protocol} | {plain['infer_per_sec']:.0f}/s {plain['all']} | {batched['infer_per_sec']:.0f}/s "
                f"({batched['formed_batch']:.1f}) {batched['all']} | {ort[len(ort) // 2]:.0f} rows/s {[round(x) for x in ort]} | "
                + (f"{ort_mix[len(ort_mix) // 2]:.0f} rows/s {[round(x) for x in ort_mix]} | " if ort_mix else "| ")
                + f"{speedup[len(speedup) // 2]:.1f}x {[round(x, 1) for x in speedup]} | "
                f"{share[len(share) // 2]:.2f} {[round(x, 2) for x in share]} | "
                + (f"{share_mix[len(share_mix) // 2]:.2f} {[round(x, 2) for x in share_mix]} |" if share_mix else "|"))
            sizes = batched.get("batch_sizes") or {}
            executions = sum(sizes.values())
            if executions:
                common = [kv for kv in sorted(sizes.items(), key=lambda kv: -kv[1])[:6] if kv[1] >= executions / 100]
                lines.append("")
                lines.append(f"{protocol}: batch sizes formed in the median round (share of executions): "
                             + ", ".join(f"{size}: {count / executions:.0%}" for size, count in common))
        lines += ["", "(per-round ratios in brackets: each round measured batching, no batching and onnxruntime back to back;",
                  "'on the formed batch sizes' replays the batch sizes the batcher formed in that round, in proportion)", ""]
    triton = results.get("triton")
    if triton:
        lines += ["**mlp_classifier (256-512-512-10), dynamic batching, c=32: Naiad vs Triton 2.51 (Python backend + onnxruntime)**", "",
                  "| protocol | Naiad (formed batch) | Triton (formed batch) | Naiad / Triton, medians (bar >= 0.7) |", "|---|---|---|---|"]
        for protocol in args.protocols:
            ours = median_cell(triton["rounds"], f"naiad/{protocol}")
            theirs = median_cell(triton["rounds"], f"triton/{protocol}")
            if not ours or not theirs:
                lines.append(f"| {protocol} | {ours.get('infer_per_sec', 'error')} | {theirs.get('infer_per_sec', 'error')} | |")
                continue
            per_round = sorted(r[f"naiad/{protocol}"]["infer_per_sec"] / r[f"triton/{protocol}"]["infer_per_sec"]
                               for r in triton["rounds"] if f"naiad/{protocol}" in r and f"triton/{protocol}" in r)
            lines.append(f"| {protocol} | {ours['infer_per_sec']:.0f}/s ({ours['formed_batch']:.1f}) {ours['all']} | "
                         f"{theirs['infer_per_sec']:.0f}/s ({theirs['formed_batch']:.1f}) {theirs['all']} | "
                         f"{ours['infer_per_sec'] / theirs['infer_per_sec']:.2f} (per round: {[round(x, 2) for x in per_round]}) |")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--_ort_mix":
        ort_mix_main(sys.argv[2], sys.argv[3], float(sys.argv[4]))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--_ort":
        ort_main(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=("heavy", "triton"), default=["heavy", "triton"])
    parser.add_argument("--protocols", nargs="+", choices=("http-json", "http-binary", "grpc"), default=["http-binary", "grpc"])
    parser.add_argument("--heavy-protocols", nargs="+", choices=("http-json", "http-binary", "grpc"), default=["http-binary"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--max-requests", type=int, default=10_000_000)
    parser.add_argument("--server-core", default="0")
    parser.add_argument("--client-core", default="1")
    parser.add_argument("--grpc-impl", choices=("naiad", "grpcio"), default="naiad")
    parser.add_argument("--output", help="write every round of every cell as JSON")
    args = parser.parse_args()
    if shutil.which("taskset") is None:
        parser.error("taskset (util-linux) is needed")
    work = Path(tempfile.mkdtemp(prefix="naiad_batching_"))
    results: dict = {"when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                     "machine": machine_line(), "grpc_impl": args.grpc_impl}
    try:
        if "heavy" in args.parts:
            results["heavy"] = part_heavy(work, args)
        if "triton" in args.parts:
            results["triton"] = part_triton(work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=1))
    print(report(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
