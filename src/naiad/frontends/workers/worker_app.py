"""The HTTP/REST application of a frontend worker: infer is decoded and encoded here, the rest is relayed.

A POST infer whose body decodes cleanly (JSON, binary tensors, shared-memory references, which the
core reads; not a raw binary body) becomes an InferenceRequest sent to the core; its response is
encoded here. Every other request, any infer body this process cannot decode alone, and every
request when --http-restricted-api is set (the core's guard decides), is relayed whole to the
core's own HTTP application: answers and the precedence of errors stay exactly the single server's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from naiad.config.server_config import ServerConfig
from naiad.frontends.http.binary_memo import BinaryHeaderMemo
from naiad.frontends.http.body import (
    Receive,
    RequestHeaders,
    body_at_hand,
    body_timeout,
    decompress_body,
    read_body,
)
from naiad.frontends.http.disconnect import DisconnectWatch, until_disconnect
from naiad.frontends.http.errors import ClientDisconnected, HttpError, status_and_message
from naiad.frontends.http.infer_codec import encode_infer_response, parse_header_length
from naiad.frontends.http.infer_handler import DECOUPLED_MESSAGE
from naiad.frontends.http.responses import Send, send_error, send_infer_answer
from naiad.frontends.http.routes import INFER_PATH, FastRoute, FastRoutes
from naiad.frontends.security import header_forwarder
from naiad.frontends.workers.channel import UnsendableMessage
from naiad.frontends.workers.core_client import CoreClient
from naiad.observability.trace_context import find_traceparent
from naiad.protocol.errors import DecoupledModelError, NaiadError, unsupported

log = logging.getLogger("naiad.http")


class _CoreOnly(Exception):
    """The request needs state only the core holds (the model config of a raw binary body): relay it."""


class WorkerApp:
    """ASGI 3 callable of one worker process."""

    def __init__(self, config: ServerConfig, core: CoreClient) -> None:
        self.config = config
        self.core = core
        self.forward_headers = header_forwarder(config.http_header_forward_pattern)
        self.binary_memo = BinaryHeaderMemo()
        # the HTTP port's fast-route memo: each infer path is matched once (the pattern costs ~2k
        # instructions a request), within the same bounds as the core's own port
        self._fast = FastRoutes((FastRoute("/infer", INFER_PATH, self._infer, lambda match: (match.group(1), match.group(2) or "")),))

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if scope["method"] == "POST" and not self.config.http_restricted_api:
            fast = self._fast
            target = fast.known[path] if path in fast.known else fast.target(path)
            if target is not None:
                handler, arguments = target
                await handler(scope, receive, send, *arguments)
                return
        body = await self._read(scope, receive, send, RequestHeaders.from_scope(scope))
        if body is not None:
            await self._relay_watched(scope, receive, body, send)

    async def _read(self, scope: dict[str, Any], receive: Receive, send: Send, headers: RequestHeaders) -> bytes | None:
        """The whole (bounded) body, or None once the error is answered or the client is gone."""
        if not headers.may_have_body():
            return b""
        limit = self.config.http_max_input_size
        try:
            body = body_at_hand(scope, receive, headers, limit)  # (all of it arrived: no wait, no receive())
            if body is not None:
                return body
            return await read_body(receive, headers, limit, body_timeout(scope, self.config.http_body_timeout_secs))
        except ClientDisconnected:
            return None
        except (NaiadError, HttpError) as exc:
            await self._refuse_body(send, exc)
            return None

    @staticmethod
    async def _refuse_body(send: Send, exc: NaiadError | HttpError) -> None:
        status, message = status_and_message(exc)
        await send_error(send, status, message, close=getattr(exc, "close", False), headers=getattr(exc, "headers", None))

    async def _relay_watched(self, scope: dict[str, Any], receive: Receive, body: bytes, send: Send) -> None:
        """Relay, cancelling the core's work if the client goes away."""
        try:
            await until_disconnect(receive, self._relay(scope, body, send), scope)
        except ClientDisconnected:
            return

    async def _relay(self, scope: dict[str, Any], body: bytes, send: Send) -> None:
        started = False
        try:
            async for message in self.core.relay(scope, body):
                started = True
                await send(message)
        except NaiadError as exc:
            if not started:
                status, text = status_and_message(exc)
                await send_error(send, status, text)
            return
        if not started:
            await send_error(send, 503, "Server not ready")

    async def _infer(self, scope: dict[str, Any], receive: Receive, send: Send, model: str, version: str) -> None:
        headers = RequestHeaders.from_scope(scope)
        try:
            # the usual body, all of it arrived: taken here, without _read's coroutine (which takes the
            # rest of the bodies, and refuses them as this does)
            body = body_at_hand(scope, receive, headers, self.config.http_max_input_size) if headers.may_have_body() else b""
        except ClientDisconnected:
            return
        except (NaiadError, HttpError) as exc:
            await self._refuse_body(send, exc)
            return
        if body is None:
            body = await self._read(scope, receive, send, headers)
            if body is None:
                return
        try:
            plain = body if headers.content_encoding is None else decompress_body(
                body, headers.content_encoding, self.config.http_max_input_size)
            header_length = parse_header_length(headers.infer_header_length, len(plain))
            if header_length == 0:
                raise _CoreOnly("a raw binary body is shaped by the model config")
            request, plan = self.binary_memo.decode(model, version, plain, header_length)
        except (NaiadError, HttpError, _CoreOnly):
            # the core answers it, in the single server's order (an unknown model is a 404 whatever the body)
            await self._relay_watched(scope, receive, body, send)
            return
        if self.forward_headers is not None:
            self.forward_headers.apply(scope["headers"], request.parameters)
        try:
            hook = scope["extensions"].get("naiad.on_disconnect") if "extensions" in scope else None
            if hook is not None:
                # until_disconnect(self.core.infer(...)) written out in this coroutine, as the core's own
                # infer handler does: two coroutines fewer to make and to resume through (with the
                # codec's and channel's changes made beside it, ~5.5k fewer instructions per request)
                with DisconnectWatch(hook):
                    request_id, answer = self.core.submit(request, find_traceparent(scope["headers"]))
                    try:
                        response = await answer
                    except asyncio.CancelledError:
                        self.core.withdraw(request_id)
                        raise
            else:
                response = await until_disconnect(receive, self.core.infer(request, find_traceparent(scope["headers"])),
                                                  scope)
            payload, json_length = encode_infer_response(response, plan)
        except ClientDisconnected:
            return
        except UnsendableMessage:  # parameters nested past what pickle carries: the core decodes the body itself
            await self._relay_watched(scope, receive, body, send)
            return
        except DecoupledModelError:
            status, message = status_and_message(unsupported(DECOUPLED_MESSAGE))
            await send_error(send, status, message)
            return
        except NaiadError as exc:
            status, message = status_and_message(exc)
            await send_error(send, status, message)
            return
        except Exception as exc:  # a bug of ours: answer 500, keep serving
            log.exception("error handling infer for model '%s'", model)
            await send_error(send, 500, f"internal server error: {type(exc).__name__}: {exc}")
            return
        answer = send_infer_answer(send, payload, json_length, headers.accept_encoding,
                                   scope["extensions"].get("naiad.send_response") if "extensions" in scope else None)
        if answer is not None:
            await answer
