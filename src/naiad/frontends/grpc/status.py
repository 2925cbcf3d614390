"""NaiadError -> gRPC status: the abort helper and the guard every unary handler runs under."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from naiad.protocol.errors import ErrorCode, NaiadError

logger = logging.getLogger(__name__)

_STATUS = {code: grpc.StatusCode[code.grpc_status_name] for code in ErrorCode}

R = TypeVar("R")


def status_of(err: NaiadError) -> grpc.StatusCode:
    """The gRPC status code of an error (the one table in naiad.protocol.errors)."""
    return _STATUS[err.code]


def error_of(exc: BaseException) -> NaiadError:
    """Any exception as a NaiadError; unexpected ones become INTERNAL and are logged."""
    if isinstance(exc, NaiadError):
        return exc
    logger.exception("unexpected error in gRPC handler", exc_info=exc)
    return NaiadError(ErrorCode.INTERNAL, f"unexpected error: {type(exc).__name__}: {exc}")


def guarded(
    handler: Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]],
) -> Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]:
    """Wrap a unary handler: a NaiadError aborts the RPC with its mapped code and message."""

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            return await handler(self, request, context)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:
            err = error_of(exc)
        await context.abort(status_of(err), err.message)
        raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises

    return wrapper
