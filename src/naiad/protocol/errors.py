"""The one error table: every error is a NaiadError whose code maps to an HTTP status and a gRPC code."""

from __future__ import annotations

import enum
from typing import Any


class ErrorCode(enum.Enum):
    """Triton's error classes; each carries (HTTP status, gRPC status name)."""

    UNKNOWN = (400, "UNKNOWN")
    INTERNAL = (500, "INTERNAL")
    NOT_FOUND = (404, "NOT_FOUND")
    INVALID_ARG = (400, "INVALID_ARGUMENT")
    UNAVAILABLE = (503, "UNAVAILABLE")
    UNSUPPORTED = (501, "UNIMPLEMENTED")
    ALREADY_EXISTS = (400, "ALREADY_EXISTS")
    CANCELLED = (400, "CANCELLED")

    @property
    def http_status(self) -> int:
        return self.value[0]

    @property
    def grpc_status_name(self) -> str:
        return self.value[1]


class NaiadError(Exception):
    """An error a client can act on: a code from the table and a message."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"NaiadError({self.code.name}, {self.message!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Errors cross process boundaries (worker processes, the facade's callers) as values.
        return NaiadError, (self.code, self.message)


class DecoupledModelError(NaiadError):
    """A one-response API was used on a decoupled model; each frontend words this its own way."""

    def __init__(self, model_name: str) -> None:
        super().__init__(ErrorCode.UNSUPPORTED, f"model '{model_name}' is decoupled: use a streaming API")
        self.model_name = model_name

    def __reduce__(self) -> tuple[Any, ...]:
        return DecoupledModelError, (self.model_name,)


def invalid_arg(message: str) -> NaiadError:
    return NaiadError(ErrorCode.INVALID_ARG, message)


def not_found(message: str) -> NaiadError:
    return NaiadError(ErrorCode.NOT_FOUND, message)


def unavailable(message: str) -> NaiadError:
    return NaiadError(ErrorCode.UNAVAILABLE, message)


def unsupported(message: str) -> NaiadError:
    return NaiadError(ErrorCode.UNSUPPORTED, message)


def internal(message: str) -> NaiadError:
    return NaiadError(ErrorCode.INTERNAL, message)


def request_prefix(request_id: str) -> str:
    """Triton prefixes request-validation errors with the request id."""
    return f"[request id: {request_id or '<id_unknown>'}] "
