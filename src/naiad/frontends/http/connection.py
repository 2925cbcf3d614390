"""HttpConnection: Naiad's HTTP/1.1 connection (httptools parser) running an ASGI app; uvicorn keeps the sockets.

uvicorn's own protocol pauses reading at every 64 KiB of request body until the app asks for more
(a 1 MiB tensor stalled for milliseconds in TCP flow control), writes each response as two
packets, and re-validates our own headers with regular expressions on every response. This
protocol is built for the inference path instead:
- the whole body is buffered while it arrives (up to BODY_HIGH_WATER unread bytes; the app
  enforces --http-max-input-size from Content-Length while reading) and handed over in one piece;
- a response's head and body go out in one write when the app sends them back to back;
- one watchdog timer per connection enforces the header deadline (408, or a silent close when
  nothing was sent), the body deadline (408) and the keep-alive idle time, instead of arming
  and cancelling timers for every request;
- request headers are bounded in bytes (431): every read made only of header bytes counts whole,
  and the request line and each header count as the parser completes them, so headers arriving
  in the same read as the request's start (or a previous request's body) count too;
- a malformed request, including a bad chunk of a chunked body, is answered 400 (after the
  requests before it) and the connection closed; a transfer coding other than chunked, 501;
- a client that sends the same request head again (with a body of the same length, read whole on
  an idle connection) gets what the parser made of it the last time, without parsing it again
  (HttpConnection._replay): load generators and most applications repeat their requests.
Two ASGI scope extensions let the inference path skip per-request timers of its own:
`naiad.body_deadline` (this server answers a late body with 408 itself) and
`naiad.on_disconnect` (a callback run if the client goes away before the answer, after which the
request's work is cancelled). Two more spare the inference path its ASGI messages:
`naiad.take_body` hands over a body that has wholly arrived without a receive() (take_body), and
`naiad.send_response` writes a whole answer in one call (send_response).
The app's first step runs at once, once the request's bytes at hand are parsed (as an eager task
would): a request that never waits needs no task, and an infer request reaches the scheduler in
the same event-loop turn; a request that waits gets its task when what it waits for is done.
It is plugged into uvicorn's server (`http=` setting), which still binds, terminates TLS and
drives graceful shutdown through `server_state.connections` / `server_state.tasks`.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import http
import logging
import math
import urllib.parse
from collections.abc import Callable
from typing import Any

import httptools

from naiad.frontends.first_step import run_first_step, run_next_step
from naiad.frontends.http.errors import error_body

logger = logging.getLogger("naiad.http")

DEFAULT_MAX_HEADER_BYTES = 64 * 1024
BODY_HIGH_WATER = 4 * 1024 * 1024  # unread request body bytes buffered before reading pauses
SMALL_WRITE = 64 * 1024  # head + body below this are joined into one bytes object (larger: writelines)
HEADER_LINE_OVERHEAD = 4  # ": " and CRLF around each header the parser hands over
REPLAY_HEAD_BYTES = 4096  # a longer request head is parsed every time (see HttpConnection._replay)
# Single bytes are looked for as ints: `b"\r" in value` first tries the bytes object as an integer
# and builds (then drops) the TypeError that raises, ~8x slower, several times per request.
CR, LF, QUESTION_MARK, HASH = ord("\r"), ord("\n"), ord("?"), ord("#")


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request that is answered `status` and closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode("latin-1")


STATUS_LINES = {status: _status_line(status) for status in range(100, 600)}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
LENGTH_LAST = b"content-length: %d\r\n\r\n"
LENGTH_THEN_CLOSE = b"content-length: %d\r\nconnection: close\r\n\r\n"
_DISCONNECT = {"type": "http.disconnect"}
_METHODS = {name.encode(): name for name in ("GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH")}  # decoded once
ASGI_VERSION = {"version": "3.0", "spec_version": "2.3"}


class _DisconnectHook:
    """Holds the app's callback for the scope's `naiad.on_disconnect`, which is this object's bound `set`
    (a bound method is called ~1k instructions cheaper than an instance's __call__). The scope refers to
    this rather than to the exchange, so that an answered exchange is freed at once instead of as cyclic
    garbage (whose collections pause the event loop)."""

    __slots__ = ("callback",)

    def __init__(self) -> None:
        self.callback: Callable[[], None] | None = None

    def set(self, callback: Callable[[], None] | None) -> None:
        """Run `callback` if the connection is lost before the response is complete, then cancel the
        request's work (None: forget it)."""
        self.callback = callback


class Exchange:
    """One request and its response on a connection: the ASGI receive/send pair of that request."""

    __slots__ = (
        "conn", "scope", "chunks", "unread", "received", "more_body", "body_taken", "waiter", "disconnected", "expect_continue",
        "keep_alive", "started", "complete", "head", "chunked", "remaining", "head_only", "body_deadline",
        "disconnect_hook", "task", "awaited",
    )

    def __init__(self, conn: HttpConnection, scope: dict[str, Any], keep_alive: bool, expect_continue: bool) -> None:
        self.conn = conn
        self.scope = scope
        self.chunks: list[bytes] = []
        self.unread = 0
        self.received = 0
        self.more_body = True
        self.body_taken = False  # the final http.request message went to the app
        self.waiter: asyncio.Future | None = None
        self.disconnected = False
        self.expect_continue = expect_continue
        self.keep_alive = keep_alive
        self.started = False
        self.complete = False
        self.head = b""  # the response head, held back to leave with the first body bytes
        self.chunked = False
        self.remaining: int | None = None  # body bytes still owed under Content-Length (None: not bounded)
        self.head_only = scope["method"] == "HEAD"
        self.body_deadline = 0.0  # while the body is incomplete: when it is late
        self.disconnect_hook = _DisconnectHook()
        self.task: asyncio.Task | None = None  # the app's task, once its first step has waited
        self.awaited: asyncio.Future | None = None  # what the first step waits on, before there is a task
        scope["extensions"] = {
            "naiad.body_deadline": {}, "naiad.on_disconnect": self.disconnect_hook.set,
            "naiad.take_body": take_body, "naiad.send_response": send_response,
        }

    # ------------------------------------------------------------ request side (parser -> app)

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def feed(self, data: bytes) -> None:
        if self.complete:
            return
        self.chunks.append(data)
        self.unread += len(data)
        self.received += len(data)
        if self.unread > BODY_HIGH_WATER:
            self.conn.pause_reading()
        if self.waiter is not None:
            self._wake()

    def lose(self) -> None:
        self.disconnected = True
        self._wake()
        hook = self.disconnect_hook
        callback, hook.callback = hook.callback, None
        if callback is not None and not self.complete:
            callback()
            self.cancel_work()

    def cancel_work(self) -> None:
        """Cancel the app's task, or what its first step waits on (which then starts the task that
        delivers the CancelledError)."""
        if self.task is not None:
            if not self.task.done():
                self.task.cancel()
        elif self.awaited is not None:
            self.awaited.cancel()

    async def receive(self) -> dict[str, Any]:
        if self.expect_continue:
            self.expect_continue = False
            if not self.conn.closing:
                self.conn.transport.write(CONTINUE)
        while not self.disconnected and not self.complete:
            if self.chunks or not (self.more_body or self.body_taken):
                return {"type": "http.request", "body": self._take_body(), "more_body": self.more_body}
            self.conn.resume_reading()
            self.waiter = self.conn.loop.create_future()
            await self.waiter
        return _DISCONNECT

    def _take_body(self) -> bytes:
        """The body bytes buffered so far (all of it once more_body is False), as one http.request message carries them."""
        chunks = self.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks = []
        self.unread = 0
        self.body_taken = not self.more_body  # later receives wait for the disconnect (or the answer)
        if self.conn.read_paused:
            self.conn.resume_reading()
        return body

    def take_whole_body(self) -> bytes | None:
        """See take_body."""
        if self.more_body or self.body_taken or self.expect_continue or self.disconnected or self.complete:
            return None
        chunks = self.chunks  # (_take_body written out: a call fewer per request)
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks = []
        self.unread = 0
        self.body_taken = True
        if self.conn.read_paused:
            self.conn.resume_reading()
        return body

    # ------------------------------------------------------------ response side (app -> socket)

    async def send(self, message: dict[str, Any]) -> None:
        conn = self.conn
        if conn.write_paused is not None and not self.disconnected:
            await conn.write_paused
        if self.disconnected:
            return
        if not self.started:
            if message["type"] != "http.response.start":
                raise RuntimeError(f"expected ASGI message 'http.response.start', got '{message['type']}'")
            self._start(message["status"], message.get("headers", ()))
            return
        if self.complete:
            raise RuntimeError(f"ASGI message '{message['type']}' sent after the response was complete")
        if message["type"] != "http.response.body":
            raise RuntimeError(f"expected ASGI message 'http.response.body', got '{message['type']}'")
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if self.head_only:
            body = b""
        elif self.chunked:
            body = (b"%x\r\n" % len(body) + body + b"\r\n" if body else b"") + (b"" if more else b"0\r\n\r\n")
        elif self.remaining is not None:
            if len(body) > self.remaining:
                raise RuntimeError("response body longer than its Content-Length")
            self.remaining -= len(body)
        head, self.head = self.head, b""
        if head and len(body) > SMALL_WRITE:
            conn.transport.writelines((head, body))
        elif head or body:
            conn.transport.write(head + body if head else body)
        if not more:
            if self.remaining and not self.head_only:
                raise RuntimeError("response body shorter than its Content-Length")
            self.complete = True
            self._wake()
            conn.response_complete(self)

    def write_response(self, status: int, fields: bytes, body: bytes) -> bool:
        """See send_response."""
        conn = self.conn
        # current_default_head's usual case in place: the server's headers are the ones already joined
        default_head = conn.default_head if conn.server_state.default_headers is conn.default_headers else conn.current_default_head()
        if self.started or conn.write_paused is not None or default_head is None:
            return False
        if self.disconnected:
            return True  # as send() does: nothing goes to a client that left
        self.started = True
        self.expect_continue = False
        if conn.shutting_down:
            self.keep_alive = False
        length = (LENGTH_LAST if self.keep_alive else LENGTH_THEN_CLOSE) % len(body)  # the head's last lines
        status_line = STATUS_LINES.get(status) or _status_line(status)
        if self.head_only:
            conn.transport.write(b"".join((status_line, default_head, fields, length)))
        elif len(body) > SMALL_WRITE:
            conn.transport.writelines((b"".join((status_line, default_head, fields, length)), body))
        else:
            # head and body in one join (~0.5k instructions fewer than joining the head, then adding the body)
            conn.transport.write(b"".join((status_line, default_head, fields, length, body)))
        self.complete = True
        if self.waiter is not None:
            self._wake()
        # response_complete's usual case written out: a kept-alive connection whose request was read whole
        if self.keep_alive and not conn.upgrade_seen and not (self.more_body and conn.parsing is self):
            conn.server_state.total_requests += 1
        else:
            conn.response_complete(self)
        return True

    def _start(self, status: int, headers: Any) -> None:
        self.started = True
        self.expect_continue = False
        parts = [STATUS_LINES.get(status) or _status_line(status)]
        length: int | None = None
        default_head = self.conn.current_default_head()
        if default_head is not None:
            parts.append(default_head)
        for name, value in (*self.conn.default_headers, *headers) if default_head is None else headers:
            if CR in value or LF in value or CR in name or LF in name:
                raise RuntimeError("invalid HTTP header")
            lowered = name.lower()
            if lowered == b"content-length":
                length = int(value)
            elif lowered == b"connection" and b"close" in value.lower():
                self.keep_alive = False
                continue  # written once below
            parts += (name, b": ", value, b"\r\n")
        if self.conn.shutting_down:
            self.keep_alive = False
        if length is not None:
            self.remaining = 0 if self.head_only else length
        elif not (self.head_only or status in (204, 304) or status < 200):
            if self.scope["http_version"] == "1.1":
                self.chunked = True
                parts.append(b"transfer-encoding: chunked\r\n")
            else:  # HTTP/1.0: the body ends when the connection does
                self.keep_alive = False
        if not self.keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        self.head = b"".join(parts)

    async def run(self, app: Any) -> None:
        """Run the app for this exchange; an app error answers 500 (or closes a started response)."""
        try:
            await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                self.conn.abort()
                raise
            logger.error("exception in ASGI application", exc_info=exc)
            if not self.started and not self.disconnected:
                self._answer_500()
            else:
                self.conn.abort()
        else:
            if not self.complete and not self.disconnected:
                if not self.started:
                    logger.error("ASGI application returned without starting a response")
                    self._answer_500()
                else:
                    logger.error("ASGI application returned without completing its response")
                    self.conn.abort()
        finally:
            if self.conn.active is self:
                self.conn.exchange_finished(self)

    def resume(self, coroutine: Any, context: contextvars.Context) -> None:
        """Go on with the app after its first step waited (run_first_step's `resume`)."""
        awaited, self.awaited = self.awaited, None
        if awaited is not None and awaited.done():
            # What the app waited on is done (its batch, its thread): the next step runs here, and
            # the app gets a task only if it waits again (as a task, after a bare yield).
            try:
                self.awaited = run_next_step(coroutine, context, self.resume)
            except asyncio.CancelledError:
                pass  # Exchange.run has closed the connection, as for a cancelled task
            return
        conn = self.conn
        task = conn.loop.create_task(coroutine, context=context)
        self.task = task
        tasks = conn.server_state.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def _answer_500(self) -> None:
        body = b"Internal Server Error"
        self.head = b""
        self.keep_alive = False
        self.started = True
        self.complete = True
        self.conn.transport.write(
            STATUS_LINES[500] + b"content-type: text/plain; charset=utf-8\r\ncontent-length: 21\r\nconnection: close\r\n\r\n" + body
        )
        self.conn.response_complete(self)


def take_body(receive: Any) -> bytes | None:
    """The scope extension `naiad.take_body`: the request's whole body, when all of it has arrived
    and none of it was received yet, as the one http.request message receive() would return (later
    receives wait for the disconnect). None otherwise: receive() it. `receive` is the request's ASGI
    receive (a plain function, as send_response is); any other receive (a middleware's) gets None."""
    exchange = getattr(receive, "__self__", None)
    return exchange.take_whole_body() if type(exchange) is Exchange else None


def send_response(send: Any, status: int, fields: bytes, body: bytes) -> bool:
    """The scope extension `naiad.send_response`: write a whole answer now, in place of the two ASGI
    messages. `send` is the request's ASGI send; `fields` are header lines (each `name: value` and
    CRLF) of safe values, without Content-Length or Connection (added here). False when it cannot go
    at once (writing is paused, or a response was started): send the ASGI messages instead.
    (A plain function, not the exchange's bound method, so the scope holds no cycle back to it.)
    Any other send (a middleware's) gets False."""
    exchange = getattr(send, "__self__", None)
    return exchange.write_response(status, fields, body) if type(exchange) is Exchange else False


class HttpConnection(asyncio.Protocol):
    """One client connection: parses requests, runs one exchange at a time (pipelined ones wait), writes answers."""

    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    header_timeout: float = 30.0
    body_timeout: float = 60.0

    @classmethod
    def configured(cls, max_header_bytes: int, header_timeout: float, body_timeout: float = 60.0) -> type[HttpConnection]:
        """A subclass carrying these limits (uvicorn instantiates the class itself)."""
        limits = {"max_header_bytes": max_header_bytes, "header_timeout": header_timeout, "body_timeout": body_timeout}
        return type(cls.__name__, (cls,), limits)

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any], _loop: asyncio.AbstractEventLoop | None = None) -> None:
        if not config.loaded:
            config.load()
        self.app = config.loaded_app
        self.loop = _loop or asyncio.get_event_loop()
        self.keep_alive_timeout = float(config.timeout_keep_alive)
        self.root_path = config.root_path
        self.raw_root_path = self.root_path.encode("ascii")
        self.server_state = server_state
        self.default_headers: list[tuple[bytes, bytes]] = server_state.default_headers
        self.default_head = _default_head(self.default_headers)
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.scheme = "http"
        self.closing = False
        self.shutting_down = False
        self.read_paused = False
        self.write_paused: asyncio.Future | None = None
        self.active: Exchange | None = None  # the exchange whose app runs (or ran) and owns the response
        self.parsing: Exchange | None = None  # the exchange whose request is being parsed
        self.pipeline: collections.deque[Exchange] = collections.deque()
        self._to_launch: Exchange | None = None  # started once the bytes at hand are parsed
        # The last request read whole in one read, for replaying its parse (see _replay)
        self._replay_head = b""  # its head: request line, headers and the blank line
        self._replay_size = -1  # head and body length (-1: nothing to replay)
        self._replay_scope: dict[str, Any] = {}  # its scope as parsed, before the app ran
        self._replay_headers: list[tuple[bytes, bytes]] = []
        self.upgrade_seen = False
        # request being parsed
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._expect_continue = False
        self._in_headers = False
        self._header_bytes = 0  # raw bytes of reads made only of this request's header bytes
        self._field_bytes = 0  # request line and header bytes the parser has completed
        self._in_message = False  # between on_message_begin and on_message_complete
        self._begins_in_chunk = 0  # requests begun within the read being parsed
        self._failure: tuple[int, str] | None = None  # the parser's error, answered once earlier requests are
        # watchdog: one timer per connection, deadlines kept as plain numbers
        self._header_deadline = 0.0
        self._idle_deadline = 0.0
        self._watchdog: asyncio.TimerHandle | None = None
        self._watchdog_at = math.inf  # when the timer fires (inf: no timer)

    # ------------------------------------------------------------ asyncio.Protocol

    def current_default_head(self) -> bytes | None:
        """The server's default headers as head lines (see _default_head), joined again only when the
        server replaced them: uvicorn renews the list with each second's Date header."""
        headers = self.server_state.default_headers
        if headers is not self.default_headers:
            self.default_headers = headers
            self.default_head = _default_head(headers)
        return self.default_head

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        self.server_state.connections.add(self)
        self.server = _address(transport.get_extra_info("sockname"))
        self.client = _address(transport.get_extra_info("peername"))
        self.scheme = "https" if transport.get_extra_info("sslcontext") else "http"
        # A connection that never sends a request is closed after the header timeout.
        self._idle_deadline = self.loop.time() + min(self.header_timeout, self.keep_alive_timeout)
        self._arm_watchdog(self._idle_deadline)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server_state.connections.discard(self)
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
            self._watchdog_at = math.inf
        for exchange in (self.active, self.parsing, *self.pipeline):
            if exchange is not None and not exchange.complete:
                exchange.lose()
        self.pipeline.clear()
        if self.write_paused is not None and not self.write_paused.done():
            self.write_paused.set_result(None)
        self.write_paused = None
        self.parser = None  # type: ignore[assignment]

    def eof_received(self) -> bool | None:
        return None  # close the transport (the peer will send nothing more)

    def data_received(self, data: bytes) -> None:
        if (
            len(data) == self._replay_size and data.startswith(self._replay_head) and self.active is None
            and not self._in_message and self._failure is None and not self.closing and not self.shutting_down
        ):
            self._replay(data)
            return
        if self._failure is not None:
            return  # the parser stopped at an error: nothing after it is a request
        was_in_headers = self._in_headers
        was_idle = not self._in_message
        self._begins_in_chunk = 0
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.upgrade_seen = True  # no protocol switch here: answered as plain HTTP, then closed
        except httptools.HttpParserError as exc:
            refused = exc.__context__
            if isinstance(refused, _Refused):
                self._protocol_error(refused.status, refused.message)
            else:
                detail = "" if isinstance(exc, httptools.HttpParserCallbackError) else str(exc)
                self._protocol_error(400, f"Invalid HTTP request received{': ' + detail if detail else ''}.")
        if self._to_launch is not None:
            exchange, self._to_launch = self._to_launch, None
            if was_idle and self._begins_in_chunk == 1 and not self._in_message and self._failure is None and not self.upgrade_seen:
                self._remember(data, exchange)  # before the app runs: it may change its scope
            if not self.closing:
                # _launch written out (a call fewer per request)
                try:
                    awaited = run_first_step(exchange.run(self.app), exchange.resume)
                except BaseException:  # run() handles the app's errors: this is ours
                    logger.exception("HTTP exchange failed to start")
                    self.abort()
                else:
                    if awaited is not None:
                        exchange.awaited = awaited
        if self._in_headers and not self.closing and self._failure is None:
            # A read counts whole when all of it is this request's: it continues the headers, or
            # it starts the request on an idle connection (before the request line there can only
            # be blank lines). A read that also carries the previous request's body is counted by
            # what the parser completes (on_url / on_header), so the bound stays the limit plus
            # one unfinished header line.
            if (was_in_headers and not self._begins_in_chunk) or (was_idle and self._begins_in_chunk == 1):
                self._header_bytes += len(data)
            if self._header_bytes > self.max_header_bytes:
                self._protocol_error(431, self._headers_too_large())

    def _remember(self, data: bytes, exchange: Exchange) -> None:
        """Keep what parsing `data` gave, when it was one whole kept-alive request with a Content-Length
        body, for _replay. The head is the bytes up to the first blank line, which is where the
        parser ended it when every line ends with CRLF; the body is all the rest (nothing follows)."""
        blank = data.find(b"\r\n\r\n", 0, REPLAY_HEAD_BYTES)  # (never a search through a long body)
        end = blank + 4
        if (
            blank < 0 or end != len(data) - exchange.received or data[0] in (CR, LF)
            or not exchange.keep_alive or exchange.expect_continue or exchange.complete
        ):
            self._replay_size = -1
            return
        head = data[:end]
        headers = exchange.scope["headers"]
        if head.count(b"\n") != head.count(b"\r\n") or any(name == b"transfer-encoding" for name, _ in headers):
            self._replay_size = -1  # (a bare LF would end a line too, were it allowed; a chunked body is framed)
            return
        self._replay_head = head
        self._replay_size = len(data)
        self._replay_scope = scope = exchange.scope.copy()
        del scope["extensions"]  # (each exchange adds its own)
        self._replay_headers = headers.copy()

    def _replay(self, data: bytes) -> None:
        """A read that is the last remembered request again with a body of the same length: the parser,
        in the same state (between requests) and given the same head, would make the same calls, so
        what they gave is reused (a fresh scope, the body as on_body would hand it over, the app's
        first step at once). Clients sending the same request over and over, as load generators and
        most applications do, skip most of the parse: ~20k instructions per request."""
        scope = self._replay_scope.copy()
        scope["headers"] = self._replay_headers.copy()
        scope["state"] = {}
        exchange = Exchange(self, scope, True, False)
        body = data[len(self._replay_head):]
        if body:
            exchange.chunks.append(body)
            exchange.unread = exchange.received = len(body)
        exchange.more_body = False
        self._idle_deadline = 0.0  # (a request began: the keep-alive idle time no longer runs)
        self.active = exchange
        self._launch(exchange)

    def _headers_too_large(self) -> str:
        return f"request headers exceed the maximum of {self.max_header_bytes} bytes"

    def pause_writing(self) -> None:
        if self.write_paused is None:
            self.write_paused = self.loop.create_future()

    def resume_writing(self) -> None:
        waiter, self.write_paused = self.write_paused, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ------------------------------------------------------------ httptools callbacks

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._expect_continue = False
        self._in_headers = True
        self._in_message = True
        self._begins_in_chunk += 1
        self._header_bytes = 0
        self._field_bytes = 0
        self._idle_deadline = 0.0
        self._header_deadline = deadline = self.loop.time() + self.header_timeout
        if deadline < self._watchdog_at:  # (almost never: the timer is armed for an earlier deadline)
            self._arm_watchdog(deadline)

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._field_bytes += len(url)
        if self._field_bytes > self.max_header_bytes:
            raise _Refused(431, self._headers_too_large())  # stops the parser before the request starts

    def on_header(self, name: bytes, value: bytes) -> None:
        self._field_bytes += len(name) + len(value) + HEADER_LINE_OVERHEAD
        if self._field_bytes > self.max_header_bytes:
            raise _Refused(431, self._headers_too_large())  # stops the parser before the request starts
        name = name.lower()
        if name == b"transfer-encoding" and value.lower().replace(b" ", b"").replace(b"\t", b"") != b"chunked":
            # chunked is the only transfer coding understood: another one would be read as if absent
            raise _Refused(501, f"unsupported transfer coding '{value.decode('latin-1')}', only 'chunked' is supported")
        if name == b"expect" and value.lower() == b"100-continue":
            self._expect_continue = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._header_deadline = 0.0
        parser = self.parser
        version = parser.get_http_version()
        url = self._url
        if url[:1] == b"/" and QUESTION_MARK not in url and HASH not in url:  # the usual origin-form path
            raw_path, query = url, b""
        else:
            parsed = httptools.parse_url(url)
            raw_path, query = parsed.path, parsed.query or b""
        method = parser.get_method()
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope = {
            "type": "http",
            "asgi": ASGI_VERSION,
            "http_version": version,
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "method": _METHODS.get(method) or method.decode("ascii"),
            "root_path": self.root_path,
            "path": self.root_path + path,
            "raw_path": self.raw_root_path + raw_path if self.raw_root_path else raw_path,
            "query_string": query,
            "headers": self._headers,
            "state": {},
        }
        keep_alive = version != "1.0" and parser.should_keep_alive() and not self.shutting_down
        exchange = Exchange(self, scope, keep_alive, self._expect_continue)
        exchange.body_deadline = deadline = self.loop.time() + self.body_timeout
        if deadline < self._watchdog_at:
            self._arm_watchdog(deadline)
        self.parsing = exchange
        if self.active is None:
            # the active exchange; its app starts once the bytes at hand are parsed, so a small
            # request's first step sees its whole body
            self.active = exchange
            self._to_launch = exchange
        else:  # pipelined: runs when the one before it has answered
            self.pipeline.append(exchange)
            self.pause_reading()

    def on_body(self, body: bytes) -> None:
        exchange = self.parsing
        if exchange is not None:
            if exchange.waiter is None and not exchange.complete and len(body) <= BODY_HIGH_WATER - exchange.unread:
                exchange.chunks.append(body)  # Exchange.feed's usual case written out (a call fewer)
                exchange.unread += len(body)
                exchange.received += len(body)
            else:
                exchange.feed(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        exchange = self.parsing
        if exchange is not None:
            exchange.body_deadline = 0.0
            exchange.more_body = False  # the body is whole: wake a receive() waiting for more
            if exchange.waiter is not None:
                exchange._wake()
        self.parsing = None

    # ------------------------------------------------------------ exchanges

    def _launch(self, exchange: Exchange) -> None:
        """Run the app's first step now; give it a task only when it has to wait."""
        try:
            awaited = run_first_step(exchange.run(self.app), exchange.resume)
        except BaseException:  # run() handles the app's errors: this is ours
            logger.exception("HTTP exchange failed to start")
            self.abort()
            return
        if awaited is not None:
            exchange.awaited = awaited

    def _launch_pipelined(self, exchange: Exchange) -> None:
        if not self.closing:
            self._launch(exchange)

    def response_complete(self, exchange: Exchange) -> None:
        """The answer is on the wire: close, or arm keep-alive (the next pipelined request starts when the app returns)."""
        self.server_state.total_requests += 1
        if not exchange.keep_alive or self.upgrade_seen:
            self.close()
        elif exchange.more_body and self.parsing is exchange:
            # Answered before its body was read (an error): the rest of the body cannot be skipped reliably.
            self.close()

    def exchange_finished(self, exchange: Exchange) -> None:
        """The app returned; start the next pipelined exchange or wait (idle) for one."""
        self.active = None
        if self.closing:
            return
        if self.pipeline:
            exchange = self.pipeline.popleft()
            self.active = exchange
            if not self.pipeline:
                self.resume_reading()
            self.loop.call_soon(self._launch_pipelined, exchange)  # not inside the finished app's own step
        elif self._failure is not None:
            self._reject(*self._failure)
        elif self.shutting_down:
            self.close()
        else:
            self._idle_deadline = deadline = self.loop.time() + self.keep_alive_timeout
            if deadline < self._watchdog_at:
                self._arm_watchdog(deadline)

    def shutdown(self) -> None:
        """Called by uvicorn for a graceful stop: idle connections close, busy ones after their answer."""
        self.shutting_down = True
        if self.active is None:
            self.close()
        elif not self.active.complete:
            self.active.keep_alive = False

    # ------------------------------------------------------------ transport helpers

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.transport.close()

    def abort(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def pause_reading(self) -> None:
        if not self.read_paused and not self.closing:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused and not self.closing and not self.pipeline and self._failure is None:
            active = self.active
            if active is not None and active.unread > BODY_HIGH_WATER:
                return
            self.read_paused = False
            self.transport.resume_reading()

    def _reject(self, status: int, message: str) -> None:
        """A protocol-level error: answer it when no response is under way, then close."""
        if self.closing:
            return
        active = self.active
        if active is None or active.complete:  # never two answers to one request
            body = error_body(message)
            self.transport.write(
                STATUS_LINES[status] + b"content-type: application/json\r\ncontent-length: "
                + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body
            )
        self.close()

    def _protocol_error(self, status: int, message: str) -> None:
        """The request being parsed is malformed: parse nothing more, answer `status` in its turn, close.

        When the bad part is the body of the request whose app runs, the app (waiting for that
        body) is told the client left and the error is the answer; requests before the bad one
        are answered first."""
        self._failure = (status, message)
        self._in_headers = False  # no header deadline for a request that will not run
        bad, self.parsing = self.parsing, None
        if bad is not None and bad is self.active:
            if bad.started:  # an answer is under way: it cannot be followed by another
                self.close()
                return
            bad.started = bad.complete = True  # the app gets a disconnect and answers nothing
            self.active = None
            if self._to_launch is bad:
                self._to_launch = None
            bad.lose()
        elif bad is not None:  # pipelined, its app never ran
            bad.complete = True
            if bad in self.pipeline:
                self.pipeline.remove(bad)
        if self.active is None and not self.pipeline:
            self._reject(status, message)
        else:
            self.pause_reading()

    def _body_too_late(self, exchange: Exchange) -> None:
        """408 for a request whose body did not arrive in time (unless its answer is already under way)."""
        received = exchange.received
        if exchange is self.active and not exchange.started:
            exchange.started = exchange.complete = True  # the app, still waiting for the body, answers nothing
            self.active = None
            self._reject(408, f"request body was not received within {self.body_timeout:g} seconds (received {received} bytes)")
        self.abort()
        exchange.lose()

    # ------------------------------------------------------------ the watchdog

    def _arm_watchdog(self, deadline: float) -> None:
        """Make sure the timer fires no later than `deadline` (it re-arms itself for later deadlines).
        Per-request callers first compare with `_watchdog_at` themselves: this call is rarely needed."""
        if deadline >= self._watchdog_at:
            return
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._watchdog = self.loop.call_at(deadline, self._on_watchdog)
        self._watchdog_at = deadline

    def _on_watchdog(self) -> None:
        self._watchdog = None
        self._watchdog_at = math.inf
        if self.closing:
            return
        now = self.loop.time()
        parsing = self.parsing
        if self._in_headers:
            if now >= self._header_deadline:
                self._reject(408, f"request headers were not received within {self.header_timeout:g} seconds")
            else:
                self._arm_watchdog(self._header_deadline)
        elif parsing is not None and parsing.body_deadline:
            if now >= parsing.body_deadline:
                self._body_too_late(parsing)
            else:
                self._arm_watchdog(parsing.body_deadline)
        elif self._idle_deadline and self.active is None and self.parsing is None:
            if now >= self._idle_deadline:
                self.close()  # idle keep-alive connection, or one that never sent a request
            else:
                self._arm_watchdog(self._idle_deadline)


def _default_head(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The server's default headers as response head lines, written as they are into every answer;
    None when one needs Exchange._start's checks (a CR or LF, Content-Length, Connection)."""
    lines = []
    for name, value in headers:
        if CR in value or LF in value or CR in name or LF in name or name.lower() in (b"content-length", b"connection"):
            return None
        lines.append(b"%s: %s\r\n" % (name, value))
    return b"".join(lines)


def _address(value: Any) -> tuple[str, int] | None:
    if isinstance(value, (tuple, list)) and len(value) >= 2:
        return (str(value[0]), int(value[1]))
    return None


