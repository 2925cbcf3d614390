"""Side-by-side ONNX serving benchmark: Naiad vs MLServer vs KServe vs in-process onnxruntime.

    bash benchmarks/setup_peers.sh                     # once: peer venvs under $NAIAD_BENCH_VENVS (default .venv-bench)
    .venv/bin/python benchmarks/run_onnx_bench.py      # full matrix, prints a Markdown table
    .venv/bin/python benchmarks/run_onnx_bench.py --servers naiad --concurrency 1 8 --duration 3

Every server runs pinned to one core (`taskset -c 0`), the load generator (load.py) to another
(`taskset -c 1`). All servers are started first and then take turns cell by cell (the others
sit idle), so noise from other work on the machine is spread over all of them. Each server serves the SAME ONNX files (examples/generate_models.py's add_sub
and mlp_classifier, regenerated into a temporary directory) with one onnxruntime session of one
intra-op thread:
  naiad     `python -m naiad serve` on a repository whose configs are the examples' plus
            `instance_group [{count: 1, kind: KIND_CPU}]` and intra/inter_op_thread_count "1"
            (--naiad-config example keeps the example configs: 2 instances, ORT defaults);
            dynamic_batching {} stays on as in the examples.
  mlserver  `mlserver start` with peers/mlserver_runtime.py (MLModel + NumpyCodec),
            debug off (no access log), parallel_workers 0 (inference in the server process;
            the default 1 adds a worker process and IPC on the same core).
  kserve    peers/kserve_server.py (kserve.Model, v2 InferRequest/InferResponse), latency
            logging and KServe's logging setup off.
The ceiling is onnxruntime called in-process on the same core with the same batch-1 inputs,
one call at a time. Before the servers, load.py's own ceiling is measured against
trivial_server.py. Every run first checks one response against onnxruntime.
The matrix is repeated --rounds times (default 3); each cell reports its fastest round
(--pick best: on a shared machine other work only slows a cell down) or its median round
(--pick median). --output keeps every round; --report FILE prints an earlier run's table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "examples"))

import servers as bench_servers  # noqa: E402  (benchmarks/servers.py; benchmarks/ is not a package)
from servers import RunningServer, log, machine_line, spawn, wait_until  # noqa: E402

SERVERS = ("naiad", "naiad-grpcio", "mlserver", "kserve")  # naiad-grpcio: --grpc-server-impl grpcio
MODELS = ("mlp_classifier", "add_sub")
PROTOCOLS = ("http-json", "http-binary", "grpc")
UNSUPPORTED = {("mlserver", "http-binary"): "MLServer has no binary tensor extension on REST"}

NAIAD_MATCHED_CONFIG = """
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
parameters { key: "inter_op_thread_count" value: { string_value: "1" } }
"""


def start_naiad(work: Path, models: list[str], core: str, python: str, config_mode: str,
                grpc_impl: str = "naiad") -> RunningServer:
    repo = work / "naiad_repo"
    for m in models:
        shutil.copytree(work / "models" / m, repo / m, dirs_exist_ok=True)
        if config_mode == "matched":
            with open(repo / m / "config.pbtxt", "a") as f:
                f.write(NAIAD_MATCHED_CONFIG)
    tag = "naiad" if grpc_impl == "naiad" else f"naiad-{grpc_impl}"
    return bench_servers.start_naiad(work, repo, core, models, grpc_impl, python, tag)


def start_mlserver(work: Path, models: list[str], core: str, venvs: Path) -> RunningServer:
    return bench_servers.start_mlserver(work, core, venvs, {m: {
        "implementation": "mlserver_runtime.OnnxRuntimeModel",
        "parameters": {"uri": str(work / "models" / m / "1" / "model.onnx")}} for m in models})


def start_kserve(work: Path, models: list[str], core: str, venvs: Path) -> RunningServer:
    return bench_servers.start_kserve(work, core, venvs, {m: work / "models" / m / "1" / "model.onnx" for m in models})


# ---------------------------------------------------------------- measurements

def run_load(core: str, port: int, protocol: str, model: str, concurrency: int, args, reference: Path | None,
             verify: bool = True, grpc_client: str = "raw") -> dict:
    """load.py pinned to `core`, checking its first answer (against onnxruntime on `reference` when given)."""
    cmd = ["taskset", "-c", core, sys.executable, str(HERE / "load.py"), "--url", f"127.0.0.1:{port}",
           "--protocol", protocol, "--model", model, "-c", str(concurrency), "--duration", str(args.duration),
           "--warmup", str(args.warmup), "--requests", str(args.max_requests), "--json",
           "--grpc-client", grpc_client]
    if not verify:
        cmd.append("--no-verify")
    elif reference is not None:
        cmd += ["--reference-model", str(reference)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.warmup + args.duration + 180)
    if done.returncode != 0 or not done.stdout.strip():
        return {"error": (done.stderr.strip().splitlines() or ["load.py failed"])[-1][:300]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["errors"]:
        result["error"] = f"{result['errors']} failed requests, first: {result['first_error']}"
    return result


def ceiling_main(model: str, model_path: str, duration: float, warmup: float) -> None:
    """In-process onnxruntime, batch 1, one call at a time (runs pinned, as a subprocess)."""
    import numpy as np
    import onnxruntime as ort
    from load import make_workload

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    workload = make_workload(model)
    feeds = {name: arr for name, _, arr in workload.inputs}
    outputs = workload.outputs
    end_warm = time.perf_counter() + warmup
    while time.perf_counter() < end_warm:
        session.run(outputs, feeds)
    lat = []
    start = time.perf_counter()
    stop = start + duration
    now = start
    while now < stop and len(lat) < 5_000_000:
        t = time.perf_counter_ns()
        session.run(outputs, feeds)
        lat.append(time.perf_counter_ns() - t)
        now = time.perf_counter()
    arr = np.asarray(lat) / 1e6
    p50, p99 = np.percentile(arr, [50, 99])
    print(json.dumps({"infer_per_sec": len(lat) / (now - start), "p50_ms": float(p50), "p99_ms": float(p99),
                      "completed": len(lat)}))


def measure_ceiling(core: str, model: str, path: Path, args) -> dict:
    cmd = ["taskset", "-c", core, sys.executable, str(Path(__file__).resolve()), "--_ceiling", model, str(path),
           "--duration", str(args.duration), "--warmup", str(args.warmup)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration + args.warmup + 120)
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-300:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_generator_ceiling(work: Path, args) -> dict:
    """load.py against trivial_server.py: what the generator can do when the server costs ~nothing."""
    out_path = work / "trivial.stdout"
    proc = spawn([sys.executable, str(HERE / "trivial_server.py"), "--lifetime", "900"], args.server_core,
                  out_path, work)
    server = RunningServer("trivial", proc, 0, 0, out_path)
    try:
        def ready():
            for line in out_path.read_text(errors="replace").splitlines():
                if line.startswith("TRIVIAL_READY "):
                    return json.loads(line.split(" ", 1)[1])
            return None
        ports = wait_until(ready, "trivial server", proc, out_path, 30)
        results = {}
        for label, port, protocol, client in (
                ("http (raw asyncio client)", ports["http_port"], "http-json", "raw"),
                ("grpc (h2grpc client, h2 stub server)", ports["h2_grpc_port"], "grpc", "raw"),
                ("grpc (h2grpc client, grpcio aio server)", ports["grpc_port"], "grpc", "raw")):
            for c in sorted({1, max(args.concurrency)}):
                results[f"{label} c={c}"] = run_load(args.client_core, port, protocol, "add_sub", c, args,
                                                     Path(), verify=False, grpc_client=client)
        return results
    finally:
        server.stop()


# ---------------------------------------------------------------- report

def _cell(r: dict | None) -> str:
    if r is None:
        return "-"
    if "error" in r and not r.get("infer_per_sec"):
        return "error"
    text = f"{r['infer_per_sec']:,.0f} ({r['p50_ms']:.2f}/{r['p99_ms']:.2f})"
    return text + " !" if "error" in r else text


def _ratio(a: dict | None, b: dict | None) -> str:
    if not a or not b or not a.get("infer_per_sec") or not b.get("infer_per_sec"):
        return "-"
    return f"{a['infer_per_sec'] / b['infer_per_sec']:.2f}x"


def markdown_table(results: dict, ceilings: dict, servers: list[str], args) -> str:
    names = {"naiad": "Naiad", "naiad-grpcio": "Naiad (grpcio)", "mlserver": "MLServer", "kserve": "KServe"}
    head = ["model", "protocol", "c"] + [names[s] for s in servers] + ["ceiling"]
    head += [f"Naiad/{names[s]}" for s in servers if s != "naiad"] + (["Naiad/ceiling"] if "naiad" in servers else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model in args.models:
        ceiling = ceilings.get(model)
        for protocol in args.protocols:
            for c in args.concurrency:
                row = [model, protocol, str(c)]
                cells = {s: results.get((s, model, protocol, c)) for s in servers}
                for s in servers:
                    row.append("n/a" if (s, protocol) in UNSUPPORTED else _cell(cells[s]))
                row.append(_cell(ceiling))
                if "naiad" in servers:
                    row += [_ratio(cells["naiad"], cells[s]) for s in servers if s != "naiad"]
                    row.append(_ratio(cells["naiad"], ceiling))
                lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def pick_result(rounds: list[dict], how: str) -> dict:
    """One cell's result from its rounds: the fastest ("best") or the lower median ("median")."""
    ok = sorted((r for r in rounds if r.get("infer_per_sec")), key=lambda r: r["infer_per_sec"])
    if not ok:
        return rounds[0]
    return ok[-1] if how == "best" else ok[(len(ok) - 1) // 2]


def print_report(report: dict, how: str) -> None:
    cfg = report["config"]
    results = {(r["server"], r["model"], r["protocol"], r["concurrency"]): pick_result(r["rounds"], how)
               for r in report["cells"]}
    ceilings = {m: pick_result(rounds, how) for m, rounds in report["ceilings"].items()}
    print(f"\nMachine: {report['machine']}")
    print(f"Command: {report['command']}")
    print(f"Cells: infer/s (p50/p99 latency in ms) of the {'fastest' if how == 'best' else 'median'} of "
          f"{cfg['rounds']} round(s); ratios compare infer/s; '!' = some requests failed.\n")
    print(markdown_table(results, ceilings, cfg["servers"], argparse.Namespace(**cfg)))
    if report["generator_ceiling"]:
        print("\nLoad generator ceiling (trivial server on the server core):")
        for k, v in report["generator_ceiling"].items():
            print(f"- {k}: {_cell(v)}")


# ---------------------------------------------------------------- main

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=["naiad", "mlserver", "kserve"])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--protocols", nargs="+", choices=PROTOCOLS, default=list(PROTOCOLS))
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per cell (default 5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each cell")
    parser.add_argument("--max-requests", type=int, default=1_000_000, help="cap on requests per cell")
    parser.add_argument("--rounds", type=int, default=3, help="repeat the matrix (default 3)")
    parser.add_argument("--pick", choices=("best", "median"), default="best",
                        help="which round a cell reports: the fastest (default; on a shared machine noise "
                             "only slows a cell down) or the median")
    parser.add_argument("--report", type=Path, metavar="JSON",
                        help="print the table of an earlier --output file (with --pick) and exit")
    parser.add_argument("--venvs", type=Path, default=Path(os.environ.get("NAIAD_BENCH_VENVS", ".venv-bench")))
    parser.add_argument("--naiad-python", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--naiad-config", choices=("matched", "example"), default="matched")
    parser.add_argument("--server-core", default="0")
    parser.add_argument("--client-core", default="1")
    parser.add_argument("--skip-generator-ceiling", action="store_true")
    parser.add_argument("--output", type=Path, help="also write all results as JSON here")
    parser.add_argument("--keep-workdir", action="store_true")
    parser.add_argument("--_ceiling", nargs=2, metavar=("MODEL", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._ceiling:
        ceiling_main(args._ceiling[0], args._ceiling[1], args.duration, args.warmup)
        return 0
    if args.report:
        print_report(json.loads(args.report.read_text()), args.pick)
        return 0
    if shutil.which("taskset") is None:
        parser.error("taskset (util-linux) is needed to pin servers and the load generator")

    import generate_models

    machine = machine_line()
    log(machine)
    work = Path(tempfile.mkdtemp(prefix="naiad-bench-"))
    generate_models.write_repository(work / "models")
    config = {k: getattr(args, k) for k in ("servers", "models", "protocols", "concurrency", "rounds",
                                             "duration", "warmup", "naiad_config")}
    report: dict = {"machine": machine, "command": " ".join(sys.argv), "config": config, "cells": [],
                    "ceilings": {}, "generator_ceiling": {}}
    try:
        if not args.skip_generator_ceiling:
            log("measuring load.py's own ceiling against trivial_server.py")
            report["generator_ceiling"] = measure_generator_ceiling(work, args)
            for k, v in report["generator_ceiling"].items():
                log(f"  generator ceiling {k}: {_cell(v)}")
        runs: dict[tuple, list[dict]] = {}
        servers: dict[str, RunningServer] = {}
        try:
            for name in args.servers:
                log(f"starting {name}")
                try:
                    if name in ("naiad", "naiad-grpcio"):
                        servers[name] = start_naiad(work, args.models, args.server_core, args.naiad_python,
                                                    args.naiad_config, "grpcio" if name == "naiad-grpcio" else "naiad")
                    elif name == "mlserver":
                        servers[name] = start_mlserver(work, args.models, args.server_core, args.venvs)
                    else:
                        servers[name] = start_kserve(work, args.models, args.server_core, args.venvs)
                except (RuntimeError, OSError) as exc:
                    log(f"{name} did not start: {exc}")
            report["load_average_after_start"] = Path("/proc/loadavg").read_text().split()[:3]
            # Servers take turns cell by cell (all idle but one), so background noise on this
            # shared machine hits them alike instead of favouring whichever ran in a quiet minute.
            for rnd in range(args.rounds):
                for m in args.models:
                    r = measure_ceiling(args.server_core, m, work / "models" / m / "1" / "model.onnx", args)
                    report["ceilings"].setdefault(m, []).append(r)
                    log(f"round {rnd + 1}/{args.rounds} ceiling  {m:15s} {_cell(r)}")
                for model in args.models:
                    ref = work / "models" / model / "1" / "model.onnx"
                    for protocol in args.protocols:
                        for c in args.concurrency:
                            for name, server in servers.items():
                                if (name, protocol) in UNSUPPORTED:
                                    continue
                                port = server.grpc_port if protocol == "grpc" else server.http_port
                                r = run_load(args.client_core, port, protocol, model, c, args, ref)
                                runs.setdefault((name, model, protocol, c), []).append(r)
                                log(f"round {rnd + 1}/{args.rounds} {name:12s} {model:15s} {protocol:11s} "
                                    f"c={c:<3d} {_cell(r)}" + (f"  [{r['error']}]" if "error" in r else ""))
        finally:
            for server in servers.values():
                server.stop()
        report["cells"] = [{"server": k[0], "model": k[1], "protocol": k[2], "concurrency": k[3], "rounds": v}
                           for k, v in runs.items()]
        print_report(report, args.pick)
        if args.output:
            args.output.write_text(json.dumps(report, indent=2))
    finally:
        if args.keep_workdir:
            log(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
