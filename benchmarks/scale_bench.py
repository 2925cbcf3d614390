"""Many models on one server: start-to-ready time, memory per model, on-demand first-request latency.

    .venv/bin/python benchmarks/scale_bench.py --counts 50 200 500

For each N it generates two repositories of N models: N ONNX add/sub models (no weights, model
file ~200 bytes), and a mix where one model in `--python-every` (default 10) is a Python-backend
add/sub model instead. Each is served with `naiad serve` (mode none: everything loaded at
start), noting the wall and the server's CPU time to ready; after one request to every model it
reads the RSS of the server process and of its children (the Python-backend workers, one per
Python model instance) and, for the workers, their PSS too (shared library pages split between
the processes that map them). Per-model overhead: an ONNX model's is the server's growth over an
empty server divided by the ONNX models (this includes onnxruntime's one-time start-up, about
28 MB, spread over them), and, for the ONNX-only repository, also its growth over a server with
one ONNX model divided by N - 1 (the marginal cost); a Python model's is its worker's memory.
Then the mixed repository is served in explicit mode with --load-on-demand and the first request
of an ONNX and of a Python model not loaded is timed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.integration.test_python_backend_support import add_sub as python_add_sub
from tests.support.onnx_models import add_sub_model
from tests.support.process_tree import descendants, rss
from tests.support.servers import start_server

MB = 1e6


def pss(pid: int) -> int:
    """Proportional set size of a process in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (noise-robust next to wall time)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_repo(root: Path, count: int, python_every: int) -> tuple[Path, list[str], list[str]]:
    """N models: ONNX ones copied from one generated file, every `python_every`-th a Python one."""
    template = add_sub_model(root / "template", "template")
    config = (template / "config.pbtxt").read_text()
    repo = root / f"repo{count}_{python_every}"
    onnx_names, python_names = [], []
    for i in range(count):
        if python_every and i % python_every == python_every - 1:
            name = f"p{i:04d}"
            python_add_sub(repo, name)
            python_names.append(name)
            continue
        name = f"m{i:04d}"
        (repo / name / "1").mkdir(parents=True)
        shutil.copyfile(template / "1" / "model.onnx", repo / name / "1" / "model.onnx")
        (repo / name / "config.pbtxt").write_text(config.replace('name: "template"', f'name: "{name}"'))
        onnx_names.append(name)
    return repo, onnx_names, python_names


def wait_ready(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=5).status == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError("server never became ready")


def infer(client: httpclient.InferenceServerClient, name: str) -> None:
    a = np.ones((1, 16), np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    if client.infer(name, inputs).as_numpy("OUTPUT0")[0, 0] != 2:
        raise RuntimeError(f"wrong answer from {name}")


def serve_all(repo: Path, names: list[str]) -> dict[str, float]:
    """Start (mode none), wait until ready, query every model once, measure the process tree."""
    started = time.monotonic()
    with start_server(repo, timeout=900) as server:
        wait_ready(server.http_url, time.monotonic() + 900)
        ready_s = time.monotonic() - started
        ready_cpu = cpu_seconds(server.process.pid)
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=300)
        for name in names:
            infer(client, name)
        workers = descendants(server.process.pid)
        return {
            "ready_s": ready_s,
            "ready_cpu": ready_cpu,
            "server": rss(server.process.pid),
            "workers": len(workers),
            "workers_rss": sum(rss(p) for p in workers),
            "workers_pss": sum(pss(p) for p in workers),
        }


def first_request_ms(repo: Path, name: str) -> float:
    with start_server(repo, "--model-control-mode=explicit", "--load-on-demand=true") as server:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=300)
        t0 = time.perf_counter()
        infer(client, name)
        return (time.perf_counter() - t0) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", type=int, nargs="+", default=[50, 200])
    parser.add_argument("--python-every", type=int, default=10, help="one Python model in this many (mixed repository)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="naiad-scale-"))
    empty = root / "empty"
    empty.mkdir()
    with start_server(empty) as base_server:
        base = rss(base_server.process.pid)
    one_repo, one_names, _ = make_repo(root / "one", 1, 0)
    one = serve_all(one_repo, one_names)["server"]  # onnxruntime's one-time start-up plus one model
    print(f"empty server RSS: {base / MB:.1f} MB, with one ONNX model: {one / MB:.1f} MB; "
          f"load average {os.getloadavg()[0]:.1f}")
    onnx_rows, mixed_rows = [], []
    for count in args.counts:
        repo, onnx_names, _ = make_repo(root / f"onnx{count}", count, 0)
        only = serve_all(repo, onnx_names)
        onnx_rows.append(f"| {count} | {only['ready_s']:.1f} | {only['ready_cpu']:.1f} | {only['server'] / MB:.0f} | "
                         f"{(only['server'] - base) / count / MB:.2f} | {(only['server'] - one) / (count - 1) / MB:.2f} |")
        repo, onnx_names, python_names = make_repo(root / f"mixed{count}", count, args.python_every)
        mixed = serve_all(repo, onnx_names + python_names)
        onnx_ms = first_request_ms(repo, onnx_names[-1])
        python_ms = first_request_ms(repo, python_names[-1])
        n_py = len(python_names)
        mixed_rows.append(
            f"| {len(onnx_names)} + {n_py} | {mixed['ready_s']:.1f} | {mixed['ready_cpu']:.1f} | {mixed['server'] / MB:.0f} | "
            f"{mixed['workers']} | {mixed['workers_rss'] / MB:.0f} | {(mixed['server'] + mixed['workers_rss']) / MB:.0f} | "
            f"{(mixed['server'] - base) / len(onnx_names) / MB:.2f} | {mixed['workers_rss'] / n_py / MB:.1f} / "
            f"{mixed['workers_pss'] / n_py / MB:.1f} | {onnx_ms:.0f} | {python_ms:.0f} |"
        )
        shutil.rmtree(root / f"onnx{count}", ignore_errors=True)
        shutil.rmtree(root / f"mixed{count}", ignore_errors=True)
    print("\nONNX only")
    print("| models | start to ready (s) | server CPU time to ready (s) | server RSS (MB) | "
          "RSS per model beyond an empty server (MB) | beyond a server with one model (MB) |")
    print("|---|---|---|---|---|---|")
    print("\n".join(onnx_rows))
    print(f"\nMixed (one Python model in {args.python_every})")
    print("| ONNX + Python models | start to ready (s) | server CPU time to ready (s) | server RSS (MB) | workers | "
          "workers RSS (MB) | total RSS (MB) | per ONNX model (MB) | per Python model RSS / PSS (MB) | on-demand first request ONNX (ms) | "
          "on-demand first request Python (ms) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(mixed_rows))
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
