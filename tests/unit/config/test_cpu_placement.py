"""Which CPUs the server's frontend workers run on (naiad/config/cpu_placement.py)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from naiad.config import cpu_placement
from naiad.config.cpu_placement import (
    WORKER_CPUS_VARIABLE,
    frontend_worker_cpus,
    parse_cpus,
    place_frontend_worker,
    reserve_core_cpu,
)

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="CPU affinity is Linux's")


def test_frontend_workers_keep_off_the_lowest_cpu_only_when_there_are_some_on_two_or_more_cpus() -> None:
    assert frontend_worker_cpus({0, 1}, 1) == {1}
    assert frontend_worker_cpus({2, 3, 5}, 4) == {3, 5}
    assert frontend_worker_cpus({0, 1}, 0) is None  # everything in one process: nothing to keep apart
    assert frontend_worker_cpus({3}, 2) is None  # one CPU: nowhere else to go


def test_cpu_lists_are_read_as_taskset_writes_them() -> None:
    assert parse_cpus("1") == {1}
    assert parse_cpus("0,4-6, 9") == {0, 4, 5, 6, 9}
    with pytest.raises(ValueError):
        parse_cpus("one")


@linux_only
def test_the_server_sets_the_list_once_and_keeps_a_users(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_placement.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    environ: dict[str, str] = {}
    assert reserve_core_cpu(environ, 1) == "1,2,3"
    assert environ == {WORKER_CPUS_VARIABLE: "1,2,3"}
    assert reserve_core_cpu({WORKER_CPUS_VARIABLE: "3"}, 1) == "3"  # the user's choice stands
    assert reserve_core_cpu({WORKER_CPUS_VARIABLE: ""}, 1) is None  # empty: children anywhere
    nothing: dict[str, str] = {}
    assert reserve_core_cpu(nothing, 0) is None and nothing == {}


@linux_only
def test_a_frontend_worker_is_placed_on_the_listed_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    target = min(os.sched_getaffinity(0))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        monkeypatch.setenv(WORKER_CPUS_VARIABLE, str(target))
        place_frontend_worker(child.pid)
        assert os.sched_getaffinity(child.pid) == {target}
    finally:
        child.kill()
        child.wait()


@linux_only
def test_a_list_that_cannot_be_applied_is_a_warning_not_a_failure(monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        before = os.sched_getaffinity(child.pid)
        for bad in ("4096", "x"):  # a CPU this machine does not have; not a list
            monkeypatch.setenv(WORKER_CPUS_VARIABLE, bad)
            with caplog.at_level(logging.WARNING, logger="naiad.config.cpu_placement"):
                place_frontend_worker(child.pid)
            assert os.sched_getaffinity(child.pid) == before
        assert sum("could not run process" in record.getMessage() for record in caplog.records) == 2
    finally:
        child.kill()
        child.wait()


def test_without_a_list_a_frontend_worker_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WORKER_CPUS_VARIABLE, raising=False)
    place_frontend_worker(-1)  # never looked at: no list, no call
