"""benchmarks/matrix_bench.py: its models load and answer exactly on a real Naiad, wrk's figures are read
back with errors counted, the tables compute the ratios, and an interrupted run stops its servers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.support.servers import RunningServer, start_server

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import load  # noqa: E402  (benchmarks/ is not a package)
import matrix_bench  # noqa: E402
import matrix_models  # noqa: E402
import wrk_load  # noqa: E402

pytest.importorskip("xgboost")


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> matrix_models.Matrix:
    return matrix_models.build(tmp_path_factory.mktemp("matrix"), list(matrix_models.MODELS),
                               list(matrix_models.VARIANTS))


@pytest.fixture(scope="module")
def naiad(matrix: matrix_models.Matrix) -> Iterator[RunningServer]:
    with start_server(matrix.naiad_repo) as server:
        yield server


def test_every_matrix_model_answers_exactly_on_naiad(matrix: matrix_models.Matrix, naiad: RunningServer) -> None:
    names = matrix.names("naiad")
    assert len(names) == 8  # 4 models x plain/batched
    for name in names:
        batched = "max_queue_delay_microseconds: 500" in (matrix.naiad_repo / name / "config.pbtxt").read_text()
        assert batched == name.endswith("_batched")
        for protocol in load.PROTOCOLS:
            port = naiad.grpc_port if protocol == "grpc" else naiad.http_port
            load.check_once(protocol, "127.0.0.1", port, matrix.workloads[name])
    # Triton gets a Python model for each model it serves; the peers are told which file to serve.
    for name in matrix.names("triton"):
        assert (matrix.triton_repo / name / "1" / "model.py").is_file()
    assert set(matrix.kserve) == {"add_sub", "mlp_classifier", "xgboost_100"}  # no batcher: plain only
    assert matrix.mlserver["xgboost_100_batched"]["max_batch_time"] == 0.0005


def test_tree_check_rejects_a_wrong_probability(matrix: matrix_models.Matrix) -> None:
    workload = matrix.workloads["xgboost_100"]
    with pytest.raises(AssertionError):
        workload.check({"output__0": np.array([[0.123456]], dtype=np.float32)})


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (apt-get install wrk)")
def test_wrk_cell_reads_back_percentiles_and_counts_failures(naiad: RunningServer) -> None:
    cell = wrk_load.run_wrk(naiad.http_port, "add_sub", 2, duration=1, warmup=0)
    assert cell["client"] == "wrk" and cell["completed"] > 0 and cell["errors"] == 0 and "error" not in cell
    assert 0 < cell["p50_ms"] <= cell["p99_ms"] <= cell["p999_ms"]
    # An unknown model: every answer is a 4xx, counted as failures, none as throughput.
    missing = wrk_load.run_wrk(naiad.http_port, "add_sub_missing", 1, duration=1, warmup=0)
    assert missing["completed"] == 0 and missing["infer_per_sec"] == 0
    assert missing["wrk"]["status_errors"] > 0 and "non-2xx" in missing["error"]
    load.check_once("http-json", "127.0.0.1", naiad.http_port, load.make_workload("add_sub"))  # still serving


def _cell(rate: float, p99: float) -> dict:
    return {"infer_per_sec": rate, "p50_ms": p99 / 4, "p99_ms": p99}


def test_tables_give_naiad_over_peer_ratios() -> None:
    report = {"machine": "m", "command": "c", "started": ["naiad", "triton", "mlserver"], "check_failures": {},
              "config": {"servers": ["naiad", "triton", "mlserver"], "models": ["mlp"], "variants": ["plain"],
                         "protocols": ["http-binary", "grpc"], "concurrency": [8], "rounds": 3, "duration": 5.0},
              "cells": {"naiad|mlp|plain|grpc|8": [_cell(900, 2), _cell(1000, 2), _cell(100, 9)],
                        "triton|mlp|plain|grpc|8": [_cell(500, 4)],
                        "mlserver|mlp|plain|grpc|8": [_cell(250, 8)],
                        "naiad|mlp|plain|http-binary|8": [_cell(400, 3)],
                        "triton|mlp|plain|http-binary|8": [_cell(800, 1)]}}
    text = matrix_bench.tables(report, "median")
    grpc_row = next(line for line in text.splitlines() if "| grpc |" in line)
    # the median round (900/s) over Triton's 500/s and MLServer's 250/s; p99 2 ms over 4 ms
    assert grpc_row.endswith("| 1.80 | 3.60 | 0.50 |")
    binary_row = next(line for line in text.splitlines() if "| http-binary |" in line)
    assert "| n/a |" in binary_row and "| 0.50 |" in binary_row
    assert "Naiad/Triton >= 1.00 in 1 of 2 cells." in text
    assert "| 1,000 (0.50/2.00) |" in matrix_bench.tables(report, "best")
    # A cell a hair behind shows as 1.00 but is not counted ahead
    report["cells"]["naiad|mlp|plain|http-binary|8"] = [_cell(797, 3)]
    text = matrix_bench.tables(report, "median")
    assert "| 1.00 |" in next(line for line in text.splitlines() if "| http-binary |" in line)
    assert "Naiad/Triton >= 1.00 in 1 of 2 cells." in text


def test_sigterm_stops_every_server(tmp_path: Path) -> None:
    if shutil.which("taskset") is None:
        pytest.skip("taskset is needed")
    out = tmp_path / "out.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "matrix_bench.py"), "--servers", "naiad", "--models", "add_sub",
           "--variants", "plain", "--protocols", "http-binary", "--concurrency", "1", "--duration", "60",
           "--warmup", "0.5", "--rounds", "1", "--skip-generator-ceiling", "--output", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    pid = None
    try:
        deadline = time.monotonic() + 120
        assert proc.stderr is not None
        for line in proc.stderr:
            if "naiad ready: pid " in line:
                pid = int(line.split("pid ", 1)[1].split(",", 1)[0])
                break
            assert time.monotonic() < deadline, "naiad did not start"
        assert pid is not None, "the harness ended before naiad started"
        os.kill(pid, 0)  # running
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    report = json.loads(out.read_text())
    assert report["complete"] is False and report["started"] == ["naiad"]


def test_the_frontend_options_reach_naiad_serve_as_its_flags() -> None:
    naiad_only = ["--servers", "naiad", "--protocols", "http-json"]
    assert matrix_bench.naiad_flags(matrix_bench.parse_args(naiad_only)) == ()
    args = matrix_bench.parse_args([*naiad_only, "--naiad-frontend-processes", "1", "--naiad-frontend-core-connections", "0"])
    assert matrix_bench.naiad_flags(args) == ("--frontend-processes", "1", "--frontend-core-connections", "0")
