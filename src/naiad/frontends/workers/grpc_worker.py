"""The gRPC port in a frontend worker: ModelInfer decoded here, the rest relayed to the core.

The server is Naiad's own HTTP/2 server serving the connections the core hands over (handoff.py),
with its per-connection budgets and the guard; or, with `--grpc-server-impl grpcio`, grpcio binding
the port the core reserved (SO_REUSEPORT). Both host the same handlers (WorkerHandlers).

A ModelInfer whose message decodes cleanly becomes an InferenceRequest sent to the core (the infer
path of the HTTP workers) and its response is encoded here; one laid out like a request seen before
is decoded from its bytes without being parsed (infer_memo.py, as on the core's own gRPC server). Every other call, and a ModelInfer that
does not decode (the core answers it in the single server's order: an unknown model is NOT_FOUND
whatever its tensors), is relayed to the core's own servicer as serialized messages:
ModelStreamInfer as a two-way stream. The guard (restricted protocols, header forwarding, model
names) runs here, in front of both.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import grpc
from tritonclient.grpc import service_pb2 as pb

from naiad.config.server_config import ServerConfig
from naiad.frontends.grpc.health import SERVICE as HEALTH_SERVICE
from naiad.frontends.grpc.infer_memo import InferDecoder, InferEncoder
from naiad.frontends.grpc.server import h2_server, start_grpcio, tls_context
from naiad.frontends.grpc.servicer import DECOUPLED_UNARY_MESSAGE, parse_infer_request
from naiad.frontends.grpc.status import error_of, status_of
from naiad.frontends.handoff import ConnectionServer
from naiad.frontends.security import check_model_name
from naiad.frontends.workers.channel import UnsendableMessage
from naiad.frontends.workers.core_client import CoreClient, RelayedStatus
from naiad.observability.trace_context import find_traceparent
from naiad.protocol.errors import DecoupledModelError, NaiadError, unsupported

log = logging.getLogger("naiad.grpc")

_SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
_MODEL_INFER = f"/{_SERVICE.full_name}/ModelInfer"


def _raw(data: bytes) -> bytes:
    return data


def _serialized(message: Any) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


def _metadata(context: grpc.aio.ServicerContext) -> tuple[tuple[str, Any], ...]:
    return tuple((key, value) for key, value in context.invocation_metadata() or ())


async def _abort(context: grpc.aio.ServicerContext, exc: Exception) -> None:
    if isinstance(exc, RelayedStatus):
        await context.abort(grpc.StatusCode[exc.code], exc.details)
    err = error_of(exc)
    await context.abort(status_of(err), err.message)


class WorkerHandlers(grpc.GenericRpcHandler):
    """Every method of the inference service and the health service, answered through the core."""

    def __init__(self, core: CoreClient, allow_shared_memory: bool) -> None:
        self.core = core
        self.allow_shared_memory = allow_shared_memory
        # request layouts and response headers seen before are remembered, as on the core's own server
        self._decoder = InferDecoder(allow_shared_memory)
        self._encode = InferEncoder().encode
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        for method in _SERVICE.methods:
            path = f"/{_SERVICE.full_name}/{method.name}"
            parse: Callable[[bytes], Any] = getattr(pb, method.input_type.name).FromString
            if path == _MODEL_INFER:
                handler = grpc.unary_unary_rpc_method_handler(self._model_infer, _raw, _raw)  # parsed if need be
            elif method.client_streaming or method.server_streaming:
                handler = grpc.stream_stream_rpc_method_handler(self._streaming(path), parse, _raw)
            else:
                handler = grpc.unary_unary_rpc_method_handler(self._unary(path), parse, _raw)
            self._handlers[path] = handler
        check = f"/{HEALTH_SERVICE}/Check"
        self._handlers[check] = grpc.unary_unary_rpc_method_handler(self._unary(check), _raw, _raw)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self._handlers.get(handler_call_details.method)

    def _unary(self, path: str) -> Callable[[Any, grpc.aio.ServicerContext], Any]:
        async def relay(request: Any, context: grpc.aio.ServicerContext) -> bytes:
            return await self._relay_unary(path, request, context)

        return relay

    async def _relay_unary(self, path: str, request: Any, context: grpc.aio.ServicerContext) -> bytes:
        result = b""
        try:
            async for response in self.core.grpc_call(path, _metadata(context), request=_serialized(request)):
                result = response
        except (RelayedStatus, NaiadError) as exc:
            await _abort(context, exc)
        return result

    def _streaming(self, path: str) -> Callable[[AsyncIterator[Any], grpc.aio.ServicerContext], AsyncIterator[bytes]]:
        async def relay(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            async def raw_requests() -> AsyncIterator[bytes]:
                async for request in requests:
                    yield _serialized(request)

            try:
                async for response in self.core.grpc_call(path, _metadata(context), requests=raw_requests()):
                    yield response
            except (RelayedStatus, NaiadError) as exc:
                await _abort(context, exc)

        return relay

    async def _model_infer(self, raw: bytes | bytearray | memoryview, context: grpc.aio.ServicerContext) -> bytes:
        # the bytes as the client sent them: a request relayed to the core goes so (decoding takes the
        # raw tensors out of the parsed message), and one laid out like a request seen before is decoded
        # from them without being parsed (as the core's own gRPC server does)
        message = raw if type(raw) is bytes else bytes(raw)
        decoded = self._decoder.decode_serialized(message)  # (its model name was checked when first decoded)
        if decoded is None:
            try:
                request = parse_infer_request(message)
            except NaiadError as exc:
                await _abort(context, exc)
                raise AssertionError("context.abort returned") from None  # pragma: no cover - abort always raises
            try:
                check_model_name(request.model_name)
                decoded = self._decoder.decode(request, message)
            except NaiadError:  # the core answers it, in the single server's order
                return await self._relay_unary(_MODEL_INFER, message, context)
        try:
            response = await self.core.infer(decoded, find_traceparent(context.invocation_metadata() or ()))
        except UnsendableMessage:  # parameters nested past what pickle carries: the core decodes the message itself
            return await self._relay_unary(_MODEL_INFER, message, context)
        except DecoupledModelError:
            await _abort(context, unsupported(DECOUPLED_UNARY_MESSAGE))
            raise AssertionError("context.abort returned") from None  # pragma: no cover - abort always raises
        except Exception as exc:
            await _abort(context, exc)
            raise AssertionError("context.abort returned") from None  # pragma: no cover - abort always raises
        return self._encode(response)


class GrpcServing(Protocol):
    """What the worker needs of either gRPC server once it serves: a graceful stop."""

    async def stop(self, grace: float) -> Any: ...


async def start_grpc(config: ServerConfig, core: CoreClient) -> tuple[GrpcServing, ConnectionServer | None]:
    """This worker's gRPC server, started, and what serves the connections the core hands over:
    Naiad's own server (it binds nothing), or grpcio binding the port the core reserved
    (`--grpc-server-impl grpcio`: no connections are handed over)."""
    handlers = WorkerHandlers(core, config.allow_client_shm)
    if config.grpc_server_impl != "grpcio":
        h2 = h2_server(config)
        h2.add_generic_rpc_handlers((handlers,))
        return h2, h2.connection_server(tls_context(config))

    def register(server: grpc.aio.Server) -> None:
        server.add_generic_rpc_handlers((handlers,))

    server, _ = await start_grpcio(config, config.grpc_address, config.grpc_port, register, reuse_port=True)
    return server, None
