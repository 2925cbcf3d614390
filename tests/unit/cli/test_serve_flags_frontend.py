"""`naiad serve --frontend-processes N|auto` and `--frontend-core-connections K`: how many worker processes
serve each port, and how many connections of each port the core keeps beside them."""

from __future__ import annotations

import os

import pytest

from naiad.cli import flags
from naiad.cli.flags import MAX_CORE_CONNECTIONS, config_from_args
from naiad.cli.main import build_parser
from naiad.config.cpu_placement import AUTO_FRONTEND_CAP, auto_frontend_processes, usable_cpu_count
from naiad.config.server_config import ServerConfig


def _config(*flags: str) -> ServerConfig:
    return config_from_args(build_parser().parse_args(["serve", "--model-repository", "/models", *flags]))


def test_the_core_keeps_eight_connections_by_default_and_zero_hands_every_one_over() -> None:
    assert _config().frontend_core_connections == 8
    assert _config("--frontend-processes", "2", "--frontend-core-connections", "0").frontend_core_connections == 0
    assert _config(f"--frontend-core-connections={MAX_CORE_CONNECTIONS}").frontend_core_connections == MAX_CORE_CONNECTIONS


@pytest.mark.parametrize("value", ["-1", str(MAX_CORE_CONNECTIONS + 1), "few", "1.5"])
def test_a_bad_count_is_refused_with_the_flag_named(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _config(f"--frontend-core-connections={value}")
    assert "--frontend-core-connections" in capsys.readouterr().err


def test_auto_gives_none_below_four_cpus_then_half_of_them_up_to_the_cap() -> None:
    assert [auto_frontend_processes(n) for n in (1, 2, 3, 4, 5, 8, 16, 17, 64)] == [0, 0, 0, 2, 2, 4, 8, 8, 8]
    assert AUTO_FRONTEND_CAP == 8


@pytest.mark.parametrize(("cpus", "workers"), [(1, 0), (2, 0), (4, 2), (32, 8)])
def test_the_default_is_auto_resolved_from_the_usable_cpus(cpus: int, workers: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flags, "usable_cpu_count", lambda: cpus)
    assert _config().frontend_processes == workers
    assert _config("--frontend-processes", "auto").frontend_processes == workers
    assert _config("--frontend-processes", "3").frontend_processes == 3  # a number is taken as it is
    assert _config("--frontend-processes", "0").frontend_processes == 0


def test_usable_cpus_are_this_process_affinity() -> None:
    assert usable_cpu_count() == len(os.sched_getaffinity(0))
