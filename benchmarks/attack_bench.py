"""HTTP/2 attacks against gRPC servers, side by side, while normal clients keep calling a model.

    .venv/bin/python benchmarks/attack_bench.py                       # every attack, 20 s each
    .venv/bin/python benchmarks/attack_bench.py --secs 5 --attacks rapid_reset ping_flood
    TRITON_VENV=.venv-triton .venv/bin/python benchmarks/attack_bench.py   # ... also real Triton 2.51

Servers: Naiad on its own HTTP/2 server (`naiad`), Naiad on grpcio (`naiad-grpcio`) and, when
TRITON_VENV is set or `--servers triton` is given, real Triton 2.51 (start_triton.sh). Each serves
`add_sub` (FP32[16] + and -) as the same Python model, pinned to core 0 (`--server-core`); this
process, its normal clients and the attacker are pinned to core 1 (`--client-core`).

For each server, "idle" first and then each attack of tests/support/h2_attacks.py: the attack runs
`--secs` seconds from one connection at a time (a separate process, reconnecting whenever the server
ends the connection), then `--recovery` seconds pass without it. All along, a tritonclient gRPC client
and an HTTP/JSON client each call add_sub every 50 ms and check the answer. Reported per attack:
median and p99 latency of the normal calls started during the attack, failed calls (errors, wrong
answers, timeouts, calls stuck > 5 s) during the attack and the recovery, the server's RSS (its
process tree: server and Python-backend processes) at start, peak, and `--recovery` s after the
attacker stopped, and the attacker's connections.

Verdict (issue "Done when"): median of both protocols within 3x of idle, no failure, RSS growth
<= 100 MiB, RSS at most 25 MiB above its start `--recovery` s after the attack, server still up.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import multiprocessing as mp
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # tests.support.h2_attacks

from python_backend_bench import ADD_SUB_PY  # noqa: E402  (benchmarks/ is not a package)
from servers import (  # noqa: E402
    RunningServer,
    log,
    machine_line,
    start_naiad,
    start_triton,
    tree_rss_mib,
)

from tests.support.h2_attacks import ATTACKS, attack_loop, infer_body, new_stats  # noqa: E402

MODEL = "add_sub"
CONFIG = """backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
SERVERS = ("naiad", "naiad-grpcio", "triton")
PACE = 0.05            # seconds between one normal call's answer and the next call
CALL_TIMEOUT = 30.0    # a normal call taking longer fails
STUCK = 5.0            # a normal call still unanswered this long when an attack is summed up counts as failed
MEDIAN_FACTOR = 3.0
MAX_GROWTH_MIB = 100.0
BACK_SLACK_MIB = 25.0
A = np.arange(16, dtype=np.float32).reshape(1, 16)
B = np.ones((1, 16), dtype=np.float32)


@dataclass
class Call:
    start: float
    latency: float
    ok: bool


@dataclass
class NormalClient:
    """One protocol's client calling add_sub in a loop on its own thread."""

    protocol: str
    call: Callable[[], bool]
    calls: list[Call] = field(default_factory=list)
    inflight_since: float | None = None

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.inflight_since = started = time.monotonic()
            try:
                ok = self.call()
            except Exception:  # any error, refusal or timeout is a failed normal call
                ok = False
            self.calls.append(Call(started, time.monotonic() - started, ok))
            self.inflight_since = None
            time.sleep(PACE)

    def between(self, t0: float, t1: float) -> list[Call]:
        return [c for c in self.calls if t0 <= c.start < t1]

    def stuck(self, now: float) -> bool:
        since = self.inflight_since
        return since is not None and now - since > STUCK


def grpc_call(port: int) -> Callable[[], bool]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    inputs = [grpcclient.InferInput(name, [1, 16], "FP32") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(A)
    inputs[1].set_data_from_numpy(B)

    def call() -> bool:
        result = client.infer(MODEL, inputs, client_timeout=CALL_TIMEOUT)
        return bool(np.array_equal(result.as_numpy("OUTPUT0"), A + B))
    return call


def http_call(port: int) -> Callable[[], bool]:
    body = json.dumps({"inputs": [{"name": name, "shape": [1, 16], "datatype": "FP32", "data": x.ravel().tolist()}
                                  for name, x in (("INPUT0", A), ("INPUT1", B))]}).encode()
    expected = (A + B).ravel().tolist()
    conn = [http.client.HTTPConnection("127.0.0.1", port, timeout=CALL_TIMEOUT)]

    def call() -> bool:
        try:
            conn[0].request("POST", f"/v2/models/{MODEL}/infer", body, {"Content-Type": "application/json"})
            response = conn[0].getresponse()
            payload = response.read()
        except (OSError, http.client.HTTPException):
            conn[0].close()  # a fresh connection for the next call
            conn[0] = http.client.HTTPConnection("127.0.0.1", port, timeout=CALL_TIMEOUT)
            raise
        if response.status != 200:
            return False
        outputs = {o["name"]: o["data"] for o in json.loads(payload)["outputs"]}
        return outputs.get("OUTPUT0") == expected
    return call


class Clients:
    """The normal gRPC and HTTP clients of one server, running until `close`."""

    def __init__(self, server: RunningServer) -> None:
        self.stop = threading.Event()
        self.clients = [NormalClient("grpc", grpc_call(server.grpc_port)), NormalClient("http", http_call(server.http_port))]
        self.threads = [threading.Thread(target=c.run, args=(self.stop,), daemon=True) for c in self.clients]
        for thread in self.threads:
            thread.start()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(CALL_TIMEOUT + 5)


def _attacker(port: int, kind: str, stop: Any, ready: Any, out: Any) -> None:
    """The attacker process: one connection at a time until `stop`, then its counts on `out`."""
    stats = new_stats()
    body = infer_body(MODEL, "FP32", (1, 16))
    ready.set()
    attack_loop(port, ATTACKS[kind], stop, stats, body)
    out.put(stats)


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) * 1e3 if values else None


