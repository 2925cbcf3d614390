"""Starts `python -m naiad serve` on free loopback ports for one variant, measures its memory, stops it."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

READY_PREFIX = "NAIAD_READY "
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4


class ServerStartError(RuntimeError):
    """The server did not come up (its output is in the message)."""


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def process_tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants (Linux /proc), in MB; 0 where unavailable."""
    if not os.path.isdir("/proc"):
        return 0.0
    tree = _children()
    total_pages, pending, seen = 0, [pid], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            with open(f"/proc/{current}/statm") as handle:
                total_pages += int(handle.read().split()[1])
        except (OSError, IndexError, ValueError):
            pass
        pending.extend(tree.get(current, []))
    return total_pages * PAGE_KB / 1024.0


class ManagedServer:
    """One `naiad serve` in EXPLICIT mode with the given models loaded at start."""

    def __init__(self, repository: Path, load: list[str], extra_args: list[str] | None = None,
                 timeout_s: float = 120.0) -> None:
        command = [
            sys.executable, "-m", "naiad", "serve", "--model-repository", str(repository),
            "--model-control-mode", "explicit", *[f"--load-model={m}" for m in load],
            "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
            "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", *(extra_args or []),
        ]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.output: list[str] = []
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                if len(self.output) < 2000:
                    self.output.append(line)
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        self.http_port = self.grpc_port = 0
        while True:
            try:
                line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.stop()
                raise ServerStartError("naiad serve did not start:\n" + "".join(self.output[-40:]))
            if line.startswith(READY_PREFIX):
                ports = json.loads(line[len(READY_PREFIX):])
                self.http_port, self.grpc_port = ports["http_port"], ports["grpc_port"]
                self._require_ready(load)
                return

    def _require_ready(self, models: list[str]) -> None:
        from naiad.tools.v2client import HttpControl

        control = HttpControl(self.url("http"))
        try:
            missing = [m for m in models if not control.model_ready(m)]
        finally:
            control.close()
        if missing:
            self.stop()
            raise ServerStartError(f"model(s) {', '.join(missing)} did not load:\n" + "".join(self.output[-40:]))

    def url(self, protocol: str) -> str:
        return f"127.0.0.1:{self.grpc_port if protocol == 'grpc' else self.http_port}"

    def memory_mb(self) -> float:
        return process_tree_rss_mb(self.process.pid)

    def log_tail(self, lines: int = 20) -> str:
        return "".join(self.output[-lines:])

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> ManagedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
