"""Many models on one server: start-to-ready time, RSS per model, on-demand first-request latency.

    .venv/bin/python benchmarks/scale_bench.py --counts 50 200 500

Generates N small ONNX add/sub models (weights: none; file ~200 bytes), serves them with
`naiad serve` (all loaded, mode none) and reports the RSS of the server and its children
divided by N beyond an empty server's RSS; then serves the same repository in explicit
mode with --load-on-demand and times the first request of a model that is not loaded.
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
from tests.support.onnx_models import add_sub_model  # noqa: E402
from tests.support.servers import start_server  # noqa: E402


def tree_rss(pid: int) -> int:
    """RSS of a process and all its descendants, in bytes."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            with open(f"/proc/{current}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            with open(f"/proc/{current}/task/{current}/children") as f:
                stack += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return total


def make_repo(root: Path, count: int) -> Path:
    template = add_sub_model(root / "template", "m")
    repo = root / f"repo{count}"
    for i in range(count):
        shutil.copytree(template, repo / f"m{i:04d}")
        config = repo / f"m{i:04d}" / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "m"', f'name: "m{i:04d}"'))
    return repo


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
    client.infer(name, inputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--counts", type=int, nargs="+", default=[50, 200])
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="naiad-scale-"))
    empty = root / "empty"
    empty.mkdir()
    with start_server(empty) as base_server:
        base_rss = tree_rss(base_server.process.pid)
    print(f"empty server RSS: {base_rss / 1e6:.1f} MB")
    print("| models | start to ready (s) | RSS total (MB) | RSS per model beyond empty server (MB) | on-demand first request (ms) |")
    print("|---|---|---|---|---|")
    for count in args.counts:
        repo = make_repo(root, count)
        started = time.monotonic()
        with start_server(repo, timeout=600) as server:
            wait_ready(server.http_url, time.monotonic() + 600)
            ready_s = time.monotonic() - started
            client = httpclient.InferenceServerClient(server.http_url)
            for i in range(count):
                infer(client, f"m{i:04d}")
            rss = tree_rss(server.process.pid)
        with start_server(repo, "--model-control-mode=explicit", "--load-on-demand=true") as server:
            client = httpclient.InferenceServerClient(server.http_url)
            t0 = time.perf_counter()
            infer(client, f"m{count - 1:04d}")
            first_ms = (time.perf_counter() - t0) * 1e3
        print(f"| {count} | {ready_s:.1f} | {rss / 1e6:.0f} | {(rss - base_rss) / count / 1e6:.2f} | {first_ms:.0f} |")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