def measure(server: RunningServer, clients: Clients, kind: str, secs: float, recovery: float) -> dict:
    """One attack (or "idle") against a running server; the numbers of the report."""
    pid = server.proc.pid
    rss_start = tree_rss_mib(pid)
    stats: dict = {}
    proc = stop = None
    if kind != "idle":
        ctx = mp.get_context("spawn")
        stop, ready, out = ctx.Event(), ctx.Event(), ctx.Queue()
        proc = ctx.Process(target=_attacker, args=(server.grpc_port, kind, stop, ready, out), daemon=True)
        proc.start()
        ready.wait(60)
    t0 = time.monotonic()
    samples = [(0.0, rss_start)]
    while (now := time.monotonic()) < t0 + secs:
        samples.append((round(now - t0, 2), tree_rss_mib(pid)))
        time.sleep(0.25)
    t1 = time.monotonic()
    if proc is not None:
        stop.set()
        try:
            stats = out.get(timeout=20)
        except queue.Empty:
            stats = {"error": "the attacker did not report"}
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    back_after = None
    while (now := time.monotonic()) < t1 + recovery:
        rss = tree_rss_mib(pid)
        samples.append((round(now - t0, 2), rss))
        if back_after is None and rss <= rss_start + BACK_SLACK_MIB:
            back_after = round(now - t1, 2)
        time.sleep(0.5)
    rss_end = tree_rss_mib(pid)
    now = time.monotonic()
    result: dict = {"attack": kind, "secs": round(t1 - t0, 2), "attacker": stats,
                    "alive": server.proc.poll() is None, "rss_start_mib": round(rss_start, 1),
                    "rss_peak_mib": round(max(s[1] for s in samples), 1), "rss_end_mib": round(rss_end, 1),
                    "rss_back_after_s": back_after, "rss_samples": [(t, round(r, 1)) for t, r in samples]}
    for client in clients.clients:
        during, after = client.between(t0, t1), client.between(t1, t1 + recovery)
        good = [c.latency for c in during if c.ok]
        result[client.protocol] = {
            "calls": len(during), "p50_ms": _percentile(good, 50), "p99_ms": _percentile(good, 99),
            "failed_during": sum(not c.ok for c in during), "calls_after": len(after),
            "failed_after": sum(not c.ok for c in after), "stuck": client.stuck(now),
            "latencies_ms": [round(c.latency * 1e3, 2) for c in during]}
    return result


def verdict(cell: dict, idle: dict | None) -> str:
    """PASS, or the "Done when" points that failed."""
    failed = []
    if not cell["alive"]:
        failed.append("died")
    for protocol in ("grpc", "http"):
        mine, base = cell[protocol], (idle or {}).get(protocol, {})
        if mine["failed_during"] or mine["failed_after"] or mine["stuck"] or not mine["calls"]:
            failed.append(f"{protocol} failures")
        if cell["attack"] != "idle" and (mine["p50_ms"] is None or not base.get("p50_ms")
                                         or mine["p50_ms"] > MEDIAN_FACTOR * base["p50_ms"]):
            failed.append(f"{protocol} median")
    if cell["rss_peak_mib"] - cell["rss_start_mib"] > MAX_GROWTH_MIB:
        failed.append("RSS growth")
    if cell["rss_end_mib"] - cell["rss_start_mib"] > BACK_SLACK_MIB:
        failed.append("RSS not back")
    return "PASS" if not failed else "FAIL: " + ", ".join(failed)


def write_repo(repo: Path) -> None:
    (repo / MODEL / "1").mkdir(parents=True, exist_ok=True)
    (repo / MODEL / "config.pbtxt").write_text(CONFIG)
    (repo / MODEL / "1" / "model.py").write_text(ADD_SUB_PY)


