"""benchmarks/attack_bench.py: one short attack against a real Naiad is measured (normal calls of both
protocols, RSS, the attacker's connections), and the verdict names each "Done when" point that fails."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import attack_bench  # noqa: E402  (benchmarks/ is not a package)
from servers import RunningServer  # noqa: E402


@pytest.fixture(scope="module")
def naiad(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    work = tmp_path_factory.mktemp("attack_bench")
    attack_bench.write_repo(work / "repo")
    server = attack_bench.starter("naiad", work, work / "repo", "0")()
    yield server
    server.stop()


def test_a_short_rapid_reset_is_measured(naiad: RunningServer) -> None:
    clients = attack_bench.Clients(naiad)
    try:
        idle = attack_bench.measure(naiad, clients, "idle", 1.0, 0.5)
        cell = attack_bench.measure(naiad, clients, "rapid_reset", 1.5, 1.0)
    finally:
        clients.close()
    assert idle["attacker"] == {} and attack_bench.verdict(idle, None) == "PASS"
    assert cell["alive"] and cell["attacker"]["connections"] >= 1 and cell["attacker"]["batches"] >= 1
    for protocol in ("grpc", "http"):
        assert cell[protocol]["calls"] >= 1 and cell[protocol]["p50_ms"] > 0
        assert cell[protocol]["failed_during"] == cell[protocol]["failed_after"] == 0
    assert 0 < cell["rss_start_mib"] <= cell["rss_peak_mib"]
    assert cell["rss_samples"][0] == (0.0, cell["rss_start_mib"])


def _cell(**changes: object) -> dict:
    calls = {"calls": 100, "p50_ms": 2.0, "p99_ms": 9.0, "failed_during": 0, "failed_after": 0, "stuck": False}
    cell = {"attack": "ping_flood", "alive": True, "rss_start_mib": 100.0, "rss_peak_mib": 150.0,
            "rss_end_mib": 110.0, "grpc": dict(calls), "http": dict(calls)}
    cell.update(changes)
    return cell


def test_the_verdict_names_each_failed_point() -> None:
    idle = _cell(attack="idle")
    assert attack_bench.verdict(_cell(), idle) == "PASS"
    slow = _cell(grpc={**idle["grpc"], "p50_ms": 6.5})
    assert attack_bench.verdict(slow, idle) == "FAIL: grpc median"
    none_served = _cell(http={**idle["http"], "calls": 0, "p50_ms": None})
    assert attack_bench.verdict(none_served, idle) == "FAIL: http failures, http median"
    assert attack_bench.verdict(_cell(rss_peak_mib=201.0), idle) == "FAIL: RSS growth"
    assert attack_bench.verdict(_cell(rss_end_mib=126.0), idle) == "FAIL: RSS not back"
    assert attack_bench.verdict(_cell(alive=False), idle).startswith("FAIL: died")
    stuck = _cell(grpc={**idle["grpc"], "stuck": True})
    assert attack_bench.verdict(stuck, idle) == "FAIL: grpc failures"
