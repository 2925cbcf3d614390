"""The worker process main: starts the host named by the server (a Python model or a backend's instance), serves it."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import io
import os
import sys
from typing import TYPE_CHECKING, Any

from naiad.runtime.process.framing import BlockingChannel
from naiad.runtime.process.worker_runtime import exit_worker

if TYPE_CHECKING:
    from naiad.runtime.process.host import WorkerHost


def _keep_freed_buffers() -> None:
    """Reuse freed tensor-sized buffers (as the server does, see naiad.runtime.memory.keep_freed_buffers):
    glibc would otherwise unmap each one and page-fault a fresh one in for the next request."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 64 << 20)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass


def _yield_to_the_server() -> None:
    """Run as SCHED_BATCH: a worker woken by a request does not preempt the server mid-loop.

    When the server and its workers share a core, each request sent would otherwise switch to the
    worker at once and back on its answer; as a batch task the worker runs when the server waits,
    and takes every request queued by then in one go (add_sub over HTTP at c=8 on one core: ~7% more
    requests/s, gRPC ~12%). On an idle core it runs at once as before; fairness and nice are unchanged.
    """
    setter = getattr(os, "sched_setscheduler", None)
    if setter is not None and hasattr(os, "SCHED_BATCH"):
        try:
            setter(0, os.SCHED_BATCH, os.sched_param(0))
        except OSError:  # not permitted in this sandbox: keep the default policy
            pass


def main(argv: list[Any]) -> None:
    """Entry point (see launcher.BOOTSTRAP): argv = [descriptor to read from, descriptor to write to]."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            with contextlib.suppress(ValueError):
                stream.reconfigure(line_buffering=True)
    _keep_freed_buffers()
    _yield_to_the_server()
    channel = BlockingChannel(int(argv[0]), int(argv[1]))
    message = channel.receive()
    if message[0] in ("auto", "auto_backend"):  # a throw-away worker: auto-complete one config, then end
        if message[0] == "auto":
            from naiad.runtime.process.python_host import auto_complete
        else:
            from naiad.runtime.process.backend_host import auto_complete
        auto_complete(channel, message)
        sys.stdout.flush()
        os._exit(0)
    init = message[1]
    # Imported here: a worker loads only what its host needs (a Python model never imports a backend).
    if init.get("host") == "backend":
        from naiad.runtime.process.backend_host import BackendHost

        worker: WorkerHost = BackendHost(channel, init)
    else:
        from naiad.runtime.process.python_host import PythonModelHost

        worker = PythonModelHost(channel, init)
    if not worker.start():
        exit_worker(worker.runtime, 1)
    worker.serve()
    exit_worker(worker.runtime, 0)
