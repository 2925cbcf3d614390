"""`--frontend-processes 0` (in one process) vs `N` workers over HTTP (wrk, JSON bodies) and gRPC, and the core
process's CPU per request.

    python benchmarks/frontend_processes_bench.py --processes 0 1 2 --models add_sub mlp -c 32 --repeats 3

Naiad runs once per process count, unpinned (`taskset -c` all cores; the gRPC server is
--grpc-server-impl's, Naiad's own by default, in the core or in each worker): all at once, each
cell alternating between them round by round (so a shared machine's changing load falls on every
layout alike), or with --one-at-a-time one after the other per repeat. Each run is wrk, or
load.py's gRPC closed loop (one process, --channels connections: connections, not calls, are
spread over the core and the workers; --core-connections sets how many the core keeps), against
one model, and reads /proc for the CPU the core process (the one that schedules, batches and runs
models; its own threads included, Python-model stubs and frontend workers not) spent per request. A row is the median round by throughput (--pick best:
the fastest); the table gives ratios to the first count.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import matrix_models  # noqa: E402
import servers  # noqa: E402
import wrk_load  # noqa: E402


def run_grpc(port: int, model: str, concurrency: int, duration: float, channels: int, warmup: float) -> dict:
    """load.py's gRPC closed loop (raw HTTP/2 client) as a process of its own; its JSON result."""
    cmd = [sys.executable, str(HERE / "load.py"), "--url", f"127.0.0.1:{port}", "--protocol", "grpc",
           "--model", model, "-c", str(concurrency), "--duration", str(duration), "--warmup", str(warmup),
           "--channels", str(channels), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=warmup + duration + 180)
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError((done.stderr.strip().splitlines() or ["load.py failed"])[-1][:300])
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(server: servers.RunningServer, model: str, protocol: str, concurrency: int, duration: float,
            channels: int) -> dict:
    if protocol == "grpc":
        def load(seconds: float) -> dict:
            return run_grpc(server.grpc_port, model, concurrency, seconds, channels, warmup=0)
    else:
        def load(seconds: float) -> dict:
            return wrk_load.run_wrk(server.http_port, model, concurrency, seconds, warmup=0)
    load(1.0)  # warm-up, discarded
    core_before, tree_before = servers.cpu_seconds(server.proc.pid), servers.tree_cpu_seconds(server.proc.pid)
    result = load(duration)
    core_used = servers.cpu_seconds(server.proc.pid) - core_before
    tree_used = servers.tree_cpu_seconds(server.proc.pid) - tree_before
    done = max(result["completed"], 1)
    return {"model": model, "protocol": protocol, "concurrency": concurrency, "infer_per_sec": result["infer_per_sec"],
            "p50_ms": result["p50_ms"], "p99_ms": result["p99_ms"], "errors": result["errors"],
            "core_cpu_us_per_req": core_used / done * 1e6, "all_cpu_us_per_req": tree_used / done * 1e6}


def _start(work: Path, matrix: matrix_models.Matrix, cores: str, names: dict[str, str], count: int,
           grpc_impl: str, core_connections: int | None) -> servers.RunningServer:
    extra = ("--frontend-processes", str(count))
    if core_connections is not None:
        extra += ("--frontend-core-connections", str(core_connections))
    server = servers.start_naiad(work, matrix.naiad_repo, cores, list(names.values()), grpc_impl=grpc_impl,
                                 tag=f"naiad-{count}", extra=extra)
    time.sleep(0.5)
    return server


def _cells(args: argparse.Namespace, names: dict[str, str]) -> list[tuple[str, str, str, int]]:
    return [(model, name, protocol, concurrency) for model, name in names.items()
            for protocol, concurrency in itertools.product(args.protocols, args.concurrency)]


def _record(runs: list[dict], server: servers.RunningServer, count: int, repeat: int, cell: tuple[str, str, str, int],
            args: argparse.Namespace) -> None:
    model, name, protocol, concurrency = cell
    run = measure(server, name, protocol, concurrency, args.duration, args.channels)
    runs.append({"processes": count, "repeat": repeat, **run, "model": model})
    servers.log(json.dumps(runs[-1]))


