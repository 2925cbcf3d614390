"""Owns the load-generating processes: spawns them, splits a load level over them, collects their records."""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import replace
from typing import Any

import numpy as np

from naiad.tools.perf.measurement import empty_records
from naiad.tools.perf.worker import WorkerSpec, worker_main

START_TIMEOUT_S = 60.0
ANSWER_TIMEOUT_S = 30.0


class LoadError(RuntimeError):
    """A request failed, or a load process stopped answering."""


def split_level(level: dict[str, Any], processes: int) -> list[dict[str, Any] | None]:
    """One sub-level per process (None = idle): concurrency shared out, rate divided with phase offsets."""
    if level["mode"] == "concurrency":
        total = int(level["concurrency"])
        shares = [total // processes + (1 if i < total % processes else 0) for i in range(processes)]
        return [dict(level, concurrency=share) if share else None for share in shares]
    if level.get("intervals_ns"):
        return [level] + [None] * (processes - 1)
    rate = float(level["rate"])
    return [dict(level, rate=rate / processes, offset_ns=int(i * 1e9 / rate)) for i in range(processes)]


class LoadManager:
    def __init__(self, spec: WorkerSpec, processes: int) -> None:
        context = mp.get_context("spawn")
        self.pipes: list[Any] = []
        self.processes: list[Any] = []
        self.active: list[int] = []
        for index in range(max(1, processes)):
            parent, child = context.Pipe()
            process = context.Process(target=worker_main, args=(child, replace(spec, seed=spec.seed + index, process_index=index,
                                                                         process_count=max(1, processes))),
                                      name=f"naiad-perf-load-{index}", daemon=True)
            process.start()
            child.close()
            self.pipes.append(parent)
            self.processes.append(process)
        try:
            for index in range(len(self.pipes)):
                self._receive(index, "ready", START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    def _receive(self, index: int, kind: str, timeout: float) -> tuple[np.ndarray, int, str]:
        pipe = self.pipes[index]
        if not pipe.poll(timeout):
            raise LoadError(f"load process {index} did not answer within {timeout:.0f} s")
        try:
            message = pipe.recv()
        except (EOFError, OSError):
            raise LoadError(f"load process {index} ended unexpectedly") from None
        if message[0] != kind:
            raise LoadError(f"load process {index} answered {message[0]!r}, expected {kind!r}")
        _, records, errors, first_error = message
        return (records if records is not None else empty_records()), errors, first_error

    def start(self, level: dict[str, Any]) -> None:
        self.active = []
        for index, part in enumerate(split_level(level, len(self.pipes))):
            if part is not None:
                self.pipes[index].send(("start", part))
                self.active.append(index)

    def _collect(self, command: tuple[Any, ...], kind: str, timeout: float) -> tuple[np.ndarray, int, str]:
        for index in self.active:
            self.pipes[index].send(command)
        arrays, errors, first = [], 0, ""
        for index in self.active:
            records, count, message = self._receive(index, kind, timeout)
            arrays.append(records)
            errors += count
            first = first or message
        return (np.concatenate(arrays) if arrays else empty_records()), errors, first

    def flush(self) -> tuple[np.ndarray, int, str]:
        """Records of requests completed since the last flush, the error count and the first error."""
        return self._collect(("flush",), "records", ANSWER_TIMEOUT_S)

    def stop(self, drain_s: float) -> tuple[np.ndarray, int, str]:
        """Stop sending; in-flight requests get `drain_s` seconds to complete."""
        result = self._collect(("stop", drain_s), "stopped", drain_s + ANSWER_TIMEOUT_S)
        self.active = []
        return result

    def close(self) -> None:
        for pipe in self.pipes:
            try:
                pipe.send(("quit",))
            except (OSError, ValueError):
                pass
        for process in self.processes:
            process.join(5.0)
            if process.is_alive():
                process.terminate()
                process.join(5.0)
        for pipe in self.pipes:
            pipe.close()
        self.pipes, self.processes = [], []
