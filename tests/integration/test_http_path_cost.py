"""benchmarks/http_path_cost.py: closed-loop clients through the real HTTP connection and app answer
every request (a non-200 answer stops the run) and the CPU per request is reported per cell."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import http_path_cost  # noqa: E402  (benchmarks/ is not a package)


def test_every_cell_is_answered_and_measured(capsys: pytest.CaptureFixture[str]) -> None:
    assert http_path_cost.main(["--models", "add_sub_onnx", "--variants", "plain", "batched", "-c", "1", "3",
                                "--requests", "150"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(http_path_cost.RESULT_TAG)]
    results = [json.loads(line[len(http_path_cost.RESULT_TAG):]) for line in lines]
    assert [(r["model"], r["clients"]) for r in results] == [
        ("add_sub_onnx", 1), ("add_sub_onnx", 3), ("add_sub_onnx_batched", 1), ("add_sub_onnx_batched", 3)]
    for r in results:
        assert r["requests"] == 150 and 0 < r["loop_cpu_us"] and 0 < r["cpu_us"] and 0 < r["wall_us"], r


def test_a_refused_request_stops_the_run() -> None:
    loop_answers = []
    transport = http_path_cost._ClosedLoopTransport(None, b"", lambda: loop_answers.append(1))  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="unexpected answer: b'HTTP/1.1 400 "):
        transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
    assert loop_answers == []
