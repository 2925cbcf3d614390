"""The sending half of an HTTP/2 connection of Naiad's gRPC server: batched frames, flow control, call endings."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any

import grpc

from naiad.frontends.grpc import h2_wire as w
from naiad.frontends.grpc.h2_stream import Stream

_CODE = {code: code.value[0] for code in grpc.StatusCode}


class FrameWriter:
    """Mixed into H2Connection: every outbound frame goes to `_out`, written once per event-loop turn
    (or at once, for the end of the connection's last call in flight).

    DATA respects the connection and stream windows (the excess waits in `stream.pending`);
    a call's trailers follow its last queued DATA.
    """

    loop: asyncio.AbstractEventLoop
    transport: Any
    _out: list[bytes]
    _flush_scheduled: bool
    _in_turn: bool
    _closed: bool
    _paused: bool
    _resume: asyncio.Future[None] | None
    _send_window: int
    _peer_max_frame: int
    _blocked: dict[int, Stream]
    handlers: int  # call handlers started and not yet ended (the one answering included)
    # Defined by the connection this is mixed into: a DATA frame went out (the client may acknowledge it).
    _data_written: Callable[[], None]
    # Defined by the connection this is mixed into (H2Connection): end a call's bookkeeping.
    _release: Callable[[Stream, bool], None]
    _forget_if_done: Callable[[Stream], None]
    _remember_reset: Callable[[int], None]

    def _write(self, data: bytes) -> None:
        self._out.append(data)

    def _flush_soon(self) -> None:
        if not self._flush_scheduled and not self._in_turn:  # a turn of reading flushes when it ends
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush_answer(self) -> None:
        """A call's end is queued. The last call in flight on the connection has nothing to share its
        write with: it goes out now, before the call's remaining bookkeeping, so the client's next
        request is on its way meanwhile. Others wait for the turn's one write."""
        if self._in_turn or self.handlers > 1:
            self._flush_soon()
        else:
            self._flush()

    def _flush(self) -> None:
        self._flush_scheduled = False
        out = self._out
        if out and not self._closed:
            self._out = []
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))  # type: ignore[union-attr]

    def _header_frames(self, sid: int, block: bytes, end_stream: bool) -> bytes:
        flags = w.END_STREAM if end_stream else 0
        limit = self._peer_max_frame
        if len(block) <= limit:
            return w.frame(w.HEADERS, flags | w.END_HEADERS, sid, block)
        parts = [block[i:i + limit] for i in range(0, len(block), limit)]
        frames = [w.frame(w.HEADERS, flags, sid, parts[0])]
        frames += [w.frame(w.CONTINUATION, w.END_HEADERS if i == len(parts) - 1 else 0, sid, p)
                   for i, p in enumerate(parts[1:], 1)]
        return b"".join(frames)

    def send_message(self, stream: Stream, payload: bytes) -> None:
        """One gRPC message on the stream (response headers first), within the flow-control windows."""
        if stream.finished or self._closed:
            return
        if not stream.headers_sent:
            stream.headers_sent = True
            self._write(w.frame(w.HEADERS, w.END_HEADERS, stream.sid, w.RESPONSE_HEADERS))
        data = b"\x00" + len(payload).to_bytes(4, "big") + payload
        size = len(data)
        if (not stream.pending and size <= self._send_window and size <= stream.send_window
                and size <= self._peer_max_frame):
            self._send_window -= size
            stream.send_window -= size
            self._data_written()
            self._write(w.frame(w.DATA, 0, stream.sid, data))
        else:
            if stream.pending is None:
                stream.pending = collections.deque()
            stream.pending.append(memoryview(data))  # sliced frame by frame without copying the rest
            stream.pending_bytes += size
            self._pump(stream)
        self._flush_soon()

    def answer(self, stream: Stream, payload: bytes) -> None:
        """A unary call's response message and OK status: all its frames in one piece when the windows
        take the message at once (the common case), else as send_message and finish send them."""
        size = len(payload) + 5
        if (stream.headers_sent or stream.finished or self._closed or stream.pending or size > self._send_window
                or size > stream.send_window or size > self._peer_max_frame):
            self.send_message(stream, payload)
            self.finish(stream, grpc.StatusCode.OK)
            return
        stream.headers_sent = stream.finished = True
        self._send_window -= size
        stream.send_window -= size
        frames = w.ok_response(stream.sid, payload)
        if stream.recv_closed:
            # the usual case: nothing more is written for the call, so its bookkeeping waits for the write
            if self._out or self._in_turn or self.handlers > 1:
                self._write(frames)
                self._flush_answer()
            else:
                self.transport.write(frames)  # as _flush_answer would, without the list
            self._data_written()
            self._ended(stream)
        else:
            self._write(frames)
            self._data_written()
            self._ended(stream)  # writes RST_STREAM(NO_ERROR): with the answer
            self._flush_answer()
        self._release(stream, False)

    def _pump(self, stream: Stream) -> None:
        pending = stream.pending
        while pending:
            window = min(self._send_window, stream.send_window, self._peer_max_frame)
            if window <= 0:
                self._blocked[stream.sid] = stream
                self._flush_soon()
                return
            head = pending[0]
            chunk = head if len(head) <= window else head[:window]
            if len(chunk) == len(head):
                pending.popleft()
            else:
                pending[0] = head[window:]
            self._send_window -= len(chunk)
            stream.send_window -= len(chunk)
            stream.pending_bytes -= len(chunk)
            self._data_written()
            self._write(w.frame(w.DATA, 0, stream.sid, chunk))
        self._blocked.pop(stream.sid, None)
        if stream.trailers is not None:
            block, stream.trailers = stream.trailers, None
            self._end_stream(stream, block)
        if stream.drain is not None and not stream.drain.done():
            stream.drain.set_result(None)
        self._flush_soon()

    def _pump_blocked(self) -> None:
        for stream in list(self._blocked.values()):
            if self._send_window <= 0:
                return
            self._pump(stream)

    async def writable(self, stream: Stream, limit: int = 1 << 20) -> None:
        """Wait while this stream has more than `limit` bytes waiting for window, or the socket is full."""
        while not stream.finished and not self._closed and (stream.pending_bytes > limit or self._paused):
            if self._paused:
                if self._resume is None:
                    self._resume = self.loop.create_future()
                await self._resume
            else:
                stream.drain = self.loop.create_future()
                await stream.drain

    def finish(self, stream: Stream, code: grpc.StatusCode, message: str = "", trailing: Any = None,
               cancelled: bool = False) -> None:
        """End the call with its status: trailers (or a trailers-only response) after any queued DATA."""
        if stream.finished or self._closed:
            return
        stream.finished = True
        status = _CODE[code]
        if not stream.headers_sent:
            stream.headers_sent = True
            block = w.trailers_only_block(status, message) + w.encode_metadata(trailing)
        else:
            block = w.trailer_block(status, message, trailing)
        if stream.pending:
            stream.trailers = block
        else:
            self._end_stream(stream, block)
        self._flush_answer()
        self._release(stream, cancelled)

    def _end_stream(self, stream: Stream, block: bytes) -> None:
        self._write(self._header_frames(stream.sid, block, True))
        self._ended(stream)

    def _ended(self, stream: Stream) -> None:
        """Our END_STREAM is written."""
        stream.sent_end = True
        if not stream.recv_closed:
            # the client is still sending (or never half-closed): we will not read more of this call
            self._write(w.rst_stream(stream.sid, w.NO_ERROR))
            self._remember_reset(stream.sid)
            stream.recv_closed = True
        self._forget_if_done(stream)
