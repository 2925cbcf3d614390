"""The benchmark matrix: Naiad vs real Triton 2.51, MLServer and KServe, one core per server.

    python benchmarks/matrix_bench.py                         # everything: 3 rounds of 5 s cells
    python benchmarks/matrix_bench.py --models add_sub --protocols grpc --concurrency 1 --duration 2 --rounds 1
    python benchmarks/matrix_bench.py --report benchmarks/results/FILE.json     # print an earlier run

Models (benchmarks/matrix_models.py): add_sub FP32[16] as a Python model, add_sub as ONNX (Naiad only),
the 256-512-512-10 ONNX MLP, XGBoost 100 trees; each plain and with dynamic batching (500 us queue delay).
Protocols: http-json through `wrk` (wrk_load.py), http-binary and grpc through load.py's closed loop,
pa-http and pa-grpc through Triton's perf_analyzer (perf_analyzer_load.py; left out of the default
protocols, with a note, when perf_analyzer is not installed).
Concurrency 1, 8, 32. Every server runs under `taskset -c <server core>` (its children too: Python
stubs and workers), the load generator under `taskset -c <client core>`. All servers are started first
and take turns cell by cell, the order rotating each round, so background noise hits them alike.
Every served model's answer is checked exactly once per protocol before any timing; every cell's
first answer is checked again. Each cell reports infer/s, p50 and p99 (ms) of the median (or best)
round, and the CPU time the server's process tree spent per request. The raw results of every round
go to --output (default benchmarks/results/<UTC time>-matrix.json), written even when interrupted.
Servers are stopped on exit, on Ctrl-C and on SIGTERM/SIGHUP.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import load  # noqa: E402  (benchmarks/ is not a package)
import matrix_models  # noqa: E402
import perf_analyzer_load  # noqa: E402
import servers as procs  # noqa: E402
from batching_bench import model_counts  # noqa: E402
from matrix_models import MODELS, SERVERS, VARIANTS, served_name  # noqa: E402
from run_onnx_bench import run_load  # noqa: E402
from wrk_load import run_wrk  # noqa: E402

PROTOCOLS = ("http-json", "http-binary", "grpc", *perf_analyzer_load.PROTOCOLS)
_NO_MODEL_CONFIG = "perf_analyzer reads the model configuration (a Triton extension) that {} does not serve"
UNSUPPORTED = {("mlserver", "http-binary"): "MLServer has no binary tensor extension on REST",
               **{(peer, protocol): _NO_MODEL_CONFIG.format(label)
                  for peer, label in (("mlserver", "MLServer"), ("kserve", "KServe"))
                  for protocol in perf_analyzer_load.PROTOCOLS}}
CHECKED_AS = {"pa-http": "http-binary", "pa-grpc": "grpc"}  # perf_analyzer's HTTP sends binary tensors
NAMES = {"naiad": "Naiad", "baseline": "Naiad baseline", "triton": "Triton", "mlserver": "MLServer", "kserve": "KServe"}
WITH_STATISTICS = ("naiad", "baseline", "triton")  # servers with the statistics extension (formed batch sizes)


class Stop(BaseException):
    """SIGTERM or SIGHUP: unwind like Ctrl-C (past `except Exception`) so every server is stopped."""


def _raise_stop(signum: int, _frame) -> None:
    raise Stop(signal.Signals(signum).name)


# ---------------------------------------------------------------- servers

def _lacks(venv: Path | None, module: str) -> bool:
    """True when `venv` exists and cannot import `module` (start_triton.sh makes a missing venv)."""
    python = venv / "bin" / "python" if venv else None
    return bool(python and python.exists()
                and subprocess.run([str(python), "-c", f"import {module}"], capture_output=True).returncode != 0)


def start_servers(work: Path, matrix: matrix_models.Matrix, args, running: dict[str, procs.RunningServer],
                  failures: dict[str, str]) -> None:
    """Start each selected server that serves a selected model into `running` (failures: name -> why)."""
    for name in args.servers:
        models = matrix.names(name)
        if not models:
            procs.log(f"{name}: serves none of the selected models, not started")
            continue
        if name in ("mlserver", "kserve") and not (args.venvs / name / "bin" / "python").exists():
            failures[name] = f"no venv under {args.venvs} (benchmarks/setup_peers.sh)"
            procs.log(f"{name}: {failures[name]}, skipped")
            continue
        if name == "triton" and "xgboost" in args.models and _lacks(args.triton_venv, "xgboost"):
            failures[name] = f"xgboost is not importable in {args.triton_venv} (pip install xgboost-cpu==3.2.0 there)"
            procs.log(f"{name}: {failures[name]}, skipped")
            continue
        procs.log(f"starting {name} ({', '.join(models)})")
        try:
            if name == "naiad":
                running[name] = procs.start_naiad(work, matrix.naiad_repo, args.server_core, models, args.grpc_impl,
                                                  extra=naiad_flags(args))
            elif name == "baseline":  # the same repository served by another checkout: before vs after a change
                running[name] = procs.start_naiad(work, matrix.naiad_repo, args.server_core, models, args.grpc_impl,
                                                  tag="baseline", src=args.baseline_src / "src", extra=naiad_flags(args))
            elif name == "triton":
                running[name] = procs.start_triton(work, matrix.triton_repo, args.server_core, models, args.triton_venv)
            elif name == "mlserver":
                running[name] = procs.start_mlserver(
                    work, args.server_core, args.venvs, {m: matrix.mlserver[m] for m in models})
            else:
                running[name] = procs.start_kserve(work, args.server_core, args.venvs, {m: matrix.kserve[m] for m in models})
        except (RuntimeError, OSError) as exc:
            failures[name] = str(exc)[-1000:]
            procs.log(f"{name} did not start: {exc}")
            continue
        server = running[name]
        procs.log(f"{name} ready: pid {server.proc.pid}, http {server.http_port}, grpc {server.grpc_port}")


def check_answers(running: dict[str, procs.RunningServer], matrix: matrix_models.Matrix, args) -> dict[str, str]:
    """One exactly checked request per server, served model and protocol; returns the failures."""
    failures = {}
    for name, server in running.items():
        for model in matrix.names(name):
            for protocol in args.protocols:
                if (name, protocol) in UNSUPPORTED:
                    continue
                checked = CHECKED_AS.get(protocol, protocol)
                port = server.grpc_port if checked == "grpc" else server.http_port
                try:
                    load.check_once(checked, "127.0.0.1", port, matrix.workloads[model])
                except Exception as exc:
                    failures[f"{name}/{model}/{protocol}"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    procs.log(f"check failed: {name} {model} {protocol}: {exc}")
    return failures


# ---------------------------------------------------------------- one cell

def _counts(server: procs.RunningServer, model: str) -> tuple[int, int, dict[int, int]] | None:
    try:
        return model_counts(server.http_port, model)
    except OSError as exc:  # a server that stopped answering: its cells report the errors
        procs.log(f"{server.name}: no statistics for {model}: {exc}")
        return None


def measure(server: procs.RunningServer, model: str, protocol: str, concurrency: int,
            matrix: matrix_models.Matrix, args) -> dict:
    batched = model.endswith("_batched")
    pa = protocol in perf_analyzer_load.PROTOCOLS
    counts = server.name in WITH_STATISTICS and (batched or pa)
    before = _counts(server, model) if counts else None
    cpu_before = procs.tree_cpu_seconds(server.proc.pid)
    started = time.perf_counter()
    if pa:
        port = server.grpc_port if protocol == "pa-grpc" else server.http_port
        cell = perf_analyzer_load.run_perf_analyzer(args.perf_analyzer, protocol, port, model, concurrency,
                                                    args.duration, args.client_core, args.perf_analyzer_stability,
                                                    args.perf_analyzer_max_trials)
    elif protocol == "http-json":
        try:
            cell = run_wrk(server.http_port, model, concurrency, args.duration, args.warmup, args.client_core)
        except (RuntimeError, OSError) as exc:
            cell = {"error": str(exc)[:300]}
    else:
        port = server.grpc_port if protocol == "grpc" else server.http_port
        cell = run_load(args.client_core, port, protocol, model, concurrency, args, matrix.onnx_reference.get(model),
                        grpc_client=args.grpc_client)
        cell["client"] = "load.py"
    elapsed = time.perf_counter() - started
    cpu = procs.tree_cpu_seconds(server.proc.pid) - cpu_before
    after = _counts(server, model) if before is not None else None
    served = after[0] - before[0] if before is not None and after is not None else 0
    rate = cell.get("infer_per_sec") or 0.0
    if pa and served:
        # perf_analyzer measures until its windows agree, so its run is longer than --duration by a
        # varying amount: divide by every request the server counted over the whole run instead.
        cell["server_cpu_us_per_req"] = cpu / served * 1e6
        cell["served_requests"] = served
    elif rate:  # warm-up requests are counted at the measured rate
        # (perf_analyzer without statistics: its whole run at the reported rate, start-up included,
        # so the figure comes out a little low)
        seconds = elapsed if pa else args.duration + args.warmup
        cell["server_cpu_us_per_req"] = cpu / (rate * seconds) * 1e6
    cell["elapsed_s"] = elapsed
    if batched and before is not None and after is not None:  # warm-up included: the batcher's habit
        executions = after[1] - before[1]
        cell["formed_batch"] = served / executions if executions else 0.0
    return cell


def generator_ceiling(work: Path, args) -> dict:
    """The load generators against trivial_server.py (canned answers) on the server core: their own ceiling."""
    out_path = work / "trivial.stdout"
    proc = procs.spawn([sys.executable, str(HERE / "trivial_server.py"), "--lifetime", "900"], args.server_core,
                       out_path, work)
    server = procs.RunningServer("trivial", proc, 0, 0, out_path)

    def ready():
        for line in out_path.read_text(errors="replace").splitlines():
            if line.startswith("TRIVIAL_READY "):
                return json.loads(line.split(" ", 1)[1])
        return None

    results = {}
    try:
        ports = procs.wait_until(ready, "trivial server", proc, out_path, 30)
        for protocol in args.protocols:
            if protocol in perf_analyzer_load.PROTOCOLS:  # needs metadata, configuration and statistics
                procs.log(f"generator ceiling {protocol}: not measured (trivial_server.py serves no model configuration)")
                continue
            for c in sorted({min(args.concurrency), max(args.concurrency)}):
                if protocol == "http-json":
                    cell = run_wrk(ports["http_port"], "add_sub", c, args.duration, args.warmup, args.client_core)
                else:  # canned add_sub answers: nothing to verify; gRPC against h2grpc's cheap responder
                    port = ports["h2_grpc_port"] if protocol == "grpc" else ports["http_port"]
                    cell = run_load(args.client_core, port, protocol, "add_sub", c, args, None, verify=False)
                results[f"{protocol}|{c}"] = cell
                procs.log(f"generator ceiling {protocol:11s} c={c:<3d} {_short(cell)}")
    finally:
        server.stop()
    return results


def _short(cell: dict | None) -> str:
    if not cell:
        return "-"
    if not cell.get("infer_per_sec"):
        return "error"
    text = f"{cell['infer_per_sec']:,.0f} ({cell['p50_ms']:.2f}/{cell['p99_ms']:.2f})"
    return text + " !" if cell.get("error") else text


def run_matrix(running: dict[str, procs.RunningServer], matrix: matrix_models.Matrix, args, report: dict) -> None:
    order = list(running)
    for rnd in range(args.rounds):
        turn = order[rnd % len(order):] + order[:rnd % len(order)] if order else []
        for model in args.models:
            for variant in args.variants:
                who = matrix.served.get((model, variant), set())
                name = served_name(model, variant)
                for protocol in args.protocols:
                    for c in args.concurrency:
                        for server in turn:
                            if server not in who or (server, protocol) in UNSUPPORTED:
                                continue
                            if f"{server}/{name}/{protocol}" in report["check_failures"]:
                                continue
                            cell = measure(running[server], name, protocol, c, matrix, args)
                            cell["round"] = rnd + 1
                            key = f"{server}|{model}|{variant}|{protocol}|{c}"
                            report["cells"].setdefault(key, []).append(cell)
                            procs.log(f"round {rnd + 1}/{args.rounds} {server:8s} {name:22s} {protocol:11s} c={c:<3d} "
                                      f"{_short(cell)}" + (f"  [{cell['error']}]" if cell.get("error") else ""))


# ---------------------------------------------------------------- report

def pick(rounds: list[dict], how: str) -> dict | None:
    ok = sorted((r for r in rounds if r.get("infer_per_sec")), key=lambda r: r["infer_per_sec"])
    if not ok:
        return rounds[0] if rounds else None
    return ok[-1] if how == "best" else ok[(len(ok) - 1) // 2]


def _ratio(a: dict | None, b: dict | None, field: str = "infer_per_sec") -> str:
    if not a or not b or not a.get(field) or not b.get(field):
        return "-"
    return f"{a[field] / b[field]:.2f}"


def tables(report: dict, how: str) -> str:
    cfg = report["config"]
    servers = [s for s in cfg["servers"] if s in report.get("started", cfg["servers"])]
    cells = {tuple(k.split("|")): pick(v, how) for k, v in report["cells"].items()}
    peers = [s for s in servers if s != "naiad"]
    head = ["model", "variant", "protocol", "c"] + [NAMES[s] for s in servers]
    head += [f"Naiad/{NAMES[s]}" for s in peers] + (["p99 Naiad/Triton"] if "triton" in peers else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    wins = total = 0
    for model in cfg["models"]:
        for variant in cfg["variants"]:
            for protocol in cfg["protocols"]:
                for c in cfg["concurrency"]:
                    row = {s: cells.get((s, model, variant, protocol, str(c))) for s in servers}
                    if not any(row.values()):
                        continue
                    text = [model, variant, protocol, str(c)]
                    text += ["n/a" if (s, protocol) in UNSUPPORTED else _short(row[s]) for s in servers]
                    text += [_ratio(row.get("naiad"), row[s]) for s in peers]
                    if "triton" in peers:
                        # latency ratio: above 1 means Naiad's tail is longer
                        text.append(_ratio(row.get("naiad"), row["triton"], "p99_ms"))
                        naiad, triton = row.get("naiad"), row["triton"]
                        if _ratio(naiad, triton) != "-":
                            assert naiad is not None and triton is not None
                            total += 1
                            # on the figures themselves, not the ratio as printed (0.997 shows as 1.00)
                            wins += naiad["infer_per_sec"] >= triton["infer_per_sec"]
                    lines.append("| " + " | ".join(text) + " |")
    out = [f"Machine: {report['machine']}", f"Command: {report['command']}",
           f"Cells: infer/s (p50/p99 ms) of the {'fastest' if how == 'best' else 'median'} of {cfg['rounds']} "
           f"round(s) of {cfg['duration']:g} s; Naiad/X compares infer/s; '!' = some requests failed; "
           f"n/a = protocol not offered; '-' = model not served or not measured.", ""] + lines
    if total:
        out += ["", f"Naiad/Triton >= 1.00 in {wins} of {total} cells."]
    not_offered = [f"- {NAMES[s]} {p}: {why}" for (s, p), why in UNSUPPORTED.items() if s in servers and p in cfg["protocols"]]
    if not_offered:
        out += ["", "n/a:"] + not_offered
    cpu = [(k, pick(v, how)) for k, v in report["cells"].items()]
    cpu_lines = [f"| {k.replace('|', ' | ')} | {c['server_cpu_us_per_req']:.0f} | "
                 + (f"{c['formed_batch']:.1f} |" if "formed_batch" in c else "|")
                 for k, c in cpu if c and c.get("server_cpu_us_per_req")]
    if cpu_lines:
        out += ["", "Server process tree CPU per request (us), and the mean batch the scheduler formed:", "",
                "| server | model | variant | protocol | c | CPU us/request | mean batch |",
                "|---|---|---|---|---|---|---|"] + cpu_lines
    if report.get("generator_ceiling"):
        out += ["", "Load generators against trivial_server.py on the server core (their own ceiling):"]
        out += [f"- {k.replace('|', ' c=')}: {_short(v)}" for k, v in report["generator_ceiling"].items()]
    if report.get("start_failures"):
        out += ["", "Servers that did not start:"] + [f"- {k}: {v}" for k, v in report["start_failures"].items()]
    if report.get("check_failures"):
        out += ["", "Answers that failed the exact check (cells not measured):"]
        out += [f"- {k}: {v}" for k, v in report["check_failures"].items()]
    return "\n".join(out)


# ---------------------------------------------------------------- main

def naiad_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """Extra `naiad serve` flags the options ask for."""
    flags: tuple[str, ...] = ()
    if args.naiad_frontend_processes is not None:
        flags += ("--frontend-processes", str(args.naiad_frontend_processes))
    if args.naiad_frontend_core_connections is not None:
        flags += ("--frontend-core-connections", str(args.naiad_frontend_core_connections))
    return flags


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                        help="plain and/or batched (dynamic_batching, 500 us queue delay)")
    parser.add_argument("--protocols", nargs="+", choices=PROTOCOLS,
                        help="http-json runs through wrk; http-binary and grpc through load.py; pa-http and pa-grpc "
                             "through perf_analyzer (default: all, the pa-* ones when perf_analyzer is found)")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per cell; for perf_analyzer, its measurement window (default 5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each cell (default 1)")
    parser.add_argument("--rounds", type=int, default=3, help="repeats of the whole matrix (default 3)")
    parser.add_argument("--pick", choices=("median", "best"), default="median",
                        help="the round a cell reports: the median (default) or the fastest")
    parser.add_argument("--max-requests", type=int, default=10_000_000, help="cap on load.py requests per cell")
    parser.add_argument("--server-core", default="0", help="taskset core list of the servers; '0,1' leaves them unpinned on two cores")
    parser.add_argument("--client-core", default="1", help="taskset core list of the load generator")
    parser.add_argument("--naiad-frontend-processes", type=int, default=None, metavar="N",
                        help="pass --frontend-processes N to Naiad (and to the baseline)")
    parser.add_argument("--naiad-frontend-core-connections", type=int, default=None, metavar="K",
                        help="pass --frontend-core-connections K to Naiad (and to the baseline)")
    parser.add_argument("--venvs", type=Path, default=os.environ.get("NAIAD_BENCH_VENVS"),
                        help="root of the peer venvs made by setup_peers.sh (default: $NAIAD_BENCH_VENVS)")
    parser.add_argument("--triton-venv", type=Path, default=os.environ.get("TRITON_VENV"),
                        help="venv of start_triton.sh (default: $TRITON_VENV, else start_triton.sh's default)")
    parser.add_argument("--grpc-client", choices=("raw", "grpcio"), default="raw",
                        help="load.py's gRPC client: raw HTTP/2 framing (default, cheapest) or grpc.aio")
    parser.add_argument("--grpc-impl", choices=("naiad", "grpcio"), default="naiad", help="Naiad's gRPC server")
    parser.add_argument("--baseline-src", type=Path, metavar="CHECKOUT",
                        help="also serve Naiad from this other checkout (e.g. a `git worktree` of the commit before a "
                             "change), measured in the same rounds and reported as Naiad/Naiad baseline")
    parser.add_argument("--perf-analyzer", default=os.environ.get("PERF_ANALYZER", "perf_analyzer"), metavar="PATH",
                        help="perf_analyzer binary for pa-http/pa-grpc (default: $PERF_ANALYZER, else found on PATH)")
    parser.add_argument("--perf-analyzer-stability", type=float, default=perf_analyzer_load.DEFAULT_STABILITY,
                        metavar="PERCENT", help="perf_analyzer -s: how far its last 3 windows may differ (default 10)")
    parser.add_argument("--perf-analyzer-max-trials", type=int, default=perf_analyzer_load.DEFAULT_MAX_TRIALS,
                        metavar="N", help="perf_analyzer --max-trials: windows before a cell fails as unstable "
                                          f"(default {perf_analyzer_load.DEFAULT_MAX_TRIALS})")
    parser.add_argument("--output", type=Path, help="raw JSON (default benchmarks/results/<UTC time>-matrix.json)")
    parser.add_argument("--report", type=Path, metavar="JSON", help="print the tables of an earlier --output and exit")
    parser.add_argument("--keep-workdir", action="store_true", help="keep repositories and server logs")
    parser.add_argument("--skip-generator-ceiling", action="store_true",
                        help="do not first measure wrk and load.py against trivial_server.py")
    parser.add_argument("--check-only", action="store_true",
                        help="start the servers, check one answer per server, model and protocol, and stop (no timing)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.duration <= 0 or min(args.concurrency) < 1:
        parser.error("--rounds, --duration and --concurrency must be positive")
    if args.venvs is None and {"mlserver", "kserve"} & set(args.servers) and not args.report:
        parser.error("MLServer/KServe need --venvs or NAIAD_BENCH_VENVS (the root given to setup_peers.sh)")
    asked = args.protocols is not None
    if not asked:
        args.protocols = list(PROTOCOLS)
    pa = [p for p in args.protocols if p in perf_analyzer_load.PROTOCOLS]
    if pa and not args.report:
        binary = perf_analyzer_load.find_binary(args.perf_analyzer)
        if binary is not None:
            args.perf_analyzer = binary
        elif asked:
            parser.error(f"{' and '.join(pa)} need perf_analyzer, not found at {args.perf_analyzer!r}: "
                         f"{perf_analyzer_load.INSTALL_HINT}")
        else:
            procs.log(f"perf_analyzer not found at {args.perf_analyzer!r}: {' and '.join(pa)} left out "
                      f"({perf_analyzer_load.INSTALL_HINT})")
            args.protocols = [p for p in args.protocols if p not in pa]
    if args.baseline_src is not None:
        if not (args.baseline_src / "src" / "naiad").is_dir():
            parser.error(f"--baseline-src: no src/naiad in {args.baseline_src}")
        if "naiad" not in args.servers:
            parser.error("--baseline-src compares with naiad: keep naiad in --servers")
        args.servers = [s for s in args.servers if s != "baseline"]
        args.servers.insert(args.servers.index("naiad") + 1, "baseline")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        report = json.loads(args.report.read_text())
        print(tables(report, args.pick))
        return 0
    for tool in ("taskset", "wrk") if "http-json" in args.protocols else ("taskset",):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is needed (Debian/Ubuntu: apt-get install {'util-linux' if tool == 'taskset' else tool})")
    when = datetime.datetime.now(datetime.UTC)
    output = args.output or (None if args.check_only else HERE / "results" / f"{when:%Y-%m-%d-%H%M}-matrix.json")
    config = {k: getattr(args, k) for k in ("servers", "models", "variants", "protocols", "concurrency", "rounds",
                                             "duration", "warmup", "pick", "server_core", "client_core", "grpc_impl",
                                             "naiad_frontend_processes", "naiad_frontend_core_connections", "grpc_client",
                                             "perf_analyzer_stability", "perf_analyzer_max_trials")}
    report: dict = {"when": when.isoformat(timespec="seconds"), "machine": procs.machine_line(),
                    "command": " ".join(["benchmarks/matrix_bench.py", *sys.argv[1:]]), "config": config,
                    "cells": {}, "start_failures": {}, "check_failures": {}, "complete": False}
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored (`cmd &`)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_stop)
    work = Path(tempfile.mkdtemp(prefix="naiad-matrix-"))
    running: dict[str, procs.RunningServer] = {}
    try:
        procs.log(report["machine"])
        if not (args.check_only or args.skip_generator_ceiling):
            report["generator_ceiling"] = generator_ceiling(work, args)
        matrix = matrix_models.build(work, args.models, args.variants)
        if "baseline" in args.servers:
            for who in matrix.served.values():
                if "naiad" in who:
                    who.add("baseline")
        start_servers(work, matrix, args, running, report["start_failures"])
        report["check_failures"] = check_answers(running, matrix, args)
        if args.check_only:
            checked = sum(len(matrix.names(n)) * len([p for p in args.protocols if (n, p) not in UNSUPPORTED])
                          for n in running)
            procs.log(f"checked {checked} server/model/protocol answers on {', '.join(running) or 'no server'}: "
                      f"{len(report['check_failures'])} failed")
        else:
            run_matrix(running, matrix, args, report)
        report["complete"] = True
    except (KeyboardInterrupt, Stop) as exc:
        procs.log(f"interrupted ({type(exc).__name__}); stopping servers")
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)  # a second Ctrl-C must not leave servers behind
        report["started"] = list(running)
        for server in running.values():
            server.stop()
        if output:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(json.dumps(report, indent=1, default=str))
            procs.log(f"raw results: {output}")
        if args.keep_workdir:
            procs.log(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if not args.check_only:
        print(tables(report, args.pick))
    if not report["complete"]:
        return 130
    return 1 if report["check_failures"] or report["start_failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
