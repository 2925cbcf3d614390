"""Core side of relayed gRPC calls: the core's own servicer and health service run them.

A frontend worker relays every gRPC call except a ModelInfer it decodes alone, as the method name,
the invocation metadata and the serialized request message(s). The handler is the one the gRPC port
serves without workers (tritonclient's generated table over InferenceServicer, and the health
service), so answers, status codes and messages are the single server's by construction. The
worker's grpcio server already ran the guard (restricted protocols, header forwarding, model names).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import grpc
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from naiad.frontends.grpc.health import health_handler
from naiad.frontends.grpc.servicer import InferenceServicer

if TYPE_CHECKING:
    from naiad.core.facade import ServerAPI

log = logging.getLogger("naiad.frontends")


class _CallDetails(NamedTuple):
    method: str
    invocation_metadata: Sequence[tuple[str, Any]]


class _HandlerTable:
    """Stands in for a grpc server to collect the handlers the generated code and the health service add."""

    def __init__(self) -> None:
        self.handlers: list[grpc.GenericRpcHandler] = []

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self.handlers.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        """The same handlers again, by name: the generic ones already answer them."""


class RelayedAbort(grpc.aio.AbortError):
    """context.abort() of a relayed call: the status the worker ends the client's call with."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code = code
        self.details = details


class RelayedContext:
    """The part of grpc.aio.ServicerContext the servicer uses (metadata and abort)."""

    def __init__(self, metadata: Sequence[tuple[str, Any]]) -> None:
        self._metadata = tuple(metadata)

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise RelayedAbort(code, details)


class GrpcCalls:
    """Runs the gRPC calls frontend workers relay, through the core's servicer."""

    def __init__(self, server: ServerAPI) -> None:
        table = _HandlerTable()
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(server), table)
        table.add_generic_rpc_handlers((health_handler(server),))
        self._generic = table.handlers

    def _handler(self, method: str, metadata: Sequence[tuple[str, Any]]) -> grpc.RpcMethodHandler | None:
        details = _CallDetails(method, metadata)
        for generic in self._generic:
            handler = generic.service(details)
            if handler is not None:
                return handler
        return None

    async def run(self, method: str, metadata: Sequence[tuple[str, Any]], request: bytes | None,
                  requests: AsyncIterator[bytes], out: Callable[[bytes], None]) -> tuple[str, str]:
        """Run one call, `out` each serialized response; returns its final (status name, details)."""
        handler = self._handler(method, metadata)
        if handler is None:
            return "UNIMPLEMENTED", f"Method not found: {method}"
        context = RelayedContext(metadata)
        deserialize, serialize = handler.request_deserializer, handler.response_serializer
        try:
            if handler.unary_unary is not None:
                response = await handler.unary_unary(deserialize(request), context)
                out(serialize(response))
            elif handler.stream_stream is not None:
                async def messages() -> AsyncIterator[Any]:
                    async for raw in requests:
                        yield deserialize(raw)

                async for response in handler.stream_stream(messages(), context):
                    out(serialize(response))
            else:
                return "UNIMPLEMENTED", f"Method not relayed: {method}"
        except RelayedAbort as exc:
            return exc.code.name, exc.details
        except Exception as exc:  # a bug of ours: the client gets INTERNAL, the server keeps serving
            log.exception("error running a frontend worker's gRPC call %s", method)
            return "INTERNAL", f"unexpected error: {type(exc).__name__}: {exc}"
        return "OK", ""
