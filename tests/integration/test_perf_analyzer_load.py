"""benchmarks/perf_analyzer_load.py and the matrix's pa-http/pa-grpc cells: perf_analyzer's report is read
back in the matrix's units, its failures become error cells, the matrix finds (or leaves out) the binary,
and, where perf_analyzer is installed, one real cell against Naiad with its server CPU per request."""

from __future__ import annotations

import argparse
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.servers import start_server

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import load  # noqa: E402  (benchmarks/ is not a package)
import matrix_bench  # noqa: E402
import matrix_models  # noqa: E402
import perf_analyzer_load  # noqa: E402
import servers as procs  # noqa: E402

REPORT = """*** Measurement Settings ***
  Batch size: 1
  Service Kind: TRITON
  Using "time_windows" mode for stabilization
  Stabilizing using average latency and throughput
  Measurement window: 2000 msec
  Using synchronous calls for inference

Request concurrency: 8
  Client: 
    Request count: 24210
    Throughput: 4035.5 infer/sec
    Avg latency: 1980 usec (standard deviation 410 usec)
    p50 latency: 1903 usec
    p90 latency: 2488 usec
    p95 latency: 2710 usec
    p99 latency: 3645 usec
    Avg gRPC time: 1961 usec ((un)marshal request/response 6 usec + response wait 1955 usec)
  Server: 
    Inference count: 24212
    Execution count: 3050
    Successful request count: 24212
    Avg request latency: 1450 usec (overhead 60 usec + queue 700 usec + compute input 20 usec + compute infer 650 usec + compute output 20 usec)

Inferences/Second vs. Client Average Batch Latency
Concurrency: 8, throughput: 4035.5 infer/sec, latency 1980 usec
"""

UNSTABLE = """*** Measurement Settings ***
  Batch size: 1
  Measurement window: 500 msec

Request concurrency: 1
"""


