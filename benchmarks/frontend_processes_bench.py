"""`--frontend-processes 1` vs `N` over HTTP with wrk JSON bodies, and the core process's CPU per request.

    python benchmarks/frontend_processes_bench.py --processes 1 2 --models add_sub mlp -c 32 --repeats 3

Each repeat starts Naiad once per process count (back to back, unpinned: `taskset -c` all cores),
runs wrk against each model, and reads /proc for the CPU the core process (the one that schedules,
batches and runs models; its own threads included, Python-model stubs and frontend workers not)
spent per request. Best of the repeats by throughput; the table gives ratios to the first count.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import matrix_models  # noqa: E402
import servers  # noqa: E402
import wrk_load  # noqa: E402


def measure(server: servers.RunningServer, model: str, concurrency: int, duration: float) -> dict:
    wrk_load.run_wrk(server.http_port, model, concurrency, 1.0, warmup=0)  # warm-up, discarded
    core_before, tree_before = servers.cpu_seconds(server.proc.pid), servers.tree_cpu_seconds(server.proc.pid)
    result = wrk_load.run_wrk(server.http_port, model, concurrency, duration, warmup=0)
    core_used = servers.cpu_seconds(server.proc.pid) - core_before
    tree_used = servers.tree_cpu_seconds(server.proc.pid) - tree_before
    done = max(result["completed"], 1)
    return {"model": model, "concurrency": concurrency, "infer_per_sec": result["infer_per_sec"],
            "p50_ms": result["p50_ms"], "p99_ms": result["p99_ms"], "errors": result["errors"],
            "core_cpu_us_per_req": core_used / done * 1e6, "all_cpu_us_per_req": tree_used / done * 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--models", nargs="+", default=["add_sub", "mlp"], choices=["add_sub", "add_sub_onnx", "mlp"])
    parser.add_argument("-c", "--concurrency", type=int, nargs="+", default=[32])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write every run as JSON here")
    args = parser.parse_args(argv)
    cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="frontend-processes-") as tmp:
        work = Path(tmp)
        matrix = matrix_models.build(work, args.models, ["plain"])
        names = {model: matrix_models.served_name(model, "plain") for model in args.models}
        for repeat in range(args.repeats):
            for count in args.processes:
                servers.log(f"repeat {repeat + 1}: --frontend-processes {count}")
                server = servers.start_naiad(work, matrix.naiad_repo, cores, list(names.values()),
                                             tag=f"naiad-{count}", extra=("--frontend-processes", str(count)))
                try:
                    time.sleep(0.5)
                    for model, name in names.items():
                        for concurrency in args.concurrency:
                            run = measure(server, name, concurrency, args.duration)
                            runs.append({"processes": count, "repeat": repeat, **run, "model": model})
                            servers.log(json.dumps(runs[-1]))
                finally:
                    server.stop()
    if args.out:
        args.out.write_text(json.dumps(runs, indent=1))
    best: dict[tuple[str, int, int], dict] = {}
    for run in runs:
        key = (run["model"], run["concurrency"], run["processes"])
        if key not in best or run["infer_per_sec"] > best[key]["infer_per_sec"]:
            best[key] = run
    base = args.processes[0]
    print(f"| model | c | --frontend-processes | infer/s | ratio to {base} | p50 ms | p99 ms "
          "| core CPU us/req | all CPU us/req |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (model, concurrency, count), run in sorted(best.items()):
        ratio = run["infer_per_sec"] / best[(model, concurrency, base)]["infer_per_sec"]
        print(f"| {model} | {concurrency} | {count} | {run['infer_per_sec']:,.0f} | {ratio:.2f}x | {run['p50_ms']:.2f} "
              f"| {run['p99_ms']:.2f} | {run['core_cpu_us_per_req']:.0f} | {run['all_cpu_us_per_req']:.0f} |")
    print(servers.machine_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
