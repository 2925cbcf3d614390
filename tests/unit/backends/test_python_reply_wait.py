"""The server waits briefly for a Python model's reply only while that request is its only one in flight."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import pytest

from naiad import Server
from naiad.runtime.process import reply_spin
from naiad.runtime.process.reply_spin import ReplySpin, cpus_beside_the_loop
from tests.integration.test_python_backend_support import PID_CONFIG, PID_PY, add_sub, write_model
from tests.support.waiting import wait_until
from tests.unit.backends.test_python_backend_processes import _infer_async, _sleep_request

COUNT = 100


@pytest.fixture
def waits(monkeypatch):
    """Every ReplySpin.wait call: (server requests in flight then, whether the reply came within it)."""
    calls: list[tuple[int, bool]] = []
    original = ReplySpin.wait
    server_of: list[Server] = []

    def recording(self: ReplySpin) -> bool:
        came = original(self)
        calls.append((server_of[0].inflight_requests, came))
        return came

    monkeypatch.setattr(ReplySpin, "wait", recording)
    return calls, server_of


def test_lone_requests_are_waited_for_and_answered(tmp_path, waits, monkeypatch):
    calls, server_of = waits
    # A wait long enough for a worker on a busy machine (the suite's other tests) to get a CPU and answer
    monkeypatch.setattr(reply_spin, "SPIN_SECS", 0.05)
    add_sub(tmp_path)
    prefix = f"nr{uuid.uuid4().hex[:8]}_"
    ones = np.ones((1, 16), np.float32)
    with Server(model_repository=str(tmp_path), backend_config={"python": {"shm-region-prefix-name": prefix}}) as server:
        server_of.append(server)
        answers = [server.infer("add_sub", {"INPUT0": ones * i, "INPUT1": ones}) for i in range(COUNT)]
    assert all((a["OUTPUT0"] == ones * i + 1).all() and (a["OUTPUT1"] == ones * i - 1).all()
               for i, a in enumerate(answers))
    if not cpus_beside_the_loop():  # one CPU: the worker needs it, nothing is waited for
        assert calls == []
        return
    assert len(calls) == COUNT and {inflight for inflight, _ in calls} == {1}
    assert sum(came for _, came in calls) >= COUNT // 2  # answers delivered by the wait, not the loop


@pytest.mark.skipif(not cpus_beside_the_loop(), reason="the wait is only used with two or more CPUs")
def test_a_request_beside_another_one_in_flight_is_not_waited_for(tmp_path, waits):
    calls, server_of = waits
    model_dir = write_model(tmp_path, "slow", PID_CONFIG % 1, PID_PY)
    add_sub(tmp_path)
    prefix = f"nr{uuid.uuid4().hex[:8]}_"
    with Server(model_repository=str(tmp_path), backend_config={"python": {"shm-region-prefix-name": prefix}}) as server:
        server_of.append(server)
        slow = asyncio.run_coroutine_threadsafe(_infer_async(server, "slow", _sleep_request(2)), server._loop)
        slow_pid = server.models.lookup("slow").pool.instances[0].pid
        wait_until(lambda: (model_dir / "markers" / f"executing-{slow_pid}").exists())
        assert len(calls) == 1  # the slow request's own, alone then: not answered within the wait
        assert calls[0] == (1, False)
        ones = np.ones((1, 16), np.float32)
        for _ in range(5):
            server.infer("add_sub", {"INPUT0": ones, "INPUT1": ones})
        assert len(calls) == 1 and server.inflight_requests == 1  # two in flight each time: no wait
        slow.result(30)