def _fake_perf_analyzer(tmp_path: Path, stdout: str, stderr: str = "", status: int = 0) -> Path:
    """An executable that records its arguments and prints a canned perf_analyzer report."""
    (tmp_path / "stdout.txt").write_text(stdout)
    (tmp_path / "stderr.txt").write_text(stderr)
    script = tmp_path / "perf_analyzer"
    script.write_text(f'#!/bin/sh\necho "$@" > "{tmp_path}/argv.txt"\ncat "{tmp_path}/stdout.txt"\n'
                      f'cat "{tmp_path}/stderr.txt" >&2\nexit {status}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_report_is_read_back_in_the_matrix_units() -> None:
    cell = perf_analyzer_load.parse_report(REPORT)
    assert cell["infer_per_sec"] == 4035.5 and cell["completed"] == 24210
    # microseconds in the report, milliseconds in the cell, as wrk_load and load.py give them
    assert cell["p50_ms"] == pytest.approx(1.903) and cell["p99_ms"] == pytest.approx(3.645)
    assert cell["p90_ms"] == pytest.approx(2.488) and cell["mean_ms"] == pytest.approx(1.98)
    with pytest.raises(ValueError, match="no client section"):
        perf_analyzer_load.parse_report(UNSTABLE)
    with pytest.raises(ValueError, match="no throughput"):
        perf_analyzer_load.parse_report(REPORT.replace("Throughput: 4035.5", "Throughput: n/a"))


def test_cell_from_a_run_and_the_command_it_gives(tmp_path: Path) -> None:
    binary = _fake_perf_analyzer(tmp_path, REPORT)
    cell = perf_analyzer_load.run_perf_analyzer(str(binary), "pa-grpc", 8001, "add_sub_batched", 8, 2.0)
    assert cell["client"] == "perf_analyzer" and "error" not in cell
    assert cell["infer_per_sec"] == 4035.5 and cell["p99_ms"] == pytest.approx(3.645)
    argv = (tmp_path / "argv.txt").read_text().split()
    for flag, value in (("-m", "add_sub_batched"), ("-u", "127.0.0.1:8001"), ("-i", "grpc"),
                        ("--concurrency-range", "8"), ("--measurement-interval", "2000"),
                        ("--max-trials", str(perf_analyzer_load.DEFAULT_MAX_TRIALS))):
        assert argv[argv.index(flag) + 1] == value
    assert perf_analyzer_load.command("pa", "pa-http", 8000, "m", 1, 1, core="1")[:4] == ["taskset", "-c", "1", "pa"]


def test_failed_runs_become_error_cells(tmp_path: Path) -> None:
    unstable = _fake_perf_analyzer(
        tmp_path, UNSTABLE, "Failed to obtain stable measurement within 6 measurement windows for concurrency 1. "
        "Please try to increase the --measurement-interval.\nFailed to obtain stable measurement.\n", status=2)
    cell = perf_analyzer_load.run_perf_analyzer(str(unstable), "pa-http", 8000, "add_sub", 1, 0.5)
    assert "infer_per_sec" not in cell and cell["client"] == "perf_analyzer"
    assert "exited 2" in cell["error"] and "stable measurement" in cell["error"]
    silent = _fake_perf_analyzer(tmp_path, UNSTABLE)  # status 0 but no figures
    assert "no client section" in perf_analyzer_load.run_perf_analyzer(str(silent), "pa-http", 8000, "m", 1, 0.5)["error"]
    missing = perf_analyzer_load.run_perf_analyzer(str(tmp_path / "absent"), "pa-http", 8000, "m", 1, 0.5)
    assert "did not start" in missing["error"]


def test_timeout_ends_the_binary_behind_a_wrapper(tmp_path: Path) -> None:
    # The wheel's `perf_analyzer` is a wrapper that runs the binary as its child: a timeout must end the
    # child too, not leave it loading the server orphaned.
    wrapper = tmp_path / "wrapper"
    wrapper.write_text(f'#!/bin/sh\nsh -c \'echo $$ > "{tmp_path}/child.pid"; exec sleep 60\'\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        perf_analyzer_load._run([str(wrapper)], timeout=1.0)
    assert time.monotonic() - started < 30  # not the child's 60 s
    child = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{child}").exists() and \
            Path(f"/proc/{child}/stat").read_text().split()[2] != "Z":
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists() or Path(f"/proc/{child}/stat").read_text().split()[2] == "Z"


def test_matrix_finds_or_leaves_out_perf_analyzer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    absent = str(tmp_path / "no_perf_analyzer")
    with pytest.raises(SystemExit):
        matrix_bench.parse_args(["--servers", "naiad", "--protocols", "pa-grpc", "--perf-analyzer", absent])
    assert "pip install perf-analyzer" in capsys.readouterr().err
    # not asked for by name: the default protocols go on without the perf_analyzer ones
    args = matrix_bench.parse_args(["--servers", "naiad", "--perf-analyzer", absent])
    assert args.protocols == ["http-json", "http-binary", "grpc"]
    binary = _fake_perf_analyzer(tmp_path, REPORT)
    args = matrix_bench.parse_args(["--servers", "naiad", "--perf-analyzer", str(binary)])
    assert args.protocols == list(matrix_bench.PROTOCOLS) and args.perf_analyzer == str(binary)
    # MLServer and KServe serve no model configuration: n/a, with the reason under the tables
    assert "model configuration" in matrix_bench.UNSUPPORTED[("kserve", "pa-grpc")]
    report = {"machine": "m", "command": "c", "started": ["naiad", "mlserver"], "check_failures": {},
              "config": {"servers": ["naiad", "mlserver"], "models": ["mlp"], "variants": ["plain"],
                         "protocols": ["pa-http"], "concurrency": [1], "rounds": 1, "duration": 5.0},
              "cells": {"naiad|mlp|plain|pa-http|1": [{"infer_per_sec": 900.0, "p50_ms": 1.0, "p99_ms": 2.0}]}}
    text = matrix_bench.tables(report, "median")
    assert "| 900 (1.00/2.00) | n/a | - |" in text
    assert "- MLServer pa-http: perf_analyzer reads the model configuration" in text


def _installed_perf_analyzer() -> str | None:
    return perf_analyzer_load.find_binary(os.environ.get("PERF_ANALYZER", "perf_analyzer"))


@pytest.mark.skipif(_installed_perf_analyzer() is None,
                    reason="perf_analyzer is not installed (pip install perf-analyzer, glibc >= 2.38; "
                           "or name the binary in $PERF_ANALYZER)")
def test_real_cell_against_naiad(tmp_path: Path) -> None:
    matrix = matrix_models.build(tmp_path, ["add_sub"], ["batched"])
    args = argparse.Namespace(perf_analyzer=_installed_perf_analyzer(), duration=1.0, warmup=0.0, client_core=None,
                              perf_analyzer_stability=50.0, perf_analyzer_max_trials=6, models=["add_sub"],
                              variants=["batched"], protocols=["pa-http"], concurrency=[2], rounds=1)
    report: dict = {"machine": "m", "command": "c", "cells": {}, "check_failures": {},
                    "config": {**{k: getattr(args, k) for k in ("models", "variants", "protocols", "concurrency",
                                                                "rounds", "duration")}, "servers": ["naiad"]}}
    with start_server(matrix.naiad_repo) as naiad:
        server = procs.RunningServer("naiad", naiad.process, naiad.http_port, naiad.grpc_port, tmp_path / "log")
        matrix_bench.run_matrix({"naiad": server}, matrix, args, report)
        [cell] = report["cells"]["naiad|add_sub|batched|pa-http|2"]
        assert "error" not in cell, cell["error"]
        assert cell["client"] == "perf_analyzer" and cell["infer_per_sec"] > 0 and cell["completed"] > 0
        assert 0 < cell["p50_ms"] <= cell["p99_ms"]
        # CPU per request from the requests the server counted over perf_analyzer's whole run
        # (at least the three windows it reports)
        assert cell["served_requests"] >= 0.9 * cell["completed"] and cell["server_cpu_us_per_req"] > 0
        assert cell["formed_batch"] >= 1.0
        load.check_once("http-binary", "127.0.0.1", naiad.http_port, matrix.workloads["add_sub_batched"])
    row = next(line for line in matrix_bench.tables(report, "median").splitlines() if "| pa-http |" in line)
    assert row.startswith("| add_sub | batched | pa-http | 2 | ") and "(" in row
