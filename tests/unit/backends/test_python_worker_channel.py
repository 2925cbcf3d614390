"""The worker's blocking channel: a waiting reader wakes for messages, not for the peer reading ours."""

from __future__ import annotations

import os
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from naiad.config.model_config import ConfigError
from naiad.runtime.process.auto_complete import run_auto_complete
from naiad.runtime.process.framing import BlockingChannel, FrameDecoder, encode
from naiad.runtime.process.launcher import Launch

ROUND_TRIPS = 20


class _Peer:
    """The other end of a channel: a pipe each way, raw bytes."""

    def __init__(self) -> None:
        self._to_channel = os.pipe()
        self._from_channel = os.pipe()

    def channel(self, timeout: float | None = None) -> BlockingChannel:
        return BlockingChannel(self._to_channel[0], self._from_channel[1], timeout)

    def sendall(self, data: bytes) -> None:
        os.write(self._to_channel[1], data)

    def recv(self, size: int) -> bytes:
        return os.read(self._from_channel[0], size)

    def close(self) -> None:
        os.close(self._to_channel[1])
        os.close(self._from_channel[0])


def _voluntary_switches() -> int:
    with open("/proc/thread-self/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc/thread-self/status")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/thread-self")
def test_waiting_reader_is_not_woken_when_the_peer_reads_its_reply():
    peer = _Peer()
    channel = peer.channel()
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
        channel.close()
        peer.close()
    assert received == [("x", i) for i in range(ROUND_TRIPS)]
    # Each wait is one sleep until the message; a reader blocked in recv() also woke (and slept again)
    # when the peer read the reply, two switches per round trip.
    assert sum(switches) / ROUND_TRIPS < 1.5, switches


def test_receive_reports_a_closed_peer():
    peer = _Peer()
    channel = peer.channel()
    peer.sendall(encode(("last",)))
    peer.close()
    assert channel.receive() == ("last",)
    with pytest.raises(EOFError):
        channel.receive()
    channel.close()


def test_receive_takes_whole_split_and_joined_frames_in_order():
    peer = _Peer()
    channel = peer.channel()
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
        channel.close()
        peer.close()


def test_the_rest_of_a_split_frame_is_not_taken_for_a_whole_one():
    """A read that completes a buffered frame is never decoded on its own, even when its first bytes
    happen to read as the length of the rest (the one-message shortcut must not apply to it)."""
    payload = bytearray(64)
    frame = encode(("m", bytes(payload)))
    split = frame.index(bytes(payload)) + 8  # inside the payload
    rest = len(frame) - split
    payload[8:12] = (rest - 4).to_bytes(4, "little")  # the rest starts like a frame of exactly its size
    frame = encode(("m", bytes(payload)))
    assert int.from_bytes(frame[split:split + 4], "little") == len(frame) - split - 4
    peer = _Peer()
    channel = peer.channel()
    try:
        peer.sendall(frame[:split])
        threading.Timer(0.02, peer.sendall, (frame[split:],)).start()
        assert channel.receive() == ("m", bytes(payload))
        peer.sendall(encode(("m", 1)))  # and whole frames still arrive as such
        assert channel.receive() == ("m", 1)
    finally:
        channel.close()
        peer.close()


def test_a_message_larger_than_the_pipe_arrives_whole():
    peer = _Peer()
    channel = peer.channel()
    payload = os.urandom(1 << 20)  # far beyond a pipe's capacity: several writes, several reads
    reader = threading.Thread(target=channel.send, args=(("big", payload),))
    reader.start()
    decoder = FrameDecoder()
    messages: list[object] = []
    while not messages:
        messages = decoder.feed(peer.recv(1 << 16))
    reader.join(10)
    assert messages == [("big", payload)]
    channel.close()
    peer.close()


def test_sent_messages_stay_whole_after_a_longer_one_a_repeated_value_and_a_failed_send():
    peer = _Peer()
    channel = peer.channel()
    shared = ["same", 1]
    channel.send(("long", "x" * 5000))
    channel.send(("short", shared, shared, (shared,)))
    with pytest.raises(TypeError, match="pickle"):  # a lock cannot be pickled: nothing of it is written
        channel.send(("bad", [[threading.Lock()]]))
    channel.send(("after", 2))
    decoder = FrameDecoder()
    messages: list[object] = []
    while len(messages) < 3:
        messages += decoder.feed(peer.recv(1 << 16))
    assert messages == [("long", "x" * 5000), ("short", shared, shared, (shared,)), ("after", 2)]
    assert not decoder.buffered
    channel.close()
    peer.close()


def test_encoded_messages_decode_alike_after_a_repeated_value_and_a_failed_encode():
    shared = ("FP32", (1, 16))
    messages = [("y", shared, shared, [shared]), ("big", b"b" * (1 << 17), "x" * 70_000), ("after", {"k": [1, 2]})]
    with pytest.raises(TypeError, match="pickle"):  # a lock cannot be pickled
        encode(("bad", [[threading.Lock()]]))
    frames = [encode(message) for message in messages]
    with pytest.raises(TypeError, match="pickle"):
        encode(("bad", {"k": threading.Lock()}))
    assert FrameDecoder().feed(b"".join(frames) + encode(("last",))) == [*messages, ("last",)]


def test_a_short_message_read_whole_after_a_longer_one_is_only_itself():
    peer = _Peer()
    channel = peer.channel()
    for message in [("long", "x" * 5000, list(range(100))), ("short",), ("y", 1, b"z" * 300), (), ("short", 2)]:
        peer.sendall(encode(message))  # each read whole: the buffer still holds the longer one's bytes after it
        assert channel.receive() == message
    channel.close()
    peer.close()


def test_receive_gives_up_after_the_timeout():
    peer = _Peer()
    channel = peer.channel(timeout=0.2)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        channel.receive()
    assert 0.15 < time.monotonic() - started < 5
    peer.sendall(encode(("late",)))  # the channel still works after a timeout
    assert channel.receive() == ("late",)
    channel.close()
    peer.close()


def test_auto_complete_that_hangs_fails_the_load_after_the_timeout(tmp_path: Path):
    model_file = tmp_path / "model.py"
    model_file.write_text(textwrap.dedent("""
        import time

        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(auto_complete_model_config):
                time.sleep(60)
                return auto_complete_model_config

            def execute(self, requests):
                return []
    """))
    started = time.monotonic()
    with pytest.raises(ConfigError, match="did not finish within 1s"):
        run_auto_complete('{"name": "hangs"}', model_file, Launch(), timeout=1.0)
    assert time.monotonic() - started < 8  # the hung worker is killed, not waited for
