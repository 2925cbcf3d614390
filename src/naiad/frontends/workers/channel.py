"""The framed message channel between a frontend worker and the core process (one unix socket pair each).

A frame is a 4-byte little-endian length and a message: pickled (protocol 5: numpy tensors travel as
one contiguous copy; a pickle's first byte is its PROTO opcode, 0x80), or one of wire.PLAIN's plain
messages: its kind's byte, then MessagePack (msgspec), decoded into that kind's declared type; or a
run of plain messages of one kind sent in one turn of the loop (the kind's byte with its high bit set,
then their MessagePack array). A plain message costs ~6k fewer instructions to encode than its
pickle; a run of 8 saves ~6k more per message over both ends (callgrind, add_sub's infer and
result). Both ends are asyncio protocols: `send()` and `send_plain()` write a frame, `on_message`
gets each whole frame's message, in order. The worker reads its first frame (the server settings)
before its event loop starts, with `read_frame()`.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
import time
from collections.abc import Callable
from typing import Any, cast

import msgspec

from naiad.frontends.workers.wire import PLAIN

_LENGTH = struct.Struct("<I")
_pack_length = _LENGTH.pack
_pack_head = struct.Struct("<IB").pack  # a plain frame's length and kind byte
_dumps = pickle.dumps
_PICKLED = 0x80  # the first byte of every pickle (protocol >= 2)
_encode_plain = msgspec.msgpack.Encoder().encode
_DECODERS = {ord(kind): msgspec.msgpack.Decoder(kind_type).decode for kind, kind_type in PLAIN.items()}
# A run of plain messages of one kind goes as one frame: one frame to read and one decoding call fewer
# per message (at c=8/32 the core answers a Python model's batch at once)
_RUNS = {ord(kind) | 0x80: msgspec.msgpack.Decoder(list[kind_type]).decode  # type: ignore[valid-type]
         for kind, kind_type in PLAIN.items()}
MAX_FRAME = (1 << 32) - 1
# A turn of the loop that goes on sending (a worker decoding the requests of 24 connections read at once,
# the core answering a batch of them) writes what it has once its first message waited this long: the
# peer starts on them while the rest are made. Python add_sub batched over HTTP at c=32, one worker per
# port on two CPUs: 16-18k req/s, against 13.6-16k writing only at the turn's end (30-200 us all did
# about as well).
FLUSH_AFTER_NS = 100_000
_clock_ns = time.perf_counter_ns
_FIRST_BUFFER = 1 << 16
_KEPT_BUFFER = 1 << 20
_COPIED = 1 << 16  # frames shorter than this are copied out of the buffer to be unpickled


class UnsendableMessage(ValueError):
    """A message the channel cannot carry (nested too deeply to pickle, or over 4 GiB)."""


def encode_frame(message: Any) -> bytes:
    try:
        payload = pickle.dumps(message, protocol=5)
    except RecursionError:
        raise UnsendableMessage("the message is nested too deeply for the worker channel") from None
    if len(payload) > MAX_FRAME:
        raise UnsendableMessage(f"message of {len(payload)} bytes is too large for the worker channel")
    return _LENGTH.pack(len(payload)) + payload


def read_frame(sock: socket.socket) -> Any:
    """One message read with blocking calls (before the event loop runs)."""
    (length,) = _LENGTH.unpack(_read_exactly(sock, _LENGTH.size))
    return pickle.loads(_read_exactly(sock, length))


def _read_exactly(sock: socket.socket, count: int) -> bytes:
    chunks: list[bytes] = []
    while count:
        chunk = sock.recv(min(count, 1 << 20))
        if not chunk:
            raise EOFError("the worker channel closed")
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


class Channel(asyncio.BufferedProtocol):
    """One end of the channel. `closed` resolves when the peer goes away (or close() is called)."""

    def __init__(self, on_message: Callable[[Any], None]) -> None:
        self.on_message = on_message
        self._loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._transport: asyncio.Transport | None = None
        self._outgoing: list[bytes] = []  # frames (length, message) sent during this turn of the loop, written at its end
        self._run: list[bytes] = []  # the encoded plain messages of one kind sent last, not framed yet
        self._run_kind = 0
        self._run_size = 0
        self._first_ns = 0
        self._buffer = bytearray(_FIRST_BUFFER)
        self._filled = 0

    @classmethod
    async def open(cls, sock: socket.socket, on_message: Callable[[Any], None]) -> Channel:
        """Run the channel over an already connected unix socket."""
        sock.setblocking(False)
        _, protocol = await asyncio.get_running_loop().create_unix_connection(lambda: cls(on_message), sock=sock)
        return protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # (uvloop's transports do not subclass asyncio's)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if not self.closed.done():
            self.closed.set_result(None)

    @property
    def is_open(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    def send(self, message: Any) -> None:
        """Queue one message (dropped when the peer is gone); UnsendableMessage when it cannot be framed.

        The frames of one turn of the event loop go out in one write (at its end, or once the first of them
        waited FLUSH_AFTER_NS): a write per message costs a system call and a wake-up of the peer each,
        the largest part of a request's cost here."""
        # encode_frame written out, the length and the message queued apart (joined once per write)
        try:
            payload = _dumps(message, 5)
        except RecursionError:
            raise UnsendableMessage("the message is nested too deeply for the worker channel") from None
        size = len(payload)
        if size > MAX_FRAME:
            raise UnsendableMessage(f"message of {size} bytes is too large for the worker channel")
        if self._run:
            self._close_run()
        outgoing = self._outgoing
        if not outgoing:
            self._flush_soon()
        outgoing.append(_pack_length(size))
        outgoing.append(payload)
        self._flush_if_late()

    def send_plain(self, message: tuple[Any, ...]) -> None:
        """send() for a message of wire.PLAIN's type for its kind (message[0]): it arrives as that type."""
        try:
            payload = _encode_plain(message)
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
            # a value MessagePack does not carry (a numpy scalar, an int past 64 bits, a bytes object past
            # 4 GiB): the pickle carries it, or refuses it as it always did
            self.send(message)
            return
        size = len(payload)
        if size + 6 > MAX_FRAME:  # (its kind's byte, and its run's array header)
            raise UnsendableMessage(f"message of {size} bytes is too large for the worker channel")
        kind = ord(message[0])
        run = self._run
        if run:
            if kind != self._run_kind or self._run_size + size > MAX_FRAME - 6:
                self._close_run()
                self._run_kind = kind
                run = self._run
        else:
            if not self._outgoing:
                self._flush_soon()
            self._run_kind = kind
        run.append(payload)
        self._run_size += size
        self._flush_if_late()

    def _flush_soon(self) -> None:
        """The first message since the last write: it goes out at the end of this turn at the latest."""
        self._first_ns = _clock_ns()
        self._loop.call_soon(self._flush)

    def _flush_if_late(self) -> None:
        if _clock_ns() - self._first_ns >= FLUSH_AFTER_NS:
            self._flush()  # (the flush already scheduled then finds nothing to write)

    def _close_run(self) -> None:
        """The run of plain messages as one frame: the message itself, or their array. (A flush is due: the
        run's first message saw to it.)"""
        run, self._run = self._run, []
        size, self._run_size = self._run_size, 0
        outgoing = self._outgoing
        count = len(run)
        if count == 1:
            outgoing.append(_pack_head(size + 1, self._run_kind))
            outgoing.append(run[0])
            return
        array = _encode_plain([msgspec.Raw(payload) for payload in run])  # the encoded messages as they are
        outgoing.append(_pack_head(len(array) + 1, self._run_kind | 0x80))
        outgoing.append(array)

    def _flush(self) -> None:
        if self._run:
            self._close_run()
        frames, self._outgoing = self._outgoing, []
        if not frames:
            return
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(frames))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # ------------------------------------------------------------ reading (BufferedProtocol)
    # The buffer is replaced, never resized: the transport may still hold a view of the old one.

    def get_buffer(self, sizehint: int) -> memoryview:
        if len(self._buffer) - self._filled < 1 << 14:
            self._replace_buffer(2 * len(self._buffer))  # a large frame is arriving
        return memoryview(self._buffer)[self._filled:]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        start = 0
        buffer = self._buffer
        while self._filled - start >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(buffer, start)
            end = start + _LENGTH.size + length
            if end > self._filled:
                break
            # a small frame is sliced out (a copy costs less than a memoryview and its slice: 1.4k of
            # the core's ~103k instructions per add_sub request), a large one read in place
            body = start + _LENGTH.size
            tag = buffer[body]
            if tag == _PICKLED:
                message = pickle.loads(buffer[body:end] if length < _COPIED else memoryview(buffer)[body:end])
            elif tag < _PICKLED:
                message = _DECODERS[tag](buffer[body + 1:end] if length < _COPIED else memoryview(buffer)[body + 1:end])
            else:
                start = end
                for message in _RUNS[tag](buffer[body + 1:end] if length < _COPIED else memoryview(buffer)[body + 1:end]):
                    self.on_message(message)
                continue
            start = end
            self.on_message(message)
        remaining = self._filled - start
        if remaining == 0:
            self._filled = 0
            if len(buffer) > _KEPT_BUFFER:
                self._buffer = bytearray(_KEPT_BUFFER)  # a large frame passed: give its memory back
            return
        needed = _LENGTH.unpack_from(buffer, start)[0] + _LENGTH.size if remaining >= _LENGTH.size else 0
        if needed + (1 << 14) > len(buffer):
            self._replace_buffer(needed + (1 << 14), start)  # room for the whole frame being read
        elif start:
            buffer[:remaining] = buffer[start:self._filled]  # same size: allowed while a view is held
            self._filled = remaining

    def _replace_buffer(self, size: int, start: int = 0) -> None:
        """A new buffer of `size` bytes holding the unread bytes from `start` on."""
        fresh = bytearray(size)
        remaining = self._filled - start
        fresh[:remaining] = self._buffer[start:self._filled]
        self._buffer = fresh
        self._filled = remaining

    def eof_received(self) -> bool | None:
        return False
