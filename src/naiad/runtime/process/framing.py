"""Control-message framing between the server and a worker: 4-byte length + pickled tuple (never array data)."""

from __future__ import annotations

import pickle
import select
import socket
import struct
import threading
from typing import Any

_HEADER = struct.Struct("<I")
_PROTOCOL = pickle.HIGHEST_PROTOCOL
RECV_BUFFER = 64 * 1024  # reused for every read (a fresh large bytes object per recv costs an mmap)


def encode(message: tuple[Any, ...]) -> bytes:
    payload = pickle.dumps(message, _PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


class FrameDecoder:
    """Incremental decoder: feed bytes as they arrive, get complete messages back."""

    def __init__(self) -> None:
        self._buffer = bytearray()

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
    """The worker's end: blocking reads from one thread, sends from any thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()
        self._decoder = FrameDecoder()
        self._pending: list[Any] = []
        self._buffer = bytearray(RECV_BUFFER)
        self._view = memoryview(self._buffer)
        self._readable = select.poll()
        self._readable.register(sock, select.POLLIN)

    def send(self, message: tuple[Any, ...]) -> None:
        data = encode(message)
        with self._send_lock:
            self.sock.sendall(data)

    def receive(self) -> Any:
        """The next message; raises EOFError when the peer closed the connection."""
        while not self._pending:
            # Wait in poll() for POLLIN only: a thread blocked in recv() is also woken each time the peer
            # reads what we sent (a unix socket signals freed write space on the same wait queue), one
            # needless switch into this process per reply whenever the peer reads it late.
            self._readable.poll()
            count = self.sock.recv_into(self._buffer)
            if not count:
                raise EOFError("connection closed")
            self._pending.extend(self._decoder.feed(self._view[:count]))
        return self._pending.pop(0)
