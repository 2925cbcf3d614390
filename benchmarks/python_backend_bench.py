"""Python-backend benchmarks: instance scaling, and Naiad vs real Triton on Python models.

    .venv/bin/python benchmarks/python_backend_bench.py scaling            # count 1 vs 2, CPU-bound model
    .venv/bin/python benchmarks/python_backend_bench.py compare            # add_sub FP32[16] + 1 MB identity
    .venv/bin/python benchmarks/python_backend_bench.py compare --triton   # ... also against real Triton

`scaling` runs in-process (Server.infer_async, no sockets) with 4 requests in flight on a model whose
execute burns ~10 ms of pure-Python CPU: with instance_group count 2 the two worker processes run on
two cores at once. `compare` pins each server (and its worker processes) to core 0 and the clients to
core 1, like run_onnx_bench.py: add_sub through benchmarks/load.py (http-json, http-binary, grpc), the 1 MB
FP32 identity model through a small HTTP binary-extension client in this file.
Real Triton comes from benchmarks/start_triton.sh (Triton 2.51 from the nvidia-pytriton wheel).

Every cell also reports the CPU time the server's process tree (server + Python workers / stubs) spent
per request, from /proc: on a shared, noisy machine that figure moves much less than req/s, and
1e6 / cpu_us is what one dedicated core could serve.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from servers import tree_cpu_seconds  # noqa: E402  (benchmarks/servers.py)

TRITON_SCRIPT = HERE / "start_triton.sh"
MB_ELEMENTS = 262144  # FP32 -> 1 MiB

ADD_SUB_CONFIG = """backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
ADD_SUB_PY = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return responses
"""
IDENTITY_CONFIG = f"""backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {MB_ELEMENTS} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {MB_ELEMENTS} ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""
IDENTITY_PY = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests]
"""
BURN_CONFIG = """backend: "python"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "TOTAL" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { count: %d kind: KIND_CPU } ]
"""
BURN_PY = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            total = 0
            for i in range(n):  # pure-Python work: holds this process's GIL the whole time
                total += i * i % 7
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TOTAL", np.array([total], dtype=np.int64))]))
        return responses
"""


def _write(repo: Path, name: str, config: str, model_py: str) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.py").write_text(model_py)


# ---------------------------------------------------------------- scaling (in-process)

async def _scaling_run(repo: Path, iterations: int, concurrency: int, duration: float) -> float:
    from naiad import Server
    from naiad.protocol.types import InferenceRequest, InferInput

    server = Server(model_repository=str(repo))
    await server.startup()
    n = np.array([iterations], dtype=np.int64)

    def request() -> InferenceRequest:
        return InferenceRequest("burn", [InferInput("N", "INT64", (1,), n)])

    await asyncio.gather(*(server.infer_async(request()) for _ in range(concurrency)))  # warm-up
    done = 0
    stop_at = time.perf_counter() + duration

    async def client() -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            await server.infer_async(request())
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    await server.shutdown()
    return done / elapsed


def scaling(args: argparse.Namespace) -> dict:
    results = {}
    with tempfile.TemporaryDirectory(prefix="naiad-pybench-") as tmp:
        for count in (1, 2):
            repo = Path(tmp) / f"repo{count}"
            _write(repo, "burn", BURN_CONFIG % count, BURN_PY)
            rates = [asyncio.run(_scaling_run(repo, args.iterations, 4, args.duration)) for _ in range(args.rounds)]
            results[count] = max(rates)
            print(f"instances={count}: {results[count]:8.1f} req/s (rounds: {', '.join(f'{r:.1f}' for r in rates)})")
    ratio = results[2] / results[1]
    print(f"throughput ratio 2 instances / 1 instance: {ratio:.2f}x (cores available: {os.cpu_count()})")
    return {"instances_1_rps": results[1], "instances_2_rps": results[2], "ratio": ratio}


# ---------------------------------------------------------------- compare (servers over sockets)

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(port: int, models: list[str], proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}); see {log}")
        try:
            if all(urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{m}/ready", timeout=2).status == 200
                   for m in models):
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server not ready after {timeout}s; see {log}")


