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


def test_receive_takes_whole_split_and_joined_frames_in_order():
    ours, peer = socket.socketpair()
    channel = BlockingChannel(ours)
    frames = [encode(("m", i, "x" * (i * 37))) for i in range(6)]
    try:
        peer.sendall(frames[0])  # one whole frame per read
        assert channel.receive() == ("m", 0, "")
        peer.sendall(frames[1] + frames[2])  # two in one read
        assert [channel.receive(), channel.receive()] == [("m", 1, "x" * 37), ("m", 2, "x" * 74)]
        peer.sendall(frames[3][:3])  # a frame split inside its header, then inside its body
        threading.Timer(0.02, peer.sendall, (frames[3][3:20],)).start()
        threading.Timer(0.04, peer.sendall, (frames[3][20:] + frames[4],)).start()
        assert [channel.receive(), channel.receive()] == [("m", 3, "x" * 111), ("m", 4, "x" * 148)]
        peer.sendall(frames[5])  # whole again after split ones
        assert channel.receive() == ("m", 5, "x" * 185)
    finally:
        ours.close()
        peer.close()
