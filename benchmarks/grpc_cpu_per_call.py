"""Server CPU per gRPC ModelInfer call, and latency, of two Naiad trees interleaved in one run.

    .venv/bin/python benchmarks/grpc_cpu_per_call.py --base OTHER/src [--new src] [--repo DIR]
        [--models add_sub,mlp_classifier] [-c 1,8] [--rounds 4] [--requests 6000]

Each round starts a server of each tree in turn (the order alternates between rounds) pinned to
core 0 (`naiad serve`, own gRPC server), and runs load.py's raw HTTP/2 closed loop on core 1 for
a fixed number of requests per model and concurrency. The server's CPU (user + system, all its
threads, from /proc/<pid>/stat) over the run divided by the requests is its CPU per call; the
medians over rounds are compared. The machine may be shared: only same-run ratios mean much.
Without --repo, the example models add_sub and mlp_classifier are used as they are.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from servers import start_naiad

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples" / "models"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _load(port: int, model: str, concurrency: int, requests: int) -> dict:
    out = subprocess.run(["taskset", "-c", "1", sys.executable, str(HERE / "load.py"), "--url", f"127.0.0.1:{port}",
                          "--protocol", "grpc", "--model", model, "-c", str(concurrency), "--requests", str(requests),
                          "--warmup", "0", "--duration", "600", "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, type=Path, help="the src/ folder of the tree to compare against")
    parser.add_argument("--new", type=Path, default=HERE.parent / "src", help="the src/ folder measured (default: this tree)")
    parser.add_argument("--repo", type=Path, help="model repository (default: a copy of the example add_sub and MLP)")
    parser.add_argument("--models", default="add_sub,mlp_classifier")
    parser.add_argument("-c", "--concurrency", default="1,8")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=6000)
    args = parser.parse_args()
    models = args.models.split(",")
    levels = [int(c) for c in args.concurrency.split(",")]
    work = Path(tempfile.mkdtemp(prefix="naiad-grpc-cpu-"))
    repo = args.repo
    if repo is None:
        repo = work / "models"
        for name in ("add_sub", "mlp_classifier"):
            shutil.copytree(EXAMPLES / name, repo / name)
    trees = {"base": args.base, "new": args.new}
    samples: dict[tuple[str, int, str], list[tuple[float, float, float]]] = {}
    try:
        for round_ in range(args.rounds):
            for tag in ("base", "new") if round_ % 2 == 0 else ("new", "base"):
                server = start_naiad(work, repo, "0", models, tag=tag, src=trees[tag])
                try:
                    for model in models:
                        for concurrency in levels:
                            before = _cpu_seconds(server.proc.pid)
                            result = _load(server.grpc_port, model, concurrency, args.requests)
                            us = (_cpu_seconds(server.proc.pid) - before) / (args.requests + 1) * 1e6
                            samples.setdefault((model, concurrency, tag), []).append(
                                (us, result["p50_ms"], result["infer_per_sec"]))
                            print(f"{tag:4s} {model:15s} c={concurrency:<2d} {us:6.1f} us CPU/call  "
                                  f"p50 {result['p50_ms']:.3f} ms  {result['infer_per_sec']:.0f}/s", flush=True)
                finally:
                    server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\nmedian over rounds: base -> new (new/base)")
    for model in models:
        for concurrency in levels:
            base, new = ([statistics.median(s[i] for s in samples[(model, concurrency, tag)]) for i in range(3)]
                         for tag in ("base", "new"))
            print(f"{model:15s} c={concurrency:<2d} CPU {base[0]:6.1f} -> {new[0]:6.1f} us/call ({new[0] / base[0]:.2f}x)  "
                  f"p50 {base[1]:.3f} -> {new[1]:.3f} ms  {base[2]:.0f} -> {new[2]:.0f}/s ({new[2] / base[2]:.2f}x)")


if __name__ == "__main__":
    main()
