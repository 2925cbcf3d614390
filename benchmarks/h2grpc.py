"""Minimal HTTP/2 (h2c, prior knowledge) framing for unary gRPC calls, for load generation.

grpcio's Python client costs ~200 us of CPU per call on the 2-core benchmark machine, about
what a Python gRPC server spends, so it would cap the measurement. This module sends the same
pre-serialized request on new streams of one connection and frames the answers, doing no HPACK
decoding at all:
- request headers are encoded as HPACK literals without indexing (stateless, built once);
- a call succeeded when its stream delivered a complete gRPC message before END_STREAM
  (a gRPC error is a trailers-only response: HEADERS with END_STREAM and no DATA);
- flow control: we advertise a 2^31-1 window and top up the connection window as data
  arrives; the server's windows for our DATA are honoured (sends wait for WINDOW_UPDATE).
`TrivialH2GrpcServer` answers every call with canned bytes, to measure the client's ceiling.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections import deque
from collections.abc import Callable

# Frame and HPACK-literal encoding are the server's own (naiad.frontends.grpc.h2_wire).
from naiad.frontends.grpc.h2_wire import (
    ACK,
    DATA,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    MAX_WINDOW,
    PADDED,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
    literal,
)

SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE = 0x2, 0x4


def request_header_block(authority: str, path: str) -> bytes:
    # static table: 3 = ":method: POST", 6 = ":scheme: http", 4 = ":path", 1 = ":authority",
    # 31 = "content-type"
    return (b"\x83\x86" + literal(b":path", path.encode(), 4) + literal(b":authority", authority.encode(), 1)
            + literal(b"content-type", b"application/grpc", 31) + literal(b"te", b"trailers"))


def response_header_block() -> bytes:
    # 8 = ":status: 200"
    return b"\x88" + literal(b"content-type", b"application/grpc", 31)


def trailer_block() -> bytes:
    return literal(b"grpc-status", b"0")


def grpc_message(payload: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(payload)) + payload


MAX_FRAME = 16384  # SETTINGS_MAX_FRAME_SIZE default: we never send larger frames


def data_frames(stream: int, body: bytes) -> bytes:
    """The body as DATA frames of at most MAX_FRAME bytes, END_STREAM on the last."""
    chunks = [body[i:i + MAX_FRAME] for i in range(0, len(body), MAX_FRAME)] or [b""]
    return b"".join(frame(DATA, END_STREAM if i == len(chunks) - 1 else 0, stream, c)
                    for i, c in enumerate(chunks))


def _client_settings() -> bytes:
    body = struct.pack(">HI", SETTINGS_ENABLE_PUSH, 0) + struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW)
    return frame(SETTINGS, 0, 0, body) + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - DEFAULT_WINDOW))


class _FrameReader:
    """Splits a byte stream into (type, flags, stream, payload) frames."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, int, int, bytes]]:
        self.buf += data
        frames, pos, buf = [], 0, self.buf
        while len(buf) - pos >= 9:
            length = (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]
            if len(buf) - pos < 9 + length:
                break
            ftype, flags = buf[pos + 3], buf[pos + 4]
            stream = struct.unpack_from(">I", buf, pos + 5)[0] & 0x7FFFFFFF
            frames.append((ftype, flags, stream, bytes(buf[pos + 9:pos + 9 + length])))
            pos += 9 + length
        del buf[:pos]
        return frames


class _Connection(asyncio.Protocol):
    """Shared HTTP/2 connection housekeeping: SETTINGS/PING acks, windows, GOAWAY."""

    def __init__(self) -> None:
        self.reader = _FrameReader()
        self.transport: asyncio.Transport | None = None
        self.peer_initial_window = DEFAULT_WINDOW
        self.send_window = DEFAULT_WINDOW        # connection-level window for our DATA
        self.stream_windows: dict[int, int] = {}  # per-stream windows for our DATA, if still sending
        self.recv_consumed = 0
        self.closed = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _housekeeping(self, ftype: int, flags: int, stream: int, payload: bytes) -> bool:
        """Handle connection-level frames; True if the frame was consumed here."""
        if ftype == SETTINGS:
            if not flags & ACK:
                for off in range(0, len(payload) - 5, 6):
                    key, value = struct.unpack_from(">HI", payload, off)
                    if key == SETTINGS_INITIAL_WINDOW_SIZE:
                        delta = value - self.peer_initial_window
                        self.peer_initial_window = value
                        for sid in self.stream_windows:
                            self.stream_windows[sid] += delta
                self.transport.write(frame(SETTINGS, ACK, 0))
                self.on_window()
            return True
        if ftype == PING:
            if not flags & ACK:
                self.transport.write(frame(PING, ACK, 0, payload))
            return True
        if ftype == WINDOW_UPDATE:
            inc = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
            if stream == 0:
                self.send_window += inc
            elif stream in self.stream_windows:
                self.stream_windows[stream] += inc
            self.on_window()
            return True
        if ftype == GOAWAY:
            self.on_goaway(payload)
            return True
        return False

    def _count_received(self, n: int) -> None:
        self.recv_consumed += n
        if self.recv_consumed > MAX_WINDOW // 2:
            self.transport.write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.recv_consumed)))
            self.recv_consumed = 0

    def on_window(self) -> None:
        pass

    def on_goaway(self, payload: bytes) -> None:
        self.closed = True
        self.transport.close()


