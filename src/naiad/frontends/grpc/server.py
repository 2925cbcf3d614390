"""GrpcFrontend: binds the grpc.aio server hosting the inference service inside the running event loop."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import grpc
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from naiad.frontends.grpc.health import health_handler
from naiad.frontends.grpc.servicer import InferenceServicer

if TYPE_CHECKING:
    from naiad.core.server import Server

logger = logging.getLogger(__name__)

MAX_MESSAGE_LENGTH = 2**31 - 1  # what Triton accepts and tritonclient sends


def server_options() -> list[tuple[str, Any]]:
    """Channel options: INT32_MAX messages like Triton, and no silent port sharing (SO_REUSEPORT)."""
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_LENGTH),
        ("grpc.max_receive_message_length", MAX_MESSAGE_LENGTH),
        ("grpc.so_reuseport", 0),
    ]


def bind_address(host: str, port: int) -> str:
    """`host:port`, bracketing a bare IPv6 address."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


class GrpcFrontend:
    """The gRPC listener of a Naiad server; runs in the event loop `naiad serve` owns."""

    def __init__(self, server: Server, host: str, port: int) -> None:
        self._server = server
        self._host = host
        self._port = port
        self._grpc: grpc.aio.Server | None = None

    async def start(self) -> int:
        """Bind and start serving; returns the bound port (port 0 picks a free one)."""
        grpc_server = grpc.aio.server(options=server_options())
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(self._server), grpc_server)
        grpc_server.add_generic_rpc_handlers((health_handler(self._server),))
        address = bind_address(self._host, self._port)
        try:
            port = grpc_server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"cannot bind the gRPC frontend to {address}: {exc}") from None
        if port == 0:
            raise OSError(f"cannot bind the gRPC frontend to {address}")
        await grpc_server.start()
        self._grpc = grpc_server
        logger.debug("gRPC frontend listening on %s", bind_address(self._host, port))
        return port

    async def stop(self) -> None:
        """Stop accepting calls, let in-flight calls finish within the server's exit timeout, then close."""
        if self._grpc is None:
            return
        grpc_server, self._grpc = self._grpc, None
        await grpc_server.stop(self._server.config.exit_timeout_secs)
