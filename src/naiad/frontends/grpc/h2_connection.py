"""One HTTP/2 connection of Naiad's own gRPC server: an asyncio Protocol framing gRPC calls.

Reading: frames are split straight out of `data_received`; HEADERS open a call, DATA is cut
into length-prefixed gRPC messages. Writing: every frame goes to one list that is written
with a single `transport.write` per event-loop turn. Flow control is honoured both ways.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import zlib
from typing import TYPE_CHECKING

import grpc
import hpack

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
        self._decoder = w.HeaderDecoder(MAX_HEADER_LIST)
        self._headers_sid = 0            # stream whose header block continues in CONTINUATION frames
        self._headers_block = b""
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
        for stream in list(self.streams.values()):
            self._cancel(stream)
        self.streams.clear()
        if self._resume is not None and not self._resume.done():
            self._resume.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._resume is not None and not self._resume.done():
            self._resume.set_result(None)
        self._resume = None

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        self._last_rx = self.loop.time()
        if self._preface_left:
            data = self._check_preface(data)
            if data is None:
                return
        buf = self._rbuf
        buf += data
        pos, end = 0, len(buf)
        max_frame = w.DEFAULT_FRAME_SIZE
        try:
            while end - pos >= 9:
                length = (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]
                if length > max_frame:
                    raise ConnectionError_(w.FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
                if end - pos - 9 < length:
                    break
                ftype, flags = buf[pos + 3], buf[pos + 4]
                sid = _U32.unpack_from(buf, pos + 5)[0] & 0x7FFFFFFF
                payload = bytes(buf[pos + 9:pos + 9 + length])
                pos += 9 + length
                self._on_frame(ftype, flags, sid, payload)
                if self._closed:
                    return
        except ConnectionError_ as err:
            self._connection_error(err.code, str(err))
            return
        except Exception:  # noqa: BLE001 - a bug here must cost this connection only, visibly
            logger.exception("gRPC connection from %s failed", self.peer)
            self._connection_error(w.INTERNAL_ERROR, "internal error")
            return
        finally:
            if pos:
                del buf[:pos]
        self._flush()

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
        if ftype == w.DATA:
            self._on_data(flags, sid, payload)
        elif ftype == w.HEADERS:
            self._on_headers(flags, sid, payload)
        elif ftype == w.CONTINUATION:
            if sid == 0 or sid != self._headers_sid:
                raise ConnectionError_(w.PROTOCOL_ERROR, "unexpected CONTINUATION")
            self._headers_block += payload
            if len(self._headers_block) > MAX_HEADER_BLOCK:
                raise ConnectionError_(w.ENHANCE_YOUR_CALM, "header block too large")
            if flags & w.END_HEADERS:
                self._headers_sid = 0
                self._on_header_block(sid, self._headers_block, self._headers_end_stream)
        elif ftype == w.WINDOW_UPDATE:
            self._on_window_update(sid, payload)
        elif ftype == w.SETTINGS:
            self._on_settings(flags, sid, payload)
        elif ftype == w.PING:
            if sid != 0 or len(payload) != 8:
                raise ConnectionError_(w.FRAME_SIZE_ERROR if sid == 0 else w.PROTOCOL_ERROR, "bad PING")
            if not flags & w.ACK:
                self._write(w.frame(w.PING, w.ACK, 0, payload))
        elif ftype == w.RST_STREAM:
            if sid == 0 or len(payload) != 4:
                raise ConnectionError_(w.PROTOCOL_ERROR, "bad RST_STREAM")
            stream = self.streams.pop(sid, None)
            if stream is not None:
                self._cancel(stream)
                self._maybe_close_drained()
        elif ftype == w.GOAWAY:
            self._draining = True
            self._maybe_close_drained()
        elif ftype == w.PRIORITY:
            if sid == 0 or len(payload) != 5:
                raise ConnectionError_(w.PROTOCOL_ERROR, "bad PRIORITY")
        elif ftype == w.PUSH_PROMISE:
            raise ConnectionError_(w.PROTOCOL_ERROR, "clients may not push")
        # unknown frame types are ignored (RFC 9113 4.1)

    def _on_settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise ConnectionError_(w.PROTOCOL_ERROR, "SETTINGS on a stream")
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
        start, end = 0, len(payload)
        if flags & w.PADDED:
            if not payload:
                raise ConnectionError_(w.PROTOCOL_ERROR, "bad padding")
            start, end = 1, end - payload[0]
        if flags & w.PRIORITY_FLAG:
            start += 5
        if end < start:
            raise ConnectionError_(w.PROTOCOL_ERROR, "bad padding")
        block = payload[start:end] if (start or end != len(payload)) else payload
        if not flags & w.END_HEADERS:
            self._headers_sid, self._headers_block = sid, block
            self._headers_end_stream = bool(flags & w.END_STREAM)
            return
        self._on_header_block(sid, block, bool(flags & w.END_STREAM))

    def _on_header_block(self, sid: int, block: bytes, end_stream: bool) -> None:
        try:
            head = self._decoder.decode(block)
        except hpack.HPACKError as exc:  # the shared table is now unknown: the connection cannot go on
            raise ConnectionError_(w.COMPRESSION_ERROR, f"HPACK: {exc}") from None
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from the client: only END_STREAM matters
            if end_stream:
                self._end_of_requests(stream)
            return
        if sid <= self._last_sid:
            return  # a stream we already closed
        if not sid & 1:
            raise ConnectionError_(w.PROTOCOL_ERROR, "even stream id from a client")
        self._last_sid = sid
        if self._draining:
            self._write(w.rst_stream(sid, w.REFUSED_STREAM))
            return
        limit = self.server.max_concurrent_streams
        if limit and len(self.streams) >= limit:
            self._write(w.rst_stream(sid, w.REFUSED_STREAM))
            return
        self._open_call(sid, head, end_stream)

    def _on_data(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ConnectionError_(w.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self._recv_window -= size
        if self._recv_window < 0:
            raise ConnectionError_(w.FLOW_CONTROL_ERROR, "connection window exceeded")
        self._recv_unacked += size
        if self._recv_unacked >= RECV_CONN_WINDOW // 2:
            self._write(w.window_update(0, self._recv_unacked))
            self._recv_window += self._recv_unacked
            self._recv_unacked = 0
        if flags & w.PADDED:
            if not payload or payload[0] >= size:
                raise ConnectionError_(w.PROTOCOL_ERROR, "bad padding")
            payload = payload[1:size - payload[0]]
        stream = self.streams.get(sid)
        if stream is None or stream.recv_closed:
            if sid > self._last_sid:
                raise ConnectionError_(w.PROTOCOL_ERROR, "DATA on an idle stream")
            return  # data for a call already answered or reset: its window is given back above
        stream.recv_window -= size
        if stream.recv_window < 0:
            self._reset(stream, w.FLOW_CONTROL_ERROR)
            return
        stream.recv_unacked += size
        stream.last_rx = self._last_rx
        if payload and not stream.finished:
            self._take_messages(stream, payload)
        if flags & w.END_STREAM:
            self._end_of_requests(stream)
        elif stream.recv_unacked >= RECV_STREAM_WINDOW // 2:
            self._credit(stream)

    def _credit(self, stream: Stream) -> None:
        """Reopen a stream's receive window (held shut while its handler lags behind)."""
        if stream.recv_closed or not stream.recv_unacked:
            return
        if stream.requests is not None and len(stream.requests) > QUEUED_REQUESTS_LIMIT:
            return
        self._write(w.window_update(stream.sid, stream.recv_unacked))
        stream.recv_window += stream.recv_unacked
        stream.recv_unacked = 0
        self._flush_soon()

    # ------------------------------------------------------------------ calls

    def _open_call(self, sid: int, head: w.Head, end_stream: bool) -> None:
        path, timeout, encoding = head.path, head.timeout, head.encoding
        stream = Stream(sid, self._peer_initial_window, RECV_STREAM_WINDOW, self._last_rx)
        self.streams[sid] = stream
        stream.recv_closed = end_stream
        if not path or head.method != "POST":
            self._http_error(stream, 405 if path else 400)
            return
        if not head.content_type.startswith("application/grpc"):
            self._http_error(stream, 415)
            return
        metadata = head.metadata
        deadline = None
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
            stream.requests = RequestStream(handler.request_deserializer or _raw, lambda: self._credit(stream))
            stream.task = self.loop.create_task(self.server.run_call(self, stream, stream.requests))
            if end_stream:
                stream.requests.close()
        elif end_stream:
            self.finish(stream, grpc.StatusCode.INTERNAL, "Missing request message")

    def _take_messages(self, stream: Stream, payload: bytes) -> None:
        buf = stream.buf
        if buf is None:
            if len(payload) >= 5 and int.from_bytes(payload[1:5], "big") == len(payload) - 5:
                self._message(stream, payload[0], payload[5:])  # the common case: one whole message
                return
            buf = stream.buf = bytearray()
        buf += payload
        pos, end = 0, len(buf)
        while end - pos >= 5:
            length = int.from_bytes(buf[pos + 1:pos + 5], "big")
            if length > w.MAX_MESSAGE_LENGTH:
                self.finish(stream, grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"Received message larger than max ({length} vs. {w.MAX_MESSAGE_LENGTH})")
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

    def _message(self, stream: Stream, compressed: int, message: bytes) -> None:
        if compressed:
            try:
                message = w.decompress(stream.encoding, message)
            except (ValueError, zlib.error) as exc:
                self.finish(stream, grpc.StatusCode.INTERNAL, str(exc))
                return
        if stream.requests is not None:
            stream.requests.put(message)
        elif stream.handler is None:
            return
        elif stream.message is not None:
            self.finish(stream, grpc.StatusCode.UNIMPLEMENTED, "Too many request messages for a unary call")
        else:
            stream.message = message

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
            message, stream.message = stream.message, None
            self.server.start_unary(self, stream, message)

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
        if (not self._handshaken or self._rbuf or self._headers_sid) and now - self._last_rx > limit:
            self._connection_error(w.PROTOCOL_ERROR, "timed out waiting for the client")
            return
        for stream in list(self.streams.values()):
            half_sent = stream.requests is None and not stream.recv_closed and not stream.finished
            if half_sent and now - stream.last_rx > limit:
                self._reset(stream, w.CANCEL)
        self._watch_handle = self.loop.call_later(self.server.watch_interval, self._watch)

    def _connection_error(self, code: int, message: str) -> None:
        logger.debug("gRPC connection from %s: %s", self.peer, message)
        self._write(w.goaway(self._last_sid, code, message.encode()[:256]))
        self._flush()
        self._close()

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
            if self.transport is not None:
                self.transport.close()

    def abort(self) -> None:
        """Shutdown grace is over: cancel what is still running and close."""
        for stream in list(self.streams.values()):
            self._cancel(stream)
        self.streams.clear()
        self._close()



def _raw(data: bytes) -> bytes:
    return data


def _cancel_handler(stream: Stream) -> None:
    """Cancel the call's handler: its task, or what its first step waits on (which then starts the task
    that delivers the CancelledError)."""
    if stream.task is not None:
        if not stream.task.done():
            stream.task.cancel()
    elif stream.awaited is not None:
        stream.awaited.cancel()

