"""A port's frontend workers start at their first need (K >= 1): once, and the server keeps serving if they fail to."""

from __future__ import annotations

import asyncio
import logging
import socket
from types import SimpleNamespace
from typing import Any

import pytest

from naiad.config.server_config import ServerConfig
from naiad.frontends.handoff import ConnectionServer
from naiad.frontends.sockets import bind_socket
from naiad.frontends.workers import pool as pool_module
from naiad.frontends.workers.pool import WorkerPool, WorkerProcess


class _Process:
    """A worker process that runs until it is signalled."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._ended = asyncio.get_running_loop().create_future()

    async def wait(self) -> int:
        return await asyncio.shield(self._ended)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            self.returncode = -sig
            self._ended.set_result(self.returncode)


class _Pool(WorkerPool):
    label = "HTTP/REST"
    protocol = "http"

    def _bind(self) -> int:
        self._sockets = [bind_socket("127.0.0.1", 0)]
        return int(self._sockets[0].getsockname()[1])

    async def _serve_here(self) -> ConnectionServer:
        return ConnectionServer(asyncio.Protocol, None, lambda: 0)

    async def _stop_here(self) -> None:
        pass

    def _dispatcher(self, on_ready: Any) -> Any:
        return None


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """WorkerProcess.spawn without a process: a stand-in per call, its index recorded; worker 1 never gets ready."""
    calls: list[int] = []

    async def spawn(self: WorkerProcess) -> None:
        calls.append(self.index)
        self.process = _Process(1000 + self.index)  # type: ignore[assignment]
        self.ready = asyncio.get_running_loop().create_future()
        self.outlet, _ = socket.socketpair()

    async def wait_ready(self: WorkerProcess, timeout: float) -> None:
        if self.index == 1:
            raise OSError("frontend worker 1 did not start within 0 s")
        assert self.ready is not None
        self.ready.set_result(self.process.pid if self.process else 0)

    monkeypatch.setattr(WorkerProcess, "spawn", spawn)
    monkeypatch.setattr(WorkerProcess, "wait_ready", wait_ready)
    monkeypatch.setattr(pool_module, "KILL_GRACE_SECS", 0.1)
    return calls


def _pool(workers: int, keep: int) -> _Pool:
    config = ServerConfig(frontend_processes=workers, frontend_core_connections=keep, exit_timeout_secs=0)
    return _Pool(SimpleNamespace(config=config), "127.0.0.1", 0)  # type: ignore[arg-type]


def test_workers_start_once_at_the_first_need_and_a_failure_leaves_the_core_serving(
        spawned: list[int], caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        pool = _pool(2, keep=4)
        await pool.start()
        assert spawned == []  # no need yet: no worker
        assert pool._outlets_on_demand() == []  # the first need: the start begins, the core serves meanwhile
        assert pool._outlets_on_demand() == []
        assert pool._starting is not None
        await pool._starting
        assert spawned == [0, 1]  # once, whatever the number of asks
        assert len(pool._outlets_on_demand()) == 1  # worker 0 takes connections; worker 1 never got ready
        assert len(pool._watchers) == 2  # both watched: one that ends is started again
        await pool.stop()
        assert all(w.process is not None and w.process.returncode is not None for w in pool.workers)

    with caplog.at_level(logging.ERROR, logger="naiad.frontends"):
        asyncio.run(scenario())
    assert "frontend worker 1 did not start" in caplog.text


def test_with_no_connection_kept_the_workers_start_with_the_pool(spawned: list[int]) -> None:
    async def scenario() -> None:
        pool = _pool(1, keep=0)
        await pool.start()
        assert spawned == [0]
        await pool.stop()

    asyncio.run(scenario())


def test_a_stop_during_the_start_cancels_it(spawned: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    async def never_ready(self: WorkerProcess, timeout: float) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(WorkerProcess, "wait_ready", never_ready)

    async def scenario() -> None:
        pool = _pool(1, keep=1)
        await pool.start()
        pool._outlets_on_demand()
        await asyncio.sleep(0.01)
        starting = pool._starting
        await asyncio.wait_for(pool.stop(), 5)
        assert starting is not None and starting.cancelled()
        assert pool._outlets_on_demand() == []  # stopping: nothing starts again

    asyncio.run(scenario())
