"""A process's descendants (the server and its worker processes), their resident memory and CPU time."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from tests.support.waiting import wait_until


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`, found by parent id (children spawned by any thread count)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        for child in parents.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def alive(pid: int) -> bool:
    """Whether the process runs: a zombie (ended, not yet reaped) does not."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def rss(pid: int) -> int:
    """Resident set size of one process in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def tree_rss(pid: int) -> tuple[int, int]:
    """(RSS of the process itself, RSS of all its descendants), in bytes."""
    return rss(pid), sum(rss(child) for child in descendants(pid))


def cpu_ticks(pid: int) -> int:
    """user + system CPU time of a process, in clock ticks (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def maps_library(pid: int, library: str) -> bool:
    """Whether the process has a file whose path contains `library` (a shared library) mapped."""
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def kill_while_executing(worker: int, call: Callable[[], object], busy_ticks: int = 20) -> BaseException | None:
    """Run `call` on a thread, SIGKILL `worker` once it has spent `busy_ticks` of CPU on it, and
    return what the call raised (None if it returned)."""
    outcome: list[BaseException | None] = [None]

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed back to the test
            outcome[0] = exc

    caller = threading.Thread(target=run)
    before = cpu_ticks(worker)
    caller.start()
    wait_until(lambda: cpu_ticks(worker) >= before + busy_ticks, "the worker executing the long request", timeout=120)
    os.kill(worker, signal.SIGKILL)
    caller.join(60)
    assert not caller.is_alive(), "the call did not end after its worker was killed"
    return outcome[0]
