"""Control-message framing between the server and a worker: 4-byte length + pickled tuple (never array data)."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import select
import struct
import threading
import types
from typing import Any

_HEADER = struct.Struct("<I")
_PROTOCOL = pickle.HIGHEST_PROTOCOL
RECV_BUFFER = 64 * 1024  # reused for every read (a fresh large bytes object per recv costs an mmap)


def _fast_pickler(written: list[bytes]) -> pickle.Pickler:
    """A pickler to reuse for every message, in fast mode, appending what it writes to `written` (one bytes
    object per message, or chunks of a big one).

    Fast mode keeps no memo: a value a message holds twice is written twice, which our flat, acyclic
    messages never notice; and without a memo one pickler serves every message. Against pickle.dumps:
    no pickler set-up per message, no memo entries written or read back (add_sub's messages: ~0.5-1.5k
    instructions less to pickle, ~0.3-0.4k less to unpickle); a list rather than a BytesIO as its file:
    ~0.5k less."""
    pickler = pickle.Pickler(types.SimpleNamespace(write=written.append), _PROTOCOL)
    pickler.fast = True
    return pickler


_encoded: list[bytes] = []
_encoder = _fast_pickler(_encoded)
_encode_lock = threading.Lock()


def encode(message: tuple[Any, ...] | list[Any]) -> bytes:
    global _encoder
    _encode_lock.acquire()
    try:
        try:
            _encoder.dump(message)
        except BaseException:
            _encoded.clear()
            _encoder = _fast_pickler(_encoded)  # a fresh one: a failed dump may leave state behind
            raise
        payload = _encoded.pop() if len(_encoded) == 1 else b"".join(_encoded)
        _encoded.clear()
    finally:
        _encode_lock.release()
    return _HEADER.pack(len(payload)) + payload


class FrameDecoder:
    """Incremental decoder: feed bytes as they arrive, get complete messages back."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    @property
    def buffered(self) -> bool:
        """True while part of a message waits for the rest."""
        return bool(self._buffer)

    def feed(self, data: bytes | memoryview) -> list[Any]:
        buffer = self._buffer
        if not buffer and len(data) >= 4 and _HEADER.unpack_from(data)[0] == len(data) - 4:
            return [pickle.loads(data[4:])]  # exactly one message, the usual case
        if buffer:
            buffer += data
            view = memoryview(buffer)
        else:
            view = memoryview(data)
        messages = []
        offset = 0
        end = len(view)
        while end - offset >= 4:
            (length,) = _HEADER.unpack_from(view, offset)
            stop = offset + 4 + length
            if stop > end:
                break
            messages.append(pickle.loads(view[offset + 4 : stop]))
            offset = stop
        if buffer:
            view.release()
            if offset == end:
                buffer.clear()
            else:
                del buffer[:offset]
        elif offset != end:
            buffer += view[offset:]
        return messages


class BlockingChannel:
    """One end of a worker channel, a pipe each way: blocking reads from one thread at a time, sends from any thread.

    Pipes rather than a unix socket: a reader blocked on a pipe wakes only when data comes (a socket's
    waiters are also woken each time the peer reads what this end wrote, a needless switch per reply),
    so one blocking read is the whole wait; and a pipe's write and read cost less than a socket's.
    `timeout` (seconds) bounds each wait for a message (TimeoutError); None waits as long as it takes.
    """

    def __init__(self, read_fd: int, write_fd: int, timeout: float | None = None) -> None:
        self._read_fd = read_fd
        self._write_fd = write_fd
        self._send_lock = threading.Lock()
        self._written: list[bytes] = []  # what the pickler writes: one bytes object per message (or chunks of a big one)
        self._pickler = self._new_pickler()
        self._decoder = FrameDecoder()
        self._pending: list[Any] = []
        self._buffer = buffer = bytearray(RECV_BUFFER)
        self._view = memoryview(buffer)
        self._body = self._view[4:]  # where a message read whole starts
        # FileIO.readinto: one buffer, read straight into, ~0.4k instructions less than os.readv per read.
        self._readinto = io.FileIO(read_fd, "r", closefd=False).readinto
        self._readable: select.poll | None = None
        self._timeout_ms = 0
        if timeout is not None:
            self._readable = select.poll()
            self._readable.register(read_fd, select.POLLIN)
            self._timeout_ms = max(int(timeout * 1000), 1)

    def _new_pickler(self) -> pickle.Pickler:
        self._written.clear()
        return _fast_pickler(self._written)

    def send(self, message: tuple[Any, ...]) -> None:
        # What encode() does, with this channel's own pickler under its send lock (one lock, not two).
        chunks = self._written
        lock = self._send_lock
        lock.acquire()  # not `with`: ~1.1k instructions less per message
        try:
            try:
                self._pickler.dump(message)
            except BaseException:
                self._pickler = self._new_pickler()  # a fresh one: a failed dump may leave state behind
                raise
            if len(chunks) == 1:
                payload = chunks.pop()
            else:
                payload = b"".join(chunks)
                chunks.clear()
            data = _HEADER.pack(len(payload)) + payload
            written = os.write(self._write_fd, data)
            while written < len(data):  # a message larger than the pipe's room goes in several writes
                written += os.write(self._write_fd, data[written:])
        finally:
            lock.release()

    def receive(self) -> Any:
        """The next message; raises EOFError when the peer closed the channel."""
        pending = self._pending
        while not pending:
            if self._readable is not None and not self._readable.poll(self._timeout_ms):
                raise TimeoutError("no message from the peer in time")
            count = self._readinto(self._buffer)
            if not count:
                raise EOFError("connection closed")
            view = self._view
            # The usual read, exactly one whole message: decoded here, without the decoder's list (its
            # buffer read directly: the `buffered` property's call is ~0.7k instructions per message).
            # pickle.loads stops at the message's STOP opcode, so it takes the buffer's whole tail as it
            # is (slicing out the message's bytes costs ~0.9k instructions).
            if count > 4 and _HEADER.unpack_from(view)[0] == count - 4 and not self._decoder._buffer:
                return pickle.loads(self._body)
            messages = self._decoder.feed(view[:count])
            if len(messages) == 1:
                return messages[0]
            pending.extend(messages)
        return pending.pop(0)

    def close(self) -> None:
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
