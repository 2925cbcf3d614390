"""The worker's blocking channel: a waiting reader wakes for messages, not for the peer reading ours."""

from __future__ import annotations

import socket
import sys
import threading
import time

import pytest

from naiad.runtime.process.framing import BlockingChannel, FrameDecoder, encode

ROUND_TRIPS = 20


def _voluntary_switches() -> int:
    with open("/proc/thread-self/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc/thread-self/status")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/thread-self")
def test_waiting_reader_is_not_woken_when_the_peer_reads_its_reply():
    ours, peer = socket.socketpair()
    channel = BlockingChannel(ours)
    switches: list[int] = []
    received: list[object] = []

    def worker() -> None:
        for index in range(ROUND_TRIPS):
            channel.send(("reply", index))
            before = _voluntary_switches()
            received.append(channel.receive())  # blocks: the peer reads the reply late, then answers
            switches.append(_voluntary_switches() - before)

    thread = threading.Thread(target=worker)
    thread.start()
    decoder = FrameDecoder()
    try:
        for index in range(ROUND_TRIPS):
            time.sleep(0.005)  # the worker is waiting for the next message by now
            replies: list[object] = []
            while not replies:
                replies = decoder.feed(peer.recv(4096))
            assert replies == [("reply", index)]
            time.sleep(0.005)
            peer.sendall(encode(("x", index)))
    finally:
        thread.join(10)
        ours.close()
        peer.close()
    assert received == [("x", i) for i in range(ROUND_TRIPS)]
    # Each wait is one sleep until the message; a reader blocked in recv() also woke (and slept again)
    # when the peer read the reply, two switches per round trip.
    assert sum(switches) / ROUND_TRIPS < 1.5, switches


def test_receive_reports_a_closed_peer():
    ours, peer = socket.socketpair()
    channel = BlockingChannel(ours)
    peer.sendall(encode(("last",)))
    peer.close()
    assert channel.receive() == ("last",)
    with pytest.raises(EOFError):
        channel.receive()
    ours.close()
