"""The poll for the next request once the server is idle: started when the last request in flight ends, it
keeps the loop serving I/O, ends on a request or at its window; a miss spaces out the next ones, a hit
brings them closer."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from naiad.core.idle_spin import MAX_SKIP, IdleSpin
from naiad.core.server import Server
from naiad.core.serving_state import ServingState


async def _until_still(spin: IdleSpin, limit: float = 10.0) -> float:
    """Let the loop run until the spin ends; how long that took."""
    started = time.perf_counter()
    while spin.spinning:
        assert time.perf_counter() - started < limit, "the spin did not end"
        await asyncio.sleep(0)
    return time.perf_counter() - started


def test_the_loop_reads_a_socket_while_it_spins_and_a_request_ends_the_spin() -> None:
    asyncio.run(_the_loop_reads_a_socket_while_it_spins_and_a_request_ends_the_spin())


async def _the_loop_reads_a_socket_while_it_spins_and_a_request_ends_the_spin() -> None:
    loop = asyncio.get_running_loop()
    busy = [False]
    spin = IdleSpin(loop, lambda: busy[0], window_secs=5.0)  # a window no machine reaches here
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    try:
        loop.add_reader(ours.fileno(), lambda: busy.__setitem__(0, bool(ours.recv(16))))
        spin.start()
        assert spin.spinning
        writer = threading.Timer(0.01, theirs.send, (b"request",))  # the client's next request, a little later
        writer.start()
        took = await _until_still(spin)
        writer.join()
        loop.remove_reader(ours.fileno())
    finally:
        ours.close()
        theirs.close()
    assert busy[0], "the loop did not read the socket during the spin"
    assert took < 2.5, f"the spin went on {took:.3f} s after the request came"
    busy[0] = False
    spin.start()  # a hit leaves no skip: the next idle moment spins again
    assert spin.spinning
    busy[0] = True
    await _until_still(spin)


def test_without_a_request_the_spin_ends_at_its_window_then_spins_ever_more_rarely() -> None:
    asyncio.run(_without_a_request_the_spin_ends_at_its_window_then_spins_ever_more_rarely())


async def _without_a_request_the_spin_ends_at_its_window_then_spins_ever_more_rarely() -> None:
    spin = IdleSpin(asyncio.get_running_loop(), lambda: False, window_secs=200e-6)
    started = time.perf_counter()
    spin.start()
    await _until_still(spin)
    assert time.perf_counter() - started >= 200e-6
    # After misses in a row, 1, 2, 4, ... idle moments go by without a spin before the next one
    spun = []
    for _ in range(40):
        spin.start()
        spun.append(spin.spinning)
        await _until_still(spin)
    assert spun[:15] == [False, True, False, False, True, False, False, False, False, True,
                         False, False, False, False, False]


def test_the_skip_after_misses_stops_growing_at_its_cap() -> None:
    asyncio.run(_the_skip_after_misses_stops_growing_at_its_cap())


async def _the_skip_after_misses_stops_growing_at_its_cap() -> None:
    spin = IdleSpin(asyncio.get_running_loop(), lambda: False, window_secs=1e-6)
    spin.start()
    await _until_still(spin)
    gaps = []
    for _ in range(14):
        skipped = 0
        spin.start()
        while not spin.spinning:
            skipped += 1
            spin.start()
        await _until_still(spin)
        gaps.append(skipped)
    assert gaps[:10] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert gaps[10:] == [MAX_SKIP] * 4


def test_a_request_answered_during_the_spin_renews_its_window() -> None:
    asyncio.run(_a_request_answered_during_the_spin_renews_its_window())


async def _a_request_answered_during_the_spin_renews_its_window() -> None:
    spin = IdleSpin(asyncio.get_running_loop(), lambda: False, window_secs=0.5)
    spin.start()
    await asyncio.sleep(0.02)
    renewed = time.perf_counter()
    spin.start()  # a request came and was answered within a turn: the server is idle again
    assert spin.spinning
    await _until_still(spin)
    assert time.perf_counter() - renewed >= 0.5, "the window did not start again"


def test_a_hit_halves_the_skip_a_miss_doubles_it() -> None:
    asyncio.run(_a_hit_halves_the_skip_a_miss_doubles_it())


async def _a_hit_halves_the_skip_a_miss_doubles_it() -> None:
    busy = [False]
    spin = IdleSpin(asyncio.get_running_loop(), lambda: busy[0], window_secs=1e-6)

    async def spin_once(hit: bool) -> int:
        """Idle moments let by before the next spin, and that spin caught a request or not."""
        skipped = 0
        spin.start()
        while not spin.spinning:
            skipped += 1
            spin.start()
        busy[0] = hit
        await _until_still(spin)
        busy[0] = False
        return skipped

    assert [await spin_once(False) for _ in range(4)] == [0, 1, 2, 4]  # skip now 8
    assert await spin_once(True) == 8  # a hit: 8 -> 4
    assert await spin_once(False) == 0  # a miss: 4 -> 8
    assert await spin_once(True) == 8  # 8 -> 4
    assert await spin_once(True) == 0  # 4 -> 2
    assert await spin_once(True) == 0  # 2 -> 1
    assert await spin_once(True) == 0  # 1 -> 0
    assert await spin_once(False) == 0  # a miss: 0 -> 1
    assert await spin_once(True) == 1  # and a client that mostly hits is spun for at every idle moment again
    assert [await spin_once(True) for _ in range(3)] == [0, 0, 0]


@pytest.mark.parametrize(("spin_us", "present"), [(500, True), (0, False)])
def test_the_server_spins_unless_told_not_to(tmp_path, spin_us: int, present: bool) -> None:
    with Server(model_repository=str(tmp_path), idle_spin_us=spin_us) as server:
        assert (server.state.idle_spin is not None) is present


def test_the_last_request_in_flight_ending_starts_the_spin_and_no_other_does() -> None:
    asyncio.run(_the_last_request_in_flight_ending_starts_the_spin_and_no_other_does())


async def _the_last_request_in_flight_ending_starts_the_spin_and_no_other_does() -> None:
    state = ServingState()
    spin = IdleSpin(asyncio.get_running_loop(), lambda: state.inflight > 0, window_secs=5.0)
    state.idle_spin = spin
    state.inflight = 2
    state.request_done()
    assert not spin.spinning  # one request is still in flight
    state.request_done()
    assert spin.spinning
    state.inflight += 1  # the next request comes
    await _until_still(spin)
