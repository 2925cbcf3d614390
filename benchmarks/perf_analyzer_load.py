"""Load through Triton's `perf_analyzer`, read back as a benchmark-matrix cell.

    python benchmarks/perf_analyzer_load.py --url 127.0.0.1:8001 --protocol pa-grpc --model add_sub -c 8

perf_analyzer holds `--concurrency-range C` requests in flight (a closed loop, random input data of
the shapes the model's metadata gives) and measures in windows of `--measurement-interval` ms until
the last three agree within `-s` percent in throughput and latency, or gives up after `--max-trials`
windows (exit status non-zero, no figures). Its client figures of the three stable windows are read
from its text report: throughput, and the p50/p90/p95/p99 latencies (microseconds, given here in ms).
`pa-http` speaks HTTP with binary tensors (its default), `pa-grpc` gRPC. It needs the server's model
configuration (GET /v2/models/<name>/config or the gRPC ModelConfig call, a Triton extension).

perf_analyzer comes from the `perf-analyzer` wheel on PyPI (`pip install perf-analyzer`); that binary
needs glibc 2.38 or newer.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys

PROTOCOLS = {"pa-http": "http", "pa-grpc": "grpc"}  # matrix protocol -> perf_analyzer's -i
INSTALL_HINT = ("pip install perf-analyzer (its binary needs glibc >= 2.38), "
                "or name the binary with --perf-analyzer PATH or $PERF_ANALYZER")
DEFAULT_STABILITY = 10.0  # perf_analyzer's own default (percent)
DEFAULT_MAX_TRIALS = 10  # perf_analyzer's own default: a cell fails to settle where a plain perf_analyzer run would

_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
_FIELDS = {  # cell key -> (pattern in the "Client:" section, factor to the cell's unit)
    "completed": (rf"Request count: {_NUMBER}", 1),
    "infer_per_sec": (rf"Throughput: {_NUMBER} infer/sec", 1),
    "mean_ms": (rf"Avg latency: {_NUMBER} usec", 1e-3),
    "p50_ms": (rf"p50 latency: {_NUMBER} usec", 1e-3),
    "p90_ms": (rf"p90 latency: {_NUMBER} usec", 1e-3),
    "p95_ms": (rf"p95 latency: {_NUMBER} usec", 1e-3),
    "p99_ms": (rf"p99 latency: {_NUMBER} usec", 1e-3),
}


def find_binary(name: str) -> str | None:
    """The perf_analyzer executable `name` names (a path, or a name looked up on PATH)."""
    if os.sep in name:
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    return shutil.which(name)


def parse_report(text: str) -> dict:
    """The client figures of perf_analyzer's text report; ValueError when it holds no throughput."""
    client = text.split("Client:", 1)
    if len(client) < 2:
        raise ValueError("no client section in the perf_analyzer report")
    section = client[1].split("Server:", 1)[0]  # the server's own statistics follow
    cell: dict = {}
    for key, (pattern, factor) in _FIELDS.items():
        match = re.search(pattern, section)
        if match:
            cell[key] = float(match.group(1)) * factor
    if not cell.get("infer_per_sec"):
        raise ValueError("no throughput in the perf_analyzer report")
    cell["completed"] = int(cell.get("completed", 0))
    return cell


def command(binary: str, protocol: str, port: int, model: str, concurrency: int, duration: float,
            stability: float = DEFAULT_STABILITY, max_trials: int = DEFAULT_MAX_TRIALS,
            core: str | None = None) -> list[str]:
    cmd = [binary, "-m", model, "-u", f"127.0.0.1:{port}", "-i", PROTOCOLS[protocol],
           "--concurrency-range", str(concurrency), "--measurement-interval", str(max(1, round(duration * 1000))),
           "--stability-percentage", f"{stability:g}", "--max-trials", str(max_trials)]
    return ["taskset", "-c", core, *cmd] if core is not None else cmd


def _last_words(stdout: str, stderr: str) -> str:
    """Why it failed: its last error lines, else the end of its report."""
    lines = [line.strip() for line in (stderr.strip() or stdout).splitlines() if line.strip()]
    return " | ".join(lines[-2:])[-300:] or "no output"


def _run(cmd: list[str], timeout: float) -> tuple[int, str, str]:
    """Run in its own process group, so that a timeout also ends a binary started by a wrapper script
    (the wheel's `perf_analyzer` command is a Python wrapper around the bundled binary)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, stdout, stderr


def run_perf_analyzer(binary: str, protocol: str, port: int, model: str, concurrency: int, duration: float,
                      core: str | None = None, stability: float = DEFAULT_STABILITY,
                      max_trials: int = DEFAULT_MAX_TRIALS) -> dict:
    """One cell in load.py's LoadResult fields, "client": "perf_analyzer", and "error" when it failed."""
    cmd = command(binary, protocol, port, model, concurrency, duration, stability, max_trials, core)
    base = {"protocol": protocol, "model": model, "concurrency": concurrency, "client": "perf_analyzer"}
    timeout = duration * (max_trials + 1) + 60  # max_trials windows, start-up, metadata and configuration
    try:
        status, stdout, stderr = _run(cmd, timeout)
    except subprocess.TimeoutExpired:
        return {**base, "error": f"perf_analyzer did not finish within {timeout:.0f} s"}
    except OSError as exc:
        return {**base, "error": f"perf_analyzer did not start: {exc}"}
    if status != 0:
        return {**base, "error": f"perf_analyzer exited {status}: {_last_words(stdout, stderr)}"}
    try:  # the wheel's wrapper exits 0 whatever the binary did: no figures is the failure then
        figures = parse_report(stdout)
    except ValueError as exc:
        return {**base, "error": f"{exc}: {_last_words(stdout, stderr)}"}
    return {**base, **figures, "errors": 0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="127.0.0.1:PORT (the HTTP or the gRPC port)")
    parser.add_argument("--protocol", choices=sorted(PROTOCOLS), default="pa-grpc")
    parser.add_argument("--model", default="add_sub")
    parser.add_argument("-c", "--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement window")
    parser.add_argument("--stability", type=float, default=DEFAULT_STABILITY, help="perf_analyzer -s (percent)")
    parser.add_argument("--max-trials", type=int, default=DEFAULT_MAX_TRIALS, help="perf_analyzer --max-trials")
    parser.add_argument("--core", help="pin perf_analyzer to this core (taskset -c)")
    parser.add_argument("--perf-analyzer", default=os.environ.get("PERF_ANALYZER", "perf_analyzer"))
    args = parser.parse_args(argv)
    host, _, port = args.url.rpartition(":")
    if host not in ("", "127.0.0.1", "localhost"):
        parser.error("only loopback targets (127.0.0.1)")
    binary = find_binary(args.perf_analyzer)
    if binary is None:
        parser.error(f"no perf_analyzer at {args.perf_analyzer!r}: {INSTALL_HINT}")
    print(json.dumps(run_perf_analyzer(binary, args.protocol, int(port), args.model, args.concurrency, args.duration,
                                       args.core, args.stability, args.max_trials)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
