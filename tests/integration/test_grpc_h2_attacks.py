"""The real server on Naiad's own HTTP/2 gRPC implementation under attack from raw h2c clients on
loopback: each attack runs a few seconds (reconnecting whenever the server closes the attacker)
while a tritonclient.grpc client keeps calling a model. The server must stay up, serve every normal
call with bounded latency, and keep its memory growth bounded: served from one process, and from
frontend worker processes (the same server runs in each of them)."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support.h2_attacks import ATTACKS, attack_in_thread, new_stats
from tests.support.onnx_models import add_sub_model
from tests.support.process_tree import tree_rss
from tests.support.servers import RunningServer, start_server
from tests.support.waiting import wait_until

ATTACK_SECS = 2.5
MAX_RSS_GROWTH_MIB = 100
MAX_RSS_KEPT_MIB = 12  # what may stay resident 10 s after an attack
MAX_MEDIAN_LATENCY = 1.0  # seconds; the idle server answers in milliseconds (the machine may be loaded)


@pytest.fixture(scope="module", params=[0, 2], ids=["one-process", "frontend-workers"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo: Path = tmp_path_factory.mktemp("h2_attacks") / "models"
    add_sub_model(repo, "add_sub", datatype="INT32", dims=4)
    with start_server(repo, "--grpc-server-impl", "naiad", "--frontend-processes", str(request.param),
                      "--frontend-core-connections", "0") as running:  # with workers, every connection reaches one
        yield running


def rss_mib(pid: int) -> float:
    """The server's resident memory, its frontend worker processes' included."""
    own, children = tree_rss(pid)
    assert own, "the server is gone"
    return (own + children) / (1 << 20)


@pytest.mark.parametrize("kind", sorted(ATTACKS))
def test_attack_leaves_the_server_serving(server: RunningServer, kind: str) -> None:
    pid = server.process.pid
    data = np.array([[1, 2, 3, 4]], dtype=np.int32)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        inputs = [grpcclient.InferInput(name, [1, 4], "INT32") for name in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(data)
        client.infer("add_sub", inputs)  # warm
        baseline = rss_mib(pid)
        stop = threading.Event()
        stats = new_stats()
        latencies: list[float] = []
        peak = baseline
        thread = attack_in_thread(server.grpc_port, kind, stop, stats)
        try:
            deadline = time.monotonic() + ATTACK_SECS
            while time.monotonic() < deadline:
                started = time.monotonic()
                result = client.infer("add_sub", inputs, client_timeout=30)
                latencies.append(time.monotonic() - started)
                assert np.array_equal(result.as_numpy("OUTPUT0"), data + data)
                peak = max(peak, rss_mib(pid))
                time.sleep(0.05)  # paces the normal calls made during the attack
        finally:
            stop.set()
            thread.join(30)
        assert server.process.poll() is None, "the server died"
        after = time.monotonic()
        assert client.is_server_live()
        client.infer("add_sub", inputs, client_timeout=30)
        assert time.monotonic() - after < 10, "normal calls were slow after the attack"
    assert latencies and statistics.median(latencies) < MAX_MEDIAN_LATENCY, latencies
    assert peak - baseline < MAX_RSS_GROWTH_MIB, f"RSS {baseline:.0f} -> {peak:.0f} MiB ({stats})"
    assert rss_mib(pid) - baseline < MAX_RSS_GROWTH_MIB


def test_memory_goes_back_after_a_window_overrun(tmp_path: Path) -> None:
    """Streams overrunning their window leave the heap fragmented by their partial-message buffers; once
    the attacker is gone the server hands that memory back to the system."""
    add_sub_model(tmp_path / "models", "add_sub", datatype="INT32", dims=4)
    with start_server(tmp_path / "models", "--grpc-server-impl", "naiad") as fresh:
        pid = fresh.process.pid
        baseline = peak = rss_mib(pid)
        stop, stats = threading.Event(), new_stats()
        thread = attack_in_thread(fresh.grpc_port, "window_overrun", stop, stats)
        try:
            deadline = time.monotonic() + 2 * ATTACK_SECS
            while time.monotonic() < deadline:
                peak = max(peak, rss_mib(pid))
                time.sleep(0.1)  # paces the RSS samples taken during the attack
        finally:
            stop.set()
            thread.join(30)
        wait_until(lambda: rss_mib(pid) - baseline <= MAX_RSS_KEPT_MIB,
                   f"the RSS to fall back within {MAX_RSS_KEPT_MIB} MiB of {baseline:.0f} MiB "
                   f"(peak {peak:.0f} MiB, {stats})", timeout=10, interval=0.2)
        with grpcclient.InferenceServerClient(fresh.grpc_url) as client:
            assert client.is_server_live()