def starter(name: str, work: Path, repo: Path, core: str) -> Callable[[], RunningServer]:
    if name == "triton":
        venv = os.environ.get("TRITON_VENV")
        return lambda: start_triton(work, repo, core, [MODEL], Path(venv) if venv else None)
    impl = "grpcio" if name == "naiad-grpcio" else "naiad"
    return lambda: start_naiad(work, repo, core, [MODEL], impl, tag=name)


def run_server(name: str, start: Callable[[], RunningServer], kinds: list[str], args: argparse.Namespace,
               cells: dict[str, dict], save: Callable[[], None]) -> None:
    """Every attack in turn against one server into `cells`, saved after each; a server that died is started
    again (and reported)."""
    log(f"starting {name}")
    server = start()
    clients = Clients(server)
    try:
        time.sleep(2)  # the clients' first calls (connections, model warm-up) are not measured
        for kind in kinds:
            log(f"{name}: {kind}")
            cell = measure(server, clients, kind, args.secs, args.recovery)
            cell["verdict"] = verdict(cell, cells.get("idle"))
            cells[kind] = cell
            save()
            log(f"{name}: {kind}: {cell['verdict']}")
            if not cell["alive"]:
                clients.close()
                server.stop()
                server = start()
                clients = Clients(server)
                time.sleep(2)
    finally:
        clients.close()
        server.stop()


def _ms(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"


def print_table(results: dict[str, dict[str, dict]]) -> None:
    print(f"{'server':13} {'attack':25} {'gRPC p50/p99 ms':>17} {'HTTP p50/p99 ms':>17} {'fail':>5} "
          f"{'RSS start/peak/end MiB':>23} {'conns':>6}  verdict")
    for name, cells in results.items():
        for kind, c in cells.items():
            fails = sum(c[p]["failed_during"] + c[p]["failed_after"] + int(c[p]["stuck"]) for p in ("grpc", "http"))
            grpc = f"{_ms(c['grpc']['p50_ms'])}/{_ms(c['grpc']['p99_ms'])}"
            http_ = f"{_ms(c['http']['p50_ms'])}/{_ms(c['http']['p99_ms'])}"
            rss = f"{c['rss_start_mib']:.0f}/{c['rss_peak_mib']:.0f}/{c['rss_end_mib']:.0f}"
            conns = c["attacker"].get("connections", "-")
            print(f"{name:13} {kind:25} {grpc:>17} {http_:>17} {fails:>5} {rss:>23} {conns!s:>6}  {c['verdict']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_servers = ["naiad", "naiad-grpcio"] + (["triton"] if os.environ.get("TRITON_VENV") else [])
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=default_servers)
    parser.add_argument("--attacks", nargs="+", choices=sorted(ATTACKS), default=list(ATTACKS))
    parser.add_argument("--secs", type=float, default=20.0, help="seconds of each attack (default 20)")
    parser.add_argument("--recovery", type=float, default=10.0, help="seconds watched after each attack (default 10)")
    parser.add_argument("--server-core", default="0")
    parser.add_argument("--client-core", default="1")
    parser.add_argument("--output", type=Path, help="raw results as JSON (default results/<UTC date>-attacks.json; other servers in it are kept)")
    parser.add_argument("--report", type=Path, help="reprint the table of a results file and exit")
    args = parser.parse_args()
    if args.report:
        print_table(json.loads(args.report.read_text())["servers"])
        return 0
    os.sched_setaffinity(0, {int(args.client_core)})  # this process, its client threads and the attacker
    started = datetime.datetime.now(datetime.UTC)
    output = args.output or HERE / "results" / f"{started.date().isoformat()}-attacks.json"
    # Servers measured earlier into the same file (e.g. Triton in a run of its own) are kept.
    report: dict = json.loads(output.read_text()) if output.exists() else {"runs": {}, "servers": {}}
    run = {"machine": machine_line(), "started_utc": started.isoformat(timespec="seconds"),
           "args": {k: str(v) for k, v in vars(args).items()}}

    def save() -> None:  # after each attack: an interrupted run keeps what it measured
        output.write_text(json.dumps(report, indent=1))

    with tempfile.TemporaryDirectory(prefix="naiad-attack-bench-") as tmp:
        work = Path(tmp)
        write_repo(work / "repo")
        for name in args.servers:
            report["runs"][name] = run
            report["servers"][name] = {}
            try:
                run_server(name, starter(name, work, work / "repo", args.server_core), ["idle", *args.attacks], args,
                           report["servers"][name], save)
            except (RuntimeError, OSError) as exc:
                log(f"{name} did not run: {exc}")
                report["runs"][name]["skipped"] = str(exc)[-2000:]
                save()
    print_table(report["servers"])
    log(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
