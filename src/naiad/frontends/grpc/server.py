"""GrpcFrontend: binds the gRPC server hosting the inference service inside the running event loop.

Two implementations serve the same servicer, health service and guard: Naiad's own HTTP/2 server
(`--grpc-server-impl naiad`, the default, h2_server.py; its defences in docs/security.md) and
grpcio's `grpc.aio` (`--grpc-server-impl grpcio`).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from naiad.frontends.grpc.guard import Guard, GuardInterceptor
from naiad.frontends.grpc.h2_server import H2GrpcServer, ssl_context, tls_requested
from naiad.frontends.grpc.health import health_handler
from naiad.frontends.grpc.servicer import InferenceServicer

if TYPE_CHECKING:
    from naiad.config.server_config import ServerConfig
    from naiad.core.facade import ServerAPI

logger = logging.getLogger(__name__)

MAX_MESSAGE_LENGTH = 2**31 - 1  # what Triton accepts and tritonclient sends
INFERENCE_SERVICE = "inference.GRPCInferenceService"


def server_options(max_concurrent_streams: int = 0, max_receive: int = MAX_MESSAGE_LENGTH,
                   reuse_port: bool = False) -> list[tuple[str, Any]]:
    """Channel options: INT32_MAX messages like Triton (received ones up to --grpc-max-message-size), no
    silent port sharing (SO_REUSEPORT; grpcio frontend worker processes share the port on purpose), and the
    per-connection stream cap (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS) when one is set."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", MAX_MESSAGE_LENGTH),
        ("grpc.max_receive_message_length", min(max_receive, MAX_MESSAGE_LENGTH)),
        ("grpc.so_reuseport", 1 if reuse_port else 0),
    ]
    if max_concurrent_streams > 0:
        options.append(("grpc.max_concurrent_streams", max_concurrent_streams))
    return options


def _read(path: str, flag: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise OSError(f"{flag}: cannot read '{path}': {exc.strerror or exc}") from None


def server_credentials(config: Any) -> grpc.ServerCredentials | None:
    """TLS credentials from --grpc-use-ssl[-mutual] and the PEM files, or None for a plaintext port."""
    if not tls_requested(config):
        return None
    pair = (_read(config.grpc_server_key, "--grpc-server-key"), _read(config.grpc_server_cert, "--grpc-server-cert"))
    root = _read(config.grpc_root_cert, "--grpc-root-cert") if config.grpc_root_cert else None
    return grpc.ssl_server_credentials([pair], root_certificates=root, require_client_auth=bool(config.grpc_use_ssl_mutual))


def bind_address(host: str, port: int) -> str:
    """`host:port`, bracketing a bare IPv6 address."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def h2_server(config: Any) -> H2GrpcServer:
    """Naiad's own gRPC server with the guard and the limits of the server's flags (no handlers yet)."""
    return H2GrpcServer(
        guard=Guard(config.grpc_restricted_protocol, config.grpc_header_forward_pattern),
        max_concurrent_streams=config.grpc_max_concurrent_streams,
        max_concurrent_rpcs=config.grpc_max_concurrent_rpcs,
        request_timeout=config.grpc_incomplete_request_timeout_secs,
        max_message_size=config.grpc_max_message_size,
        max_decompressed_size=config.grpc_max_decompressed_size,
    )


def tls_context(config: Any) -> ssl.SSLContext | None:
    """The own server's TLS context from the server's flags (None: plaintext); OSError names an unreadable file."""
    return ssl_context(config, _read)


async def start_grpcio(config: ServerConfig, host: str, port: int, register: Callable[[grpc.aio.Server], None],
                       reuse_port: bool = False) -> tuple[grpc.aio.Server, int]:
    """The one grpcio set-up, of the core's gRPC port and of every frontend worker's: message and
    stream limits, the guard, the call cap, TLS; `register` adds the services. Binds host:port
    (`reuse_port`: share a port the core reserved), starts, returns (server, bound port)."""
    credentials = server_credentials(config)
    grpc_server = grpc.aio.server(
        options=server_options(config.grpc_max_concurrent_streams, config.grpc_max_message_size, reuse_port),
        interceptors=[GuardInterceptor(config.grpc_restricted_protocol, config.grpc_header_forward_pattern)],
        maximum_concurrent_rpcs=config.grpc_max_concurrent_rpcs or None,
    )
    register(grpc_server)
    address = bind_address(host, port)
    try:
        bound = grpc_server.add_insecure_port(address) if credentials is None else grpc_server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        raise OSError(f"cannot bind the gRPC frontend to {address}: {exc}") from None
    if bound == 0 or (port and bound != port):
        raise OSError(f"cannot bind the gRPC frontend to {address}")
    await grpc_server.start()
    return grpc_server, bound


def serving_h2_server(server: ServerAPI) -> H2GrpcServer:
    """Naiad's own gRPC server with the inference and health services of `server` (not listening yet)."""
    config = server.config
    h2 = h2_server(config)
    servicer = InferenceServicer(server, serialized_responses=True)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, h2)
    if not config.grpc_header_forward_pattern:  # forwarding adds parameters to the parsed message
        h2.add_registered_method_handlers(INFERENCE_SERVICE, {"ModelInfer": servicer.serialized_infer_handler()})
    h2.add_generic_rpc_handlers((health_handler(server),))
    return h2


class GrpcFrontend:
    """The gRPC listener of a Naiad server; runs in the event loop `naiad serve` owns."""

    def __init__(self, server: ServerAPI, host: str, port: int) -> None:
        self._server = server
        self._host = host
        self._port = port
        self._grpc: grpc.aio.Server | None = None
        self._h2: H2GrpcServer | None = None

    async def start(self) -> int:
        """Bind and start serving; returns the bound port (port 0 picks a free one)."""
        if getattr(self._server.config, "grpc_server_impl", "naiad") == "grpcio":
            return await self._start_grpcio()
        return await self._start_naiad()

    async def _start_naiad(self) -> int:
        config = self._server.config
        context = tls_context(config)
        h2 = serving_h2_server(self._server)
        try:
            port = await h2.start(self._host, self._port, context)
        except OSError as exc:
            raise OSError(f"cannot bind the gRPC frontend to {bind_address(self._host, self._port)}: {exc}") from None
        self._h2 = h2
        logger.debug("gRPC frontend (naiad HTTP/2) listening on %s", bind_address(self._host, port))
        return port

    async def _start_grpcio(self) -> int:
        def register(grpc_server: grpc.aio.Server) -> None:
            pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(self._server), grpc_server)
            grpc_server.add_generic_rpc_handlers((health_handler(self._server),))

        self._grpc, port = await start_grpcio(self._server.config, self._host, self._port, register)
        logger.debug("gRPC frontend listening on %s", bind_address(self._host, port))
        return port

    async def stop(self) -> None:
        """Stop accepting calls, let in-flight calls finish within the server's exit timeout, then close."""
        if self._h2 is not None:
            h2, self._h2 = self._h2, None
            await h2.stop(self._server.config.exit_timeout_secs)
            return
        if self._grpc is None:
            return
        grpc_server, self._grpc = self._grpc, None
        await grpc_server.stop(self._server.config.exit_timeout_secs)