def run_interleaved(args: argparse.Namespace, work: Path, matrix: matrix_models.Matrix, cores: str,
                    names: dict[str, str]) -> list[dict]:
    """Every layout runs at once (an idle one costs next to nothing) and each cell alternates between
    them, so a shared machine's changing load falls on all of them alike."""
    runs: list[dict] = []
    running: dict[int, servers.RunningServer] = {}
    try:
        for count in args.processes:
            running[count] = _start(work, matrix, cores, names, count, args.grpc_server_impl, args.core_connections)
        for cell in _cells(args, names):
            for repeat in range(args.repeats):
                for count, server in running.items():
                    _record(runs, server, count, repeat, cell, args)
    finally:
        for server in running.values():
            server.stop()
    return runs


def run_one_at_a_time(args: argparse.Namespace, work: Path, matrix: matrix_models.Matrix, cores: str,
                      names: dict[str, str]) -> list[dict]:
    """Each repeat starts the layouts one after the other and runs every cell against each."""
    runs: list[dict] = []
    for repeat in range(args.repeats):
        for count in args.processes:
            servers.log(f"repeat {repeat + 1}: --frontend-processes {count}")
            server = _start(work, matrix, cores, names, count, args.grpc_server_impl, args.core_connections)
            try:
                for cell in _cells(args, names):
                    _record(runs, server, count, repeat, cell, args)
            finally:
                server.stop()
    return runs


def print_table(runs: list[dict], processes: list[int], pick: str) -> None:
    """One row per cell and layout: the best round by throughput, or the median one."""
    rounds: dict[tuple[str, str, int, int], list[dict]] = {}
    for run in runs:
        rounds.setdefault((run["model"], run["protocol"], run["concurrency"], run["processes"]), []).append(run)
    chosen = {key: sorted(found, key=lambda r: r["infer_per_sec"])[-1 if pick == "best" else (len(found) - 1) // 2]
              for key, found in rounds.items()}
    base = processes[0]
    print(f"| model | protocol | c | --frontend-processes | infer/s | ratio to {base} | p50 ms | p99 ms "
          "| core CPU us/req | all CPU us/req |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (model, protocol, concurrency, count), run in sorted(chosen.items()):
        ratio = run["infer_per_sec"] / chosen[(model, protocol, concurrency, base)]["infer_per_sec"]
        print(f"| {model} | {protocol} | {concurrency} | {count} | {run['infer_per_sec']:,.0f} | {ratio:.2f}x "
              f"| {run['p50_ms']:.2f} | {run['p99_ms']:.2f} | {run['core_cpu_us_per_req']:.0f} "
              f"| {run['all_cpu_us_per_req']:.0f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--models", nargs="+", default=["add_sub", "mlp"], choices=["add_sub", "add_sub_onnx", "mlp"])
    parser.add_argument("--protocols", nargs="+", default=["http-json", "grpc"], choices=["http-json", "grpc"])
    parser.add_argument("-c", "--concurrency", type=int, nargs="+", default=[32])
    parser.add_argument("--channels", type=int, default=8, help="gRPC connections of the load generator")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--grpc-server-impl", choices=["naiad", "grpcio"], default="naiad")
    parser.add_argument("--core-connections", type=int, default=None, metavar="K",
                        help="--frontend-core-connections K for the runs with workers (default: Naiad's; 0: "
                        "every connection through a worker)")
    parser.add_argument("--one-at-a-time", action="store_true",
                        help="run the layouts one after the other instead of at once, alternating cell by cell")
    parser.add_argument("--pick", choices=["median", "best"], default="median", help="which round a row reports")
    parser.add_argument("--out", type=Path, help="write every run as JSON here")
    args = parser.parse_args(argv)
    cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    with tempfile.TemporaryDirectory(prefix="frontend-processes-") as tmp:
        work = Path(tmp)
        matrix = matrix_models.build(work, args.models, ["plain"])
        names = {model: matrix_models.served_name(model, "plain") for model in args.models}
        run = run_one_at_a_time if args.one_at_a_time else run_interleaved
        runs = run(args, work, matrix, cores, names)
    if args.out:
        args.out.write_text(json.dumps(runs, indent=1))
    print_table(runs, args.processes, args.pick)
    print(servers.machine_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
