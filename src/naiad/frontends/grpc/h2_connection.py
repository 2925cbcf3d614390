"""One HTTP/2 connection of Naiad's own gRPC server: an asyncio Protocol framing gRPC calls.

Reading: frames are split straight out of `data_received`; HEADERS open a call, DATA is cut
into length-prefixed gRPC messages. Writing: every frame goes to one list that is written
with a single `transport.write` per event-loop turn (at once when it ends the connection's last
call in flight: nothing else could join that write). Flow control is honoured both ways.

What one client may cost is bounded (h2_limits): streams reset early and frames that carry no
request spend per-connection budgets (GOAWAY ENHANCE_YOUR_CALM when one runs out); at most
FRAMES_PER_TURN frames are handled per event-loop turn; reading stops while the client does not
read what was written to it; receive windows reopen only as request bytes are taken by calls.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import struct
import zlib
from typing import TYPE_CHECKING

import grpc
import hpack

from naiad.frontends.grpc import h2_limits as lim
from naiad.frontends.grpc import h2_wire as w
from naiad.frontends.grpc.h2_call import CallContext, RequestStream
from naiad.frontends.grpc.h2_stream import Stream
from naiad.frontends.grpc.h2_writer import FrameWriter

if TYPE_CHECKING:
    from naiad.frontends.grpc.h2_server import H2GrpcServer

logger = logging.getLogger(__name__)

RECV_STREAM_WINDOW = 1 << 20      # what each stream may send before we acknowledge it
RECV_CONN_WINDOW = 16 << 20
MAX_HEADER_LIST = 64 << 10
MAX_HEADER_BLOCK = 256 << 10      # an encoded block (with CONTINUATIONs) larger than this ends the connection
QUEUED_REQUESTS_LIMIT = 64        # streamed requests waiting for the handler before the window stays shut
_PAIR = struct.Struct(">HI")
_U32 = struct.Struct(">I")
_FRAME_HEAD = struct.Struct(">BHBBI")  # 24-bit length (as 8 + 16 bits), type, flags, stream id


class ConnectionError_(Exception):
    """A connection error (RFC 9113 5.4.1): GOAWAY with this code, then close."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class H2Connection(FrameWriter, asyncio.Protocol):
    def __init__(self, server: H2GrpcServer) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self._rbuf = bytearray()
        self._preface_left = len(w.PREFACE)
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._in_turn = False            # frames are being handled: what they write goes out when the turn ends
        self._decoder = w.HeaderDecoder(MAX_HEADER_LIST)
        self._headers_sid = 0            # stream whose header block continues in CONTINUATION frames
        self._headers_block = bytearray()
        self._headers_end_stream = False
        self._last_sid = 0
        self._send_window = w.DEFAULT_WINDOW
        self._peer_initial_window = w.DEFAULT_WINDOW
        self._peer_max_frame = w.DEFAULT_FRAME_SIZE
        self._recv_window = RECV_CONN_WINDOW
        self._recv_unacked = 0
        self._blocked: dict[int, Stream] = {}    # streams with DATA waiting for window
        self._draining = False
        self._closed = False
        self._paused = False
        self._resume: asyncio.Future[None] | None = None
        self._started = self.loop.time()
        self._last_rx = self._started
        self._handshaken = False
        self._watch_handle: asyncio.TimerHandle | None = None
        self.peer = ""
        self.auth: dict[str, list[bytes]] | None = None
        self.handlers = 0                # call handlers started and not yet ended (reset streams' included)
        self._settings_seen = False      # the client's first frame must be SETTINGS (RFC 9113 3.4)
        self._resets = lim.TokenBucket(lim.RESET_BURST, lim.RESET_RATE, self._started)
        self._cheap = lim.TokenBucket(lim.CHEAP_FRAME_BURST, lim.CHEAP_FRAME_RATE, self._started)
        self._refusals = lim.TokenBucket(lim.REFUSED_MESSAGE_BURST, lim.REFUSED_MESSAGE_RATE, self._started)
        self._linger: asyncio.TimerHandle | None = None  # an abusive client's connection, closing soon
        self._penalty: asyncio.TimerHandle | None = None  # reading held off: refused messages, stalled answers
        self._reset_order: collections.deque[int] = collections.deque()
        self._reset_sids: set[int] = set()
        self._held = 0                   # request bytes held for calls (sum of Stream.held)
        self._held_peak = 0
        self._largest: Stream | None = None  # past HELD_BYTES_LIMIT, only this stream's bytes reopen the window
        self._exempt = 0                 # bytes received for it since
        self.inflations = 0              # compressed messages waiting for or in inflation
        self._inflate_gate = asyncio.Semaphore(1)  # large inflations: one at a time per connection
        self._ready: list[Stream] = []   # unary calls whose request is complete, started after the frame batch
        self._sent_data = False          # DATA written since the client's last WINDOW_UPDATE
        self._yielded = False            # frames left for a later event-loop turn (fairness)
        self._reading_paused = False
        self._read_resumed_at = 0.0      # when reading last resumed: a half-sent call's clock starts again there
        self._paused_at = 0.0

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.peer = w.peer_name(transport.get_extra_info("peername"))
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:
            self.auth = w.auth_of(ssl_object)
        self.server.connections.add(self)
        settings = {w.S_INITIAL_WINDOW_SIZE: RECV_STREAM_WINDOW, w.S_MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
                    w.S_ENABLE_PUSH: 0}
        if self.server.max_concurrent_streams:
            settings[w.S_MAX_CONCURRENT_STREAMS] = self.server.max_concurrent_streams
        self._write(w.settings_frame(settings) + w.window_update(0, RECV_CONN_WINDOW - w.DEFAULT_WINDOW))
        self._flush()
        self._watch_handle = self.loop.call_later(self.server.watch_interval, self._watch)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.server.connections.discard(self)
        if self._watch_handle is not None:
            self._watch_handle.cancel()
        if self._penalty is not None:
            self._penalty.cancel()
        if self._linger is not None:
            self._linger.cancel()
        for stream in list(self.streams.values()):
            self._cancel(stream)
        self.streams.clear()
        if self._resume is not None and not self._resume.done():
            self._resume.set_result(None)
        if self._held_peak >= lim.TRIM_AFTER_HELD:
            self.server.memory_freed()

    def pause_writing(self) -> None:
        self._paused = True
        self._paused_at = self.loop.time()
        self._update_reading()

    def resume_writing(self) -> None:
        self._paused = False
        if self._resume is not None and not self._resume.done():
            self._resume.set_result(None)
        self._resume = None
        self._update_reading()

    def _update_reading(self) -> None:
        """Read only while the client reads what we write and no frames wait for a later turn."""
        if self._closed or self.transport is None:
            return
        pause = self._yielded or self._paused or self._penalty is not None
        if pause != self._reading_paused:
            self._reading_paused = pause
            if pause:
                self.transport.pause_reading()
            else:
                self._read_resumed_at = self.loop.time()
                self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        self._last_rx = self.loop.time()
        if self._preface_left:
            data = self._check_preface(data)
            if data is None:
                return
        if self._rbuf or self._penalty is not None:  # (frames left for a later turn are in the buffer)
            self._rbuf += data
            if not self._yielded:  # else a later turn is already set to go on with the buffer
                self._process()
        else:
            self._process(data)  # the usual case: whole frames, read from `data` without a copy to the buffer

    def _process_later(self) -> None:
        if not self._closed:
            self._process()

    def _process(self, data: bytes | None = None) -> None:
        """Handle the complete frames in `data` (when the read buffer is empty) or in the read buffer, at
        most FRAMES_PER_TURN / BYTES_PER_TURN of them; what is left is kept in the read buffer. What they
        (and the calls they complete at once) write goes out in one write."""
        self._yielded = False
        if self._penalty is not None:
            return  # the buffer waits for _end_penalty
        self._in_turn = True
        try:
            self._handle_frames(self._rbuf if data is None else data)
        finally:
            self._in_turn = False
        if self._out:  # (a request's frames usually write nothing: no call then)
            self._flush()
        if self._yielded or self._paused or self._penalty is not None or self._reading_paused:
            self._update_reading()  # (called only when reading may have to pause or resume)

    def _handle_frames(self, buf: bytes | bytearray) -> None:
        pos, end, frames = 0, len(buf), 0
        max_frame = w.DEFAULT_FRAME_SIZE
        try:
            while end - pos >= 9:
                high, low, ftype, flags, sid = _FRAME_HEAD.unpack_from(buf, pos)
                length = (high << 16) | low
                if length > max_frame:
                    raise ConnectionError_(w.FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
                if end - pos - 9 < length:
                    break
                if self._penalty is not None:
                    break
                if frames >= lim.FRAMES_PER_TURN or pos >= lim.BYTES_PER_TURN:
                    self._yielded = True  # the other connections get their turn first
                    self.loop.call_soon(self._process_later)
                    break
                sid &= 0x7FFFFFFF
                payload = buf[pos + 9:pos + 9 + length]
                if type(payload) is not bytes:
                    payload = bytes(payload)
                pos += 9 + length
                frames += 1
                if ftype > w.HEADERS or not self._settings_seen or self._headers_sid:
                    self._on_frame(ftype, flags, sid, payload)
                elif ftype == w.DATA:  # DATA and HEADERS: what _on_frame would do, a call fewer per frame
                    self._on_data(flags, sid, payload)
                else:
                    self._on_headers(flags, sid, payload)
                if self._closed:
                    return
        except ConnectionError_ as err:
            self._connection_error(err.code, str(err))
            return
        except Exception:
            logger.exception("gRPC connection from %s failed", self.peer)
            self._connection_error(w.INTERNAL_ERROR, "internal error")
            return
        finally:
            if buf is self._rbuf:
                if pos:
                    del buf[:pos]
            elif pos < end and not self._closed:
                self._rbuf += memoryview(buf)[pos:]
        if self._ready:
            self._start_ready()
        if len(self._blocked) >= lim.STALLED_STREAMS and self._penalty is None:
            # the client lets many answers wait for window: read on only now and then (it may be about
            # to send WINDOW_UPDATE), rather than run every call it keeps sending
            self._penalty = self.loop.call_later(lim.STALL_PAUSE, self._end_stall)

    def _end_stall(self) -> None:
        self._penalty = None
        if not self._closed:
            self._process()

    def _check_preface(self, data: bytes) -> bytes | None:
        start = len(w.PREFACE) - self._preface_left
        chunk = data[:self._preface_left]
        if chunk != w.PREFACE[start:start + len(chunk)]:
            self._close()  # not HTTP/2 with prior knowledge (e.g. HTTP/1.1 or TLS on a plaintext port)
            return None
        self._preface_left -= len(chunk)
        if not self._preface_left:
            self._handshaken = True
        return data[len(chunk):]

    # ------------------------------------------------------------------ frames in

    def _on_frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if self._headers_sid and ftype != w.CONTINUATION:
            raise ConnectionError_(w.PROTOCOL_ERROR, "expected CONTINUATION")
        if not self._settings_seen:
            if ftype != w.SETTINGS or flags & w.ACK:
                raise ConnectionError_(w.PROTOCOL_ERROR, "the connection preface must be followed by SETTINGS")
            self._settings_seen = True
        if ftype == w.DATA:
            self._on_data(flags, sid, payload)
        elif ftype == w.HEADERS:
            self._on_headers(flags, sid, payload)
        elif ftype == w.CONTINUATION:
            if sid == 0 or sid != self._headers_sid:
                raise ConnectionError_(w.PROTOCOL_ERROR, "unexpected CONTINUATION")
            self._spend_cheap()
            self._headers_block += payload
            if len(self._headers_block) > MAX_HEADER_BLOCK:
                raise ConnectionError_(w.ENHANCE_YOUR_CALM, "header block too large")
            if flags & w.END_HEADERS:
                block = bytes(self._headers_block)
                self._headers_sid, self._headers_block = 0, bytearray()
                self._on_header_block(sid, block, self._headers_end_stream)
        elif ftype == w.WINDOW_UPDATE:
            self._on_window_update(sid, payload)
        elif ftype == w.SETTINGS:
            self._on_settings(flags, sid, payload)
        elif ftype == w.PING:
            if sid != 0 or len(payload) != 8:
                raise ConnectionError_(w.FRAME_SIZE_ERROR if sid == 0 else w.PROTOCOL_ERROR, "bad PING")
            self._spend_cheap()
            if not flags & w.ACK:
                self._write(w.frame(w.PING, w.ACK, 0, payload))
        elif ftype == w.RST_STREAM:
            self._on_rst_stream(sid, payload)
        elif ftype == w.GOAWAY:
            self._spend_cheap()
            self._draining = True
            self._maybe_close_drained()
        elif ftype == w.PRIORITY:
            if sid == 0 or len(payload) != 5:
                raise ConnectionError_(w.PROTOCOL_ERROR, "bad PRIORITY")
            self._spend_cheap()
        elif ftype == w.PUSH_PROMISE:
            raise ConnectionError_(w.PROTOCOL_ERROR, "clients may not push")
        else:
            self._spend_cheap()  # unknown frame types are ignored (RFC 9113 4.1), within the budget

    def _data_written(self) -> None:
        self._sent_data = True
        cheap = self._cheap
        if cheap.tokens < cheap.burst:  # (as in _on_header_block)
            cheap.give(lim.CHEAP_FRAMES_PER_DATA)

    def _spend_cheap(self) -> None:
        if not self._cheap.take(self._last_rx):
            raise ConnectionError_(w.ENHANCE_YOUR_CALM, "too many control frames")

    def refused_message(self) -> None:
        """A request message was refused after it was taken in; past the budget, reading stops for a while."""
        if self._penalty is None and not self._closed and not self._refusals.take(self.loop.time()):
            self._penalty = self.loop.call_later(self._refusals.wait(), self._end_penalty)
            self._update_reading()

    def _end_penalty(self) -> None:
        self._penalty = None
        self._refusals.take(self.loop.time())  # the refill pays for the refusal that started the penalty
        if not self._closed:
            self._process()

    def _spend_reset(self) -> None:
        if not self._resets.take(self._last_rx):
            raise ConnectionError_(w.ENHANCE_YOUR_CALM, "too many streams reset")

    def _remember_reset(self, sid: int) -> None:
        """A stream we reset: frames the client sent before it saw the reset are ignored."""
        order = self._reset_order
        if len(order) >= lim.RECENT_RESETS:
            self._reset_sids.discard(order.popleft())
        order.append(sid)
        self._reset_sids.add(sid)

    def _on_rst_stream(self, sid: int, payload: bytes) -> None:
        if sid == 0 or len(payload) != 4:
            raise ConnectionError_(w.PROTOCOL_ERROR, "bad RST_STREAM")
        if sid > self._last_sid:
            raise ConnectionError_(w.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        stream = self.streams.pop(sid, None)
        if stream is None:
            self._spend_cheap()
            return
        answered = stream.finished
        self._cancel(stream)
        self._maybe_close_drained()
        if not answered:  # opened, then reset before its answer: rapid reset (CVE-2023-44487) when frequent
            self._spend_reset()

    def _on_settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise ConnectionError_(w.PROTOCOL_ERROR, "SETTINGS on a stream")
        self._spend_cheap()
        if flags & w.ACK:
            if payload:
                raise ConnectionError_(w.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ConnectionError_(w.FRAME_SIZE_ERROR, "SETTINGS length is not a multiple of 6")
        for off in range(0, len(payload), 6):
            key, value = _PAIR.unpack_from(payload, off)
            if key == w.S_INITIAL_WINDOW_SIZE:
                if value > w.MAX_WINDOW:
                    raise ConnectionError_(w.FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self._peer_initial_window
                self._peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > w.MAX_WINDOW:  # RFC 9113 6.9.2
                        raise ConnectionError_(w.FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE overflows a window")
            elif key == w.S_MAX_FRAME_SIZE:
                if not w.DEFAULT_FRAME_SIZE <= value <= 0xFFFFFF:
                    raise ConnectionError_(w.PROTOCOL_ERROR, "bad SETTINGS_MAX_FRAME_SIZE")
                self._peer_max_frame = value
            elif key == w.S_ENABLE_PUSH and value > 1:
                raise ConnectionError_(w.PROTOCOL_ERROR, "bad SETTINGS_ENABLE_PUSH")
        self._write(w.frame(w.SETTINGS, w.ACK, 0))
        self._pump_blocked()

    def _on_window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(w.FRAME_SIZE_ERROR, "bad WINDOW_UPDATE")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if not self._sent_data:  # nothing of ours to acknowledge: a control frame like any other
            self._spend_cheap()
        self._sent_data = False
        if sid == 0:
            if increment == 0:
                raise ConnectionError_(w.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > w.MAX_WINDOW:
                raise ConnectionError_(w.FLOW_CONTROL_ERROR, "connection window overflow")
            self._pump_blocked()
            return
        stream = self.streams.get(sid)
        if stream is None:
            if sid > self._last_sid:
                raise ConnectionError_(w.PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return
        if increment == 0 or stream.send_window + increment > w.MAX_WINDOW:
            self._reset(stream, w.PROTOCOL_ERROR if increment == 0 else w.FLOW_CONTROL_ERROR)
            return
        stream.send_window += increment
        if stream.pending:
            self._pump(stream)

    def _on_headers(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ConnectionError_(w.PROTOCOL_ERROR, "HEADERS on stream 0")
        block = payload
        if flags & (w.PADDED | w.PRIORITY_FLAG):
            start, end = 0, len(payload)
            if flags & w.PADDED:
                if not payload:
                    raise ConnectionError_(w.PROTOCOL_ERROR, "bad padding")
                start, end = 1, end - payload[0]
            if flags & w.PRIORITY_FLAG:
                start += 5
            if end < start:
                raise ConnectionError_(w.PROTOCOL_ERROR, "bad padding")
            block = payload[start:end]
        if not flags & w.END_HEADERS:
            self._headers_sid, self._headers_block = sid, bytearray(block)
            self._headers_end_stream = bool(flags & w.END_STREAM)
            return
        self._on_header_block(sid, block, bool(flags & w.END_STREAM))

    def _on_header_block(self, sid: int, block: bytes, end_stream: bool) -> None:
        head = self._decoder.memo.get(block)
        if head is None:
            try:
                head = self._decoder.decode(block)
            except hpack.HPACKError as exc:  # the shared table is now unknown: the connection cannot go on
                raise ConnectionError_(w.COMPRESSION_ERROR, f"HPACK: {exc}") from None
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from the client: only END_STREAM matters
            if end_stream and not stream.recv_closed:
                self._end_of_requests(stream)
            return
        if sid <= self._last_sid:
            if sid in self._reset_sids:
                return  # sent before the client saw our RST_STREAM
            raise ConnectionError_(w.PROTOCOL_ERROR, f"HEADERS for stream {sid}: stream ids must increase")
        if not sid & 1:
            raise ConnectionError_(w.PROTOCOL_ERROR, "even stream id from a client")
        self._last_sid = sid
        limit = self.server.max_concurrent_streams
        # Handlers of reset streams count until they end, so resets cannot start more work than the limit.
        if self._draining or (limit and (len(self.streams) >= limit or self.handlers >= limit)):
            self._write(w.rst_stream(sid, w.REFUSED_STREAM))
            self._remember_reset(sid)
            if not self._draining:
                self._spend_reset()
            return
        cheap = self._cheap
        if cheap.tokens < cheap.burst:  # (a well-behaved client's bucket stays full: no call)
            cheap.give(lim.CHEAP_FRAMES_PER_CALL)  # a busy client's pings and window updates are not a flood
        self._open_call(sid, head, end_stream)

    def _on_data(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ConnectionError_(w.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self._recv_window -= size
        if self._recv_window < 0:
            raise ConnectionError_(w.FLOW_CONTROL_ERROR, "connection window exceeded")
        self._recv_unacked += size
        if flags & w.PADDED:
            if not payload or payload[0] >= size:
                raise ConnectionError_(w.PROTOCOL_ERROR, "bad padding")
            payload = payload[1:size - payload[0]]
        stream = self.streams.get(sid)
        if stream is None or stream.recv_closed:
            if sid > self._last_sid:
                raise ConnectionError_(w.PROTOCOL_ERROR, "DATA on an idle stream")
            if not size:
                self._spend_cheap()
            self._credit_connection()  # data for a call already answered or reset: its window is given back
            return
        if not size and not flags & w.END_STREAM:
            self._spend_cheap()
        stream.recv_window -= size
        if stream.recv_window < 0:
            self._reset(stream, w.FLOW_CONTROL_ERROR)
            self._credit_connection()
            self._spend_reset()
            return
        stream.recv_unacked += size
        stream.last_rx = self._last_rx
        if payload and not stream.finished:
            self._take_messages(stream, payload)
            if self._held > lim.HELD_BYTES_LIMIT and stream is self._favoured():
                self._exempt += size
        if flags & w.END_STREAM:
            if stream.message is not None and not stream.buf and not stream.finished:
                stream.recv_closed = True  # a complete unary request: what _end_of_requests would do
                self._ready.append(stream)
            else:
                self._end_of_requests(stream)
        else:
            self._credit(stream)
        if self._recv_unacked >= RECV_CONN_WINDOW // 2 or self._held > lim.HELD_BYTES_LIMIT:
            self._credit_connection()

    def _credit(self, stream: Stream) -> None:
        """Reopen a stream's receive window: while its unary request is incomplete, or while the handler
        of a streaming call keeps up with the messages it was sent."""
        if stream.recv_closed or stream.finished or stream.recv_unacked < RECV_STREAM_WINDOW // 2:
            return
        requests = stream.requests
        if requests is None:
            if stream.message is not None:
                return  # the one request message is in: nothing more may come
        elif len(requests) and (len(requests) > QUEUED_REQUESTS_LIMIT or stream.held > RECV_STREAM_WINDOW):
            return
        self._write(w.window_update(stream.sid, stream.recv_unacked))
        stream.recv_window += stream.recv_unacked
        stream.recv_unacked = 0

    def _credit_connection(self) -> None:
        """Reopen the connection's receive window while the bytes held for calls stay under the limit;
        past it, only for what arrived for the stream holding the most (so its message completes)."""
        if self._held <= lim.HELD_BYTES_LIMIT:
            grant = self._recv_unacked
            if grant < RECV_CONN_WINDOW // 2:
                return
            self._exempt = 0
        else:
            grant = min(self._exempt, self._recv_unacked)
            if grant <= 0 or (grant < RECV_STREAM_WINDOW // 2 and self._recv_window >= RECV_STREAM_WINDOW // 2):
                return  # small grants only once the client is nearly out of window
            self._exempt -= grant
        self._write(w.window_update(0, grant))
        self._recv_window += grant
        self._recv_unacked -= grant

    def _favoured(self) -> Stream | None:
        """The stream holding the most request bytes (kept until it holds none)."""
        favoured = self._largest
        if favoured is None or not favoured.held or self.streams.get(favoured.sid) is not favoured:
            favoured = self._largest = max(self.streams.values(), key=_held_of, default=None)
        return favoured

    def _taken(self, stream: Stream, size: int) -> None:
        """`size` request bytes of the stream left the connection's care (taken by the call, or dropped)."""
        size = min(size, stream.held)
        stream.held -= size
        self._held -= size
        self._credit(stream)
        self._credit_connection()
        self._flush_soon()

    # ------------------------------------------------------------------ calls

    def _open_call(self, sid: int, head: w.Head, end_stream: bool) -> None:
        path, metadata = head.path, head.metadata
        stream = Stream(sid, self._peer_initial_window, RECV_STREAM_WINDOW, self._last_rx)
        self.streams[sid] = stream
        stream.recv_closed = end_stream
        deadline = None
        if not head.plain:  # (the checks below pass for a plain head: ~0.1 us a call less)
            if not path or head.method != "POST":
                self._http_error(stream, 405 if path else 400)
                return
            if not head.content_type.startswith("application/grpc"):
                self._http_error(stream, 415)
                return
            timeout, encoding = head.timeout, head.encoding
            if timeout:
                seconds = w.parse_timeout(timeout)
                if seconds is None:
                    self.finish(stream, grpc.StatusCode.INTERNAL, f"Invalid grpc-timeout: {timeout}")
                    return
                deadline = self.loop.time() + seconds
                stream.deadline_handle = self.loop.call_at(deadline, self._deadline_passed, stream)
            if encoding and encoding != "identity":
                if encoding not in ("gzip", "deflate"):
                    self.finish(stream, grpc.StatusCode.UNIMPLEMENTED,
                                f"Compression algorithm '{encoding}' is not supported")
                    return
                stream.encoding = encoding
        stream.ctx = CallContext(metadata, deadline, self.peer, self.auth, self.loop)
        handler = self.server.resolved.get(path)
        if handler is None:
            handler = self.server.handler(path, metadata)
        if handler is None:
            self.finish(stream, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            return
        if not self.server.acquire_rpc():
            self.finish(stream, grpc.StatusCode.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded!")
            return
        stream.counted = True
        stream.handler = handler
        if handler.request_streaming:
            stream.requests = RequestStream(handler.request_deserializer or _raw,
                                            lambda size: self._taken(stream, size),
                                            lambda data: self._inflate_streamed(stream, data))
            self.handlers += 1
            stream.task = self.loop.create_task(self.server.run_call(self, stream, stream.requests))
            stream.task.add_done_callback(self.handler_done)
            if end_stream:
                stream.requests.close()
        elif end_stream:
            self.finish(stream, grpc.StatusCode.INTERNAL, "Missing request message")

    def _take_messages(self, stream: Stream, payload: bytes) -> None:
        stream.held += len(payload)
        self._held += len(payload)
        if self._held > self._held_peak:
            self._held_peak = self._held
        limit = self.server.max_message_size
        buf = stream.buf
        if buf is None:
            if len(payload) >= 5 and _U32.unpack_from(payload, 1)[0] == len(payload) - 5 <= limit:
                # the common case: one whole message; an uncompressed unary request is kept as _message would
                if not payload[0] and stream.requests is None and stream.handler is not None and stream.message is None:
                    stream.message = payload[5:]
                else:
                    self._message(stream, payload[0], payload[5:])
                return
            buf = stream.buf = bytearray()
        buf += payload
        pos, end = 0, len(buf)
        while end - pos >= 5:
            length = _U32.unpack_from(buf, pos + 1)[0]
            if length > limit:
                self.finish(stream, grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"Received message larger than max ({length} vs. {limit})")
                self.refused_message()
                return
            if end - pos - 5 < length:
                break
            self._message(stream, buf[pos], bytes(buf[pos + 5:pos + 5 + length]))
            pos += 5 + length
            if stream.finished:
                return
        if pos == end:
            stream.buf = None
        elif pos:
            del buf[:pos]

    def _message(self, stream: Stream, compressed: int, raw: bytes) -> None:
        message: bytes | w.Compressed = raw
        if compressed:
            if not stream.encoding:
                self.finish(stream, grpc.StatusCode.INTERNAL, "Compressed message received without a grpc-encoding header")
                return
            message = w.Compressed(raw)  # inflated (within the limit, off the loop when large) when taken
        if stream.requests is not None:
            stream.requests.put(message)
        elif stream.handler is None:
            self._taken(stream, 5 + len(message))
        elif stream.message is not None:
            self.finish(stream, grpc.StatusCode.UNIMPLEMENTED, "Too many request messages for a unary call")
        else:
            stream.message = message

    async def inflate(self, stream: Stream, data: bytes) -> bytearray | memoryview | None:
        """A compressed request message inflated, or None once the call was ended: RESOURCE_EXHAUSTED for
        a bomb (or too many inflations at once on this connection), INTERNAL for corrupt data."""
        if self.inflations >= lim.INFLATIONS_PER_CONNECTION:
            self.finish(stream, grpc.StatusCode.RESOURCE_EXHAUSTED,
                        "Too many compressed messages being decompressed on this connection")
            self.refused_message()
            return None
        self.inflations += 1
        try:
            return await w.inflate(stream.encoding, data, self.server.max_inflated, self.server.inflater,
                                   self._inflate_gate)
        except w.MessageTooLarge as exc:
            self.finish(stream, grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            self.refused_message()
        except (ValueError, zlib.error) as exc:
            self.finish(stream, grpc.StatusCode.INTERNAL, str(exc))
            self.refused_message()
        finally:
            self.inflations -= 1
        return None

    async def _inflate_streamed(self, stream: Stream, data: bytes) -> bytearray | memoryview:
        raw = await self.inflate(stream, data)
        if raw is None:
            raise asyncio.CancelledError()  # the call has its status; its handler ends here
        return raw

    def _end_of_requests(self, stream: Stream) -> None:
        stream.recv_closed = True
        if stream.finished:
            self._forget_if_done(stream)
            return
        if stream.buf:
            self.finish(stream, grpc.StatusCode.INTERNAL, "Incomplete gRPC message at end of stream")
            return
        if stream.requests is not None:
            stream.requests.close()
        elif stream.handler is not None:
            if stream.message is None:
                self.finish(stream, grpc.StatusCode.INTERNAL, "Missing request message")
                return
            self._ready.append(stream)

    def _start_ready(self) -> None:
        """Start the unary calls completed by the last frame batch, except those already reset: a request
        opened and reset in the same batch never reaches the core."""
        ready, self._ready = self._ready, []
        start = self.server.start_unary
        started = 0  # (counted by hand: enumerate costs ~0.1 us a call)
        for stream in ready:
            if self._penalty is not None:  # the calls after a refused message wait with the unread frames
                self._ready = ready[started:]
                break
            started += 1
            message, stream.message = stream.message, None
            if stream.finished or message is None:
                continue
            self._held -= stream.held  # the request is the call's now
            stream.held = 0
            start(self, stream, message)
        if self._recv_unacked >= RECV_CONN_WINDOW // 2 or self._held > lim.HELD_BYTES_LIMIT:
            self._credit_connection()  # (called only when it may grant: this runs for every call)

    def handler_done(self, _: object = None) -> None:
        self.handlers -= 1

    def _deadline_passed(self, stream: Stream) -> None:
        stream.deadline_handle = None
        if stream.finished:
            return
        _cancel_handler(stream)
        self.finish(stream, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", cancelled=True)
        self._flush_soon()

    def _cancel(self, stream: Stream) -> None:
        """The client reset the stream or went away: the handler is cancelled, nothing more is sent."""
        stream.recv_closed = stream.finished = True
        self._blocked.pop(stream.sid, None)
        stream.pending = None
        if stream.requests is not None:
            stream.requests.close(asyncio.CancelledError())
        _cancel_handler(stream)
        self._release(stream, cancelled=True)

    def _release(self, stream: Stream, cancelled: bool) -> None:
        stream.buf = stream.message = None
        if stream.held:
            self._taken(stream, stream.held)
        if stream.deadline_handle is not None:
            stream.deadline_handle.cancel()
            stream.deadline_handle = None
        if stream.counted:
            stream.counted = False
            self.server.release_rpc()
        if stream.ctx is not None:
            stream.ctx.finish(cancelled)
        if stream.drain is not None and not stream.drain.done():
            stream.drain.set_result(None)

    def _forget_if_done(self, stream: Stream) -> None:
        if stream.sent_end and stream.recv_closed:
            if self.streams.get(stream.sid) is stream:
                del self.streams[stream.sid]
            self._maybe_close_drained()

    def _http_error(self, stream: Stream, status: int) -> None:
        stream.finished = stream.headers_sent = True
        self._end_stream(stream, w.http_error_headers(status))

    def _reset(self, stream: Stream, code: int) -> None:
        self._write(w.rst_stream(stream.sid, code))
        self._remember_reset(stream.sid)
        self.streams.pop(stream.sid, None)
        self._cancel(stream)
        self._flush_soon()

    # ------------------------------------------------------------------ connection life

    def _watch(self) -> None:
        """Time out what a client left half-done: the preface, a partial frame, a unary request."""
        if self._closed:
            return
        now = self.loop.time()
        limit = self.server.request_timeout
        if (not self._handshaken or self._rbuf or self._headers_sid) and now - self._last_rx > limit \
                and not self._reading_paused:
            self._connection_error(w.PROTOCOL_ERROR, "timed out waiting for the client")
            return
        if self._paused and now - self._paused_at > limit:
            logger.debug("gRPC connection from %s: the client stopped reading", self.peer)
            self._closed = True
            if self.transport is not None:
                self.transport.abort()
            return
        if not self._reading_paused:  # else the rest of a call may wait unread on our side, not the client's
            since = now - limit
            for stream in list(self.streams.values()):
                half_sent = stream.requests is None and not stream.recv_closed and not stream.finished
                if half_sent and stream.last_rx < since and self._read_resumed_at < since:
                    self._reset(stream, w.CANCEL)
        self._watch_handle = self.loop.call_later(self.server.watch_interval, self._watch)

    def _connection_error(self, code: int, message: str) -> None:
        logger.debug("gRPC connection from %s: %s", self.peer, message)
        self._write(w.goaway(self._last_sid, code, message.encode()[:256]))
        self._flush()
        if code != w.ENHANCE_YOUR_CALM or self._closed or self.transport is None:
            self._close()
            return
        # An abusive client: nothing more is read or handled, and its connection is held for a while
        # before it closes, so that reconnecting at once does not buy a fresh budget every few ms.
        self._closed = True
        self._rbuf.clear()
        self.transport.pause_reading()
        for stream in list(self.streams.values()):
            self._cancel(stream)
        self.streams.clear()
        self._linger = self.loop.call_later(lim.CALM_LINGER, self._shut)

    def goaway(self) -> None:
        """Graceful shutdown: no new calls on this connection; it closes when its calls are done."""
        if self._closed or self._draining:
            return
        self._draining = True
        self._write(w.goaway(self._last_sid, w.NO_ERROR))
        self._flush()
        self._maybe_close_drained()

    def _maybe_close_drained(self) -> None:
        if self._draining and not self.streams and not self._closed:
            self._flush()
            self._close()

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            self._shut()

    def _shut(self) -> None:
        self._linger = None
        if self.transport is not None:
            self.transport.close()
            if self.transport.get_write_buffer_size():  # a client that does not read gets no linger
                self.loop.call_later(self.server.request_timeout, self.transport.abort)

    def abort(self) -> None:
        """Shutdown grace is over: cancel what is still running and close."""
        for stream in list(self.streams.values()):
            self._cancel(stream)
        self.streams.clear()
        if self._linger is not None:
            self._linger.cancel()
            self._shut()
        self._close()



def _raw(data: bytes) -> bytes:
    return data


def _held_of(stream: Stream) -> int:
    return stream.held


def _cancel_handler(stream: Stream) -> None:
    """Cancel the call's handler: its task, or what its first step waits on (which then starts the task
    that delivers the CancelledError)."""
    if stream.task is not None:
        if not stream.task.done():
            stream.task.cancel()
    elif stream.awaited is not None:
        stream.awaited.cancel()

