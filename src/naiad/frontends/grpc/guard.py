"""One interceptor in front of every RPC: restricted protocols, unsafe model names, header forwarding."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from naiad.frontends.grpc.status import status_of
from naiad.frontends.security import (
    GRPC_HEADER_PREFIX,
    GRPC_MODEL_NAME_FIELDS,
    GRPC_RPC_GROUPS,
    HeaderForwarder,
    Restriction,
    check_model_name,
    grpc_restriction_message,
    metadata_value,
    parse_restrictions,
)
from naiad.protocol.errors import NaiadError

_INFER_RPCS = frozenset(("ModelInfer", "ModelStreamInfer"))


def _rpc_name(method: str) -> str:
    """`/inference.GRPCInferenceService/ModelInfer` -> `ModelInfer`."""
    return method.rsplit("/", 1)[-1]


def _same_kind(handler: grpc.RpcMethodHandler, unary: Callable[..., Awaitable[Any]] | None,
               streaming: Callable[..., Any] | None) -> grpc.RpcMethodHandler:
    """A handler of the same shape (and serializers) as `handler` running other behaviours."""
    kwargs = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary, **kwargs)
    if handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(streaming, **kwargs)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(streaming, **kwargs)
    return grpc.stream_unary_rpc_method_handler(unary, **kwargs)


def _refused(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)

    return _same_kind(handler, refuse, refuse)


def _checking_names(handler: grpc.RpcMethodHandler, field: str) -> grpc.RpcMethodHandler:
    """Unary handler that refuses (INVALID_ARGUMENT) a request whose model name could escape the repository."""
    inner = handler.unary_unary

    async def checked(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            check_model_name(getattr(request, field))
        except NaiadError as err:
            await context.abort(status_of(err), err.message)
        return await inner(request, context)

    return _same_kind(handler, checked, None)


def _forwarding(handler: grpc.RpcMethodHandler, forwarder: HeaderForwarder) -> grpc.RpcMethodHandler:
    """Infer handlers whose requests get the matching metadata as string parameters."""

    def add(request: Any, params: dict[str, str]) -> Any:
        for key, value in params.items():
            if key not in request.parameters:
                request.parameters[key].string_param = value
        return request

    if handler.unary_unary is not None:
        inner_unary = handler.unary_unary

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            params = forwarder.forwarded(context.invocation_metadata() or ())
            return await inner_unary(add(request, params), context)

        return _same_kind(handler, unary, None)
    inner_stream = handler.stream_stream

    async def streaming(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        params = forwarder.forwarded(context.invocation_metadata() or ())

        async def with_params() -> AsyncIterator[Any]:
            async for request in requests:
                yield add(request, params)

        async with contextlib.aclosing(inner_stream(with_params(), context)) as responses:
            async for response in responses:
                yield response

    return _same_kind(handler, None, streaming)


class Guard:
    """`--grpc-restricted-protocol`, `--grpc-header-forward-pattern` and the model-name rule, for either server.

    `apply` is synchronous and keeps the wrapped handler of each method, so a call pays for a
    dictionary lookup (and the restriction check when one applies to its RPC group).
    """

    def __init__(self, restricted: list[str], forward_pattern: str) -> None:
        self.restrictions: dict[str, Restriction] = parse_restrictions(
            restricted, "grpc-restricted-protocol", GRPC_HEADER_PREFIX
        )
        self.forwarder = HeaderForwarder(forward_pattern) if forward_pattern else None
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def apply(self, method: str, handler: grpc.RpcMethodHandler | None, metadata: Any) -> grpc.RpcMethodHandler | None:
        """The handler to run for a call of `method` with this invocation metadata."""
        if handler is None:
            return None
        rpc = _rpc_name(method)
        if self.restrictions:
            restriction = self.restrictions.get(GRPC_RPC_GROUPS.get(rpc, ""))
            if restriction is not None and not restriction.allows(metadata_value(metadata, restriction.key)):
                return _refused(handler, grpc.StatusCode.UNAVAILABLE, grpc_restriction_message(restriction.key))
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(rpc, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, rpc: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if rpc in _INFER_RPCS:
            # ModelInfer / ModelStreamInfer model names are checked per request, before it is decoded (servicer)
            return _forwarding(handler, self.forwarder) if self.forwarder is not None else handler
        field = GRPC_MODEL_NAME_FIELDS.get(rpc)
        if field is not None and handler.unary_unary is not None:
            return _checking_names(handler, field)
        return handler


class GuardInterceptor(grpc.aio.ServerInterceptor):
    """The Guard as a grpc.aio interceptor (the grpcio server implementation)."""

    def __init__(self, restricted: list[str], forward_pattern: str) -> None:
        self.guard = Guard(restricted, forward_pattern)
        self.restrictions = self.guard.restrictions
        self.forwarder = self.guard.forwarder

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        return self.guard.apply(details.method, handler, details.invocation_metadata)