class H2GrpcClient(_Connection):
    """Closed loop over one connection: `slots` calls in flight, each completion starts the next.

    `take()` says whether another call may start (budget); `record(start_ns, end_ns, ok, why)` is
    called for each finished call; `done` resolves when nothing is in flight and take() said no.
    """

    def __init__(self, authority: str, path: str, message: bytes, slots: int,
                 take: Callable[[], bool], record: Callable[[int, int, bool, str], None],
                 done: asyncio.Future) -> None:
        super().__init__()
        self.header_block = request_header_block(authority, path)
        self.body = grpc_message(message)
        self.slots, self.take, self.record, self.done = slots, take, record, done
        self.next_id = 1
        self.active: dict[int, list] = {}   # stream -> [start_ns, got_message_bytes]
        self.waiting: deque[int] = deque()  # streams whose DATA waits for window
        self.stopping = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        transport.write(PREFACE + _client_settings())
        for _ in range(self.slots):
            self._start_call()

    def _start_call(self) -> None:
        if self.closed or not self.take():
            self.stopping = True
            self._maybe_done()
            return
        sid = self.next_id
        self.next_id += 2
        self.active[sid] = [time.perf_counter_ns(), 0]
        head = frame(HEADERS, END_HEADERS, sid, self.header_block)
        if len(self.body) <= min(self.send_window, self.peer_initial_window) and not self.waiting:
            self.send_window -= len(self.body)
            self.transport.write(head + data_frames(sid, self.body))
        else:
            self.transport.write(head)
            self.stream_windows[sid] = self.peer_initial_window
            self.waiting.append(sid)
            self.on_window()

    def on_window(self) -> None:
        while self.waiting:
            sid = self.waiting[0]
            window = min(self.send_window, self.stream_windows.get(sid, 0))
            if window < len(self.body):  # the body is small: send it whole or wait
                return
            self.waiting.popleft()
            del self.stream_windows[sid]
            self.send_window -= len(self.body)
            self.transport.write(data_frames(sid, self.body))

    def data_received(self, data: bytes) -> None:
        for ftype, flags, sid, payload in self.reader.feed(data):
            if sid == 0 or ftype in (SETTINGS, PING, WINDOW_UPDATE, GOAWAY):
                self._housekeeping(ftype, flags, sid, payload)
                continue
            call = self.active.get(sid)
            if call is None:
                continue
            if ftype == DATA:
                self._count_received(len(payload))
                n = len(payload)
                if flags & PADDED and payload:
                    n -= 1 + payload[0]
                call[1] += n
            elif ftype == RST_STREAM:
                self._finish(sid, False, "RST_STREAM")
                continue
            if flags & END_STREAM and ftype in (DATA, HEADERS):
                ok = call[1] >= 5
                self._finish(sid, ok, "" if ok else "gRPC error (trailers-only response)")

    def _finish(self, sid: int, ok: bool, why: str) -> None:
        start, _ = self.active.pop(sid)
        self.record(start, time.perf_counter_ns(), ok, why)
        if sid in self.stream_windows:
            del self.stream_windows[sid]
            self.waiting.remove(sid)
        if self.stopping:
            self._maybe_done()
        else:
            self._start_call()

    def _maybe_done(self) -> None:
        if not self.active and not self.done.done():
            self.transport.close()
            self.done.set_result(None)

    def on_goaway(self, payload: bytes) -> None:
        last = struct.unpack_from(">I", payload)[0] & 0x7FFFFFFF if len(payload) >= 4 else 0
        for sid in [s for s in self.active if s > last]:
            start, _ = self.active.pop(sid)
            self.record(start, time.perf_counter_ns(), False, "GOAWAY")
        self.closed = True
        self.stopping = True
        self._maybe_done()

    def connection_lost(self, exc: Exception | None) -> None:
        for sid in list(self.active):
            start, _ = self.active.pop(sid)
            self.record(start, time.perf_counter_ns(), False, f"connection lost: {exc}")
        if not self.done.done():
            self.done.set_result(None)


class TrivialH2GrpcServer(_Connection):
    """Answers every unary call (whatever its path) with the canned message bytes."""

    def __init__(self, message: bytes) -> None:
        super().__init__()
        self.preface_left = len(PREFACE)
        self.response_tail = (response_header_block(), grpc_message(message), trailer_block())

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        transport.write(frame(SETTINGS, 0, 0, struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW))
                        + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - DEFAULT_WINDOW)))

    def data_received(self, data: bytes) -> None:
        if self.preface_left:
            skip = min(self.preface_left, len(data))
            self.preface_left -= skip
            data = data[skip:]
        out = []
        for ftype, flags, sid, payload in self.reader.feed(data):
            if sid == 0 or ftype in (SETTINGS, PING, WINDOW_UPDATE, GOAWAY):
                self._housekeeping(ftype, flags, sid, payload)
                continue
            if ftype == DATA:
                self._count_received(len(payload))
            if flags & END_STREAM and ftype in (DATA, HEADERS):
                headers, body, trailers = self.response_tail
                # responses are small; a window below that would need queueing, which this
                # measuring stub does not do (our client advertises a 2^31-1 window)
                self.send_window -= len(body)
                out.append(frame(HEADERS, END_HEADERS, sid, headers) + frame(DATA, 0, sid, body)
                           + frame(HEADERS, END_HEADERS | END_STREAM, sid, trailers))  # canned: < MAX_FRAME
        if out:
            self.transport.write(b"".join(out))
