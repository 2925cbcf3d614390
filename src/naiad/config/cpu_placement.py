"""Which CPUs Naiad's frontend workers run on: one CPU is left to the core process.

Left to the kernel, a frontend worker and the core process (each waking the other) tend to be run on one
CPU while another one idles, and the core process's CPU per request bounds the whole server. So with
`--frontend-processes N` on two or more usable CPUs the frontend workers keep off the lowest one, which
the core process then mostly has to itself; the core process itself stays free on every CPU (its backend
threads included), and so do Python-model and process-instance workers: a model's worker runs while the
core waits for its answer, and kept off the core's CPU it took the frontend worker's (Python add_sub
batched over HTTP at c=32, one worker per port on two CPUs: 16.7-18.1k req/s with the model's worker
free, 14.6-15.3k with it beside the frontend worker). The list travels in the environment variable
below, so that it is set once, is inherited as it is, and a user can choose it: `naiad serve` sets it
unless it is set already, and an empty value leaves the frontend workers wherever the kernel puts them.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping

log = logging.getLogger("naiad.config.cpu_placement")

WORKER_CPUS_VARIABLE = "NAIAD_WORKER_CPUS"

# `--frontend-processes auto` (the default): none below this many usable CPUs (on two, one process was
# faster in every cell measured with the clients on the same CPUs: benchmarks/README.md), else half the
# usable CPUs, at most AUTO_FRONTEND_CAP, per port.
AUTO_FRONTEND_MIN_CPUS = 4
AUTO_FRONTEND_CAP = 8


def auto_frontend_processes(usable_cpus: int) -> int:
    """The frontend worker processes per port `--frontend-processes auto` gives on `usable_cpus` CPUs."""
    if usable_cpus < AUTO_FRONTEND_MIN_CPUS:
        return 0
    return min(usable_cpus // 2, AUTO_FRONTEND_CAP)


def usable_cpu_count() -> int:
    """The CPUs this process may run on (its affinity on Linux, as taskset and container limits set it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def frontend_worker_cpus(usable: set[int], frontend_processes: int) -> set[int] | None:
    """The CPUs for the frontend workers, or None to leave them anywhere (no frontend workers, or one CPU)."""
    if frontend_processes < 1 or len(usable) < 2:
        return None
    return usable - {min(usable)}


def parse_cpus(text: str) -> set[int]:
    """CPUs written as taskset does: "1,3", "2-5", "0,4-7"; raises ValueError."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        cpus.update(range(int(first), int(last) + 1) if dash else (int(first),))
    return cpus


def reserve_core_cpu(environ: MutableMapping[str, str], frontend_processes: int) -> str | None:
    """Set the frontend workers' CPUs in `environ` (the server's own environment, at start) unless it names
    them already; returns the list they get, None when they are left anywhere."""
    if WORKER_CPUS_VARIABLE not in environ and sys.platform.startswith("linux"):
        cpus = frontend_worker_cpus(os.sched_getaffinity(0), frontend_processes)
        if cpus is not None:
            environ[WORKER_CPUS_VARIABLE] = ",".join(map(str, sorted(cpus)))
    return environ.get(WORKER_CPUS_VARIABLE) or None


def place_frontend_worker(pid: int) -> None:
    """Run a just-started frontend worker on the listed CPUs, if the server has some (before it starts
    threads: they inherit its CPUs)."""
    text = os.environ.get(WORKER_CPUS_VARIABLE)
    if not text or not sys.platform.startswith("linux"):
        return
    try:
        os.sched_setaffinity(pid, parse_cpus(text))
    except (OSError, ValueError) as exc:  # a CPU not usable here, a child gone already, a typo
        log.warning("could not run process %d on CPUs %r (%s): %s", pid, text, WORKER_CPUS_VARIABLE, exc)