def _start(kind: str, repo: Path, work: Path, core: str) -> tuple[subprocess.Popen, int, int]:
    http_port, grpc_port, metrics_port = _free_port(), _free_port(), _free_port()
    log = work / f"{kind}.log"
    if kind == "naiad":
        cmd = [sys.executable, "-m", "naiad", "serve", "--model-repository", str(repo),
               "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
               "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1"]
    else:
        cmd = ["bash", str(TRITON_SCRIPT), str(repo), str(http_port), str(grpc_port), str(metrics_port)]
    proc = subprocess.Popen(["taskset", "-c", core, *cmd], stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    _wait_ready(http_port, ["add_sub", "identity_1mb"], proc, log)
    return proc, http_port, grpc_port


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _with_cpu(pid: int, run, duration: float, warmup: float = 1.0) -> dict:
    """Run one cell; add the server tree's CPU microseconds per request (warm-up requests counted at the same rate)."""
    before = tree_cpu_seconds(pid)
    cell = run()
    used = tree_cpu_seconds(pid) - before
    if "error" not in cell and cell.get("infer_per_sec"):
        cell["cpu_us_per_req"] = used / (cell["infer_per_sec"] * (duration + warmup)) * 1e6
    return cell


def _load(core: str, port: int, protocol: str, concurrency: int, duration: float) -> dict:
    cmd = ["taskset", "-c", core, sys.executable, str(HERE / "load.py"), "--url", f"127.0.0.1:{port}",
           "--protocol", protocol, "--model", "add_sub", "-c", str(concurrency), "--duration", str(duration),
           "--warmup", "1", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 120)
    if done.returncode != 0 or not done.stdout.strip():
        return {"error": (done.stderr.strip().splitlines() or ["load.py failed"])[-1][:200]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _mb_client(port: int, concurrency: int, duration: float) -> dict:
    """Closed loop of 1 MiB FP32 identity requests over the HTTP binary extension (runs in a pinned subprocess)."""
    data = np.random.default_rng(0).random(MB_ELEMENTS, dtype=np.float32)
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [MB_ELEMENTS], "datatype": "FP32",
                                     "parameters": {"binary_data_size": data.nbytes}}],
                         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    body = header + data.tobytes()
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))}
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    warm_until = time.perf_counter() + 1.0
    stop_at = warm_until + duration

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port)
        first = True
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            conn.request("POST", "/v2/models/identity_1mb/infer", body, headers)
            response = conn.getresponse()
            payload = response.read()
            ok = response.status == 200 and len(payload) > data.nbytes
            if first and ok:
                offset = len(payload) - data.nbytes
                ok = np.array_equal(np.frombuffer(payload[offset:], np.float32), data)
                first = False
            with lock:
                if not ok:
                    errors[0] += 1
                elif started >= warm_until:
                    latencies.append(time.perf_counter() - started)
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lat = np.array(latencies) * 1e3
    return {"infer_per_sec": len(latencies) / duration, "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
            "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None, "errors": errors[0]}


def _mb(core: str, port: int, concurrency: int, duration: float) -> dict:
    cmd = ["taskset", "-c", core, sys.executable, str(Path(__file__).resolve()), "_mb_client", str(port),
           str(concurrency), str(duration)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 120)
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-200:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(args: argparse.Namespace) -> dict:
    if shutil.which("taskset") is None:
        raise SystemExit("taskset (util-linux) is needed to pin servers and clients")
    servers = ["naiad"] + (["triton"] if args.triton else [])
    if args.triton and not TRITON_SCRIPT.exists():
        raise SystemExit(f"--triton needs {TRITON_SCRIPT}")
    work = Path(tempfile.mkdtemp(prefix="naiad-pybench-"))
    repo = work / "repo"
    _write(repo, "add_sub", ADD_SUB_CONFIG, ADD_SUB_PY)
    _write(repo, "identity_1mb", IDENTITY_CONFIG, IDENTITY_PY)
    running = {}
    results: dict = {}
    try:
        for kind in servers:
            running[kind] = _start(kind, repo, work, args.server_core)
        for _ in range(args.rounds):
            for kind in servers:  # servers take turns cell by cell
                proc, http_port, grpc_port = running[kind]
                for protocol in args.protocols:
                    port = grpc_port if protocol == "grpc" else http_port
                    for concurrency in args.concurrency:
                        cell = _with_cpu(proc.pid, functools.partial(_load, args.client_core, port, protocol, concurrency, args.duration),
                                         args.duration)
                        results.setdefault((kind, f"add_sub {protocol}", concurrency), []).append(cell)
                for concurrency in (1, 4):
                    cell = _with_cpu(proc.pid, functools.partial(_mb, args.client_core, http_port, concurrency, args.duration),
                                     args.duration)
                    results.setdefault((kind, "identity 1MiB http-binary", concurrency), []).append(cell)
    finally:
        for proc, _, _ in running.values():
            _stop(proc)
        shutil.rmtree(work, ignore_errors=True)
    table = []
    print(f"{'server':8} {'workload':28} {'c':>3} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'cpu us/req':>10}  errors")
    for (kind, workload, concurrency), cells in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        good = [c for c in cells if "error" not in c]
        if not good:
            print(f"{kind:8} {workload:28} {concurrency:>3} error: {cells[0]['error']}")
            continue
        best = sorted(good, key=lambda c: c["infer_per_sec"])[len(good) // 2]  # median round
        cpu = statistics.median(c["cpu_us_per_req"] for c in good if "cpu_us_per_req" in c) if any(
            "cpu_us_per_req" in c for c in good) else 0.0
        print(f"{kind:8} {workload:28} {concurrency:>3} {best['infer_per_sec']:9.1f} {best['p50_ms'] or 0:8.3f} "
              f"{best['p99_ms'] or 0:8.3f} {cpu:10.0f}  {best.get('errors', 0)}")
        table.append({"server": kind, "workload": workload, "concurrency": concurrency, **best, "cpu_us_per_req_median": cpu})
    _print_ratios(table)
    return {"cells": table}


def _print_ratios(table: list[dict]) -> None:
    """Naiad / Triton per cell: measured throughput, and per-core capacity from CPU per request."""
    by_key = {(c["server"], c["workload"], c["concurrency"]): c for c in table}
    lines = []
    for (server, workload, concurrency), cell in sorted(by_key.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        peer = by_key.get(("triton", workload, concurrency))
        if server != "naiad" or peer is None:
            continue
        cpu = (peer["cpu_us_per_req_median"] / cell["cpu_us_per_req_median"]) if cell["cpu_us_per_req_median"] else 0.0
        lines.append(f"  {workload:28} c={concurrency:<3} throughput {cell['infer_per_sec'] / peer['infer_per_sec']:.2f}x"
                     f"   per-core capacity (CPU/request) {cpu:.2f}x")
    if lines:
        print("naiad / triton:")
        print("\n".join(lines))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_mb_client":
        print(json.dumps(_mb_client(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    scale = sub.add_parser("scaling", help="instance_group count 1 vs 2 on a CPU-bound model")
    scale.add_argument("--iterations", type=int, default=200_000, help="loop iterations per request (~10 ms)")
    scale.add_argument("--duration", type=float, default=5.0)
    scale.add_argument("--rounds", type=int, default=3)
    cmp_ = sub.add_parser("compare", help="add_sub FP32[16] and 1 MiB identity over HTTP/gRPC")
    cmp_.add_argument("--triton", action="store_true", help="also run real Triton (start_triton.sh)")
    cmp_.add_argument("--duration", type=float, default=5.0)
    cmp_.add_argument("--rounds", type=int, default=1)
    cmp_.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    cmp_.add_argument("--protocols", nargs="+", choices=("http-json", "http-binary", "grpc"),
                      default=["http-json", "http-binary", "grpc"], help="load.py protocols for add_sub")
    cmp_.add_argument("--server-core", default="0")
    cmp_.add_argument("--client-core", default="1")
    for sub_parser in (scale, cmp_):
        sub_parser.add_argument("--output", help="write the results as JSON")
    args = parser.parse_args()
    result = scaling(args) if args.command == "scaling" else compare(args)
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
