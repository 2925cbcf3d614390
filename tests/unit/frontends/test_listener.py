"""The listener set-ups on real loopback sockets: HttpListener (port 0, a taken port, TLS settings refused early,
stop closes the port) and start_grpcio (the grpcio gRPC port, in the core and in frontend workers)."""

from __future__ import annotations

import asyncio
import errno
import socket

import grpc
import pytest

from naiad.config.server_config import ServerConfig
from naiad.frontends.grpc.server import start_grpcio
from naiad.frontends.http.listener import HttpListener


async def _hello(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def _get(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: naiad\r\nConnection: close\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


def test_port_zero_serves_and_stop_closes_the_port():
    async def scenario() -> tuple[int, bytes]:
        listener = HttpListener.for_server(_hello, ServerConfig(), "127.0.0.1", 0, "test")
        port = await listener.start()
        try:
            answer = await _get(port)
        finally:
            await listener.stop()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", port)
        return port, answer

    port, answer = asyncio.run(scenario())
    assert port > 0 and answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok")


def test_a_taken_port_fails_with_the_os_errno_and_the_listener_can_start_later():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]

    async def scenario() -> bytes:
        listener = HttpListener.for_server(_hello, ServerConfig(), "127.0.0.1", port, "test")
        with pytest.raises(OSError) as refused:
            await listener.start()
        assert refused.value.errno == errno.EADDRINUSE  # what the start-up message names the flag from
        holder.close()
        await listener.start()
        try:
            return await _get(port)
        finally:
            await listener.stop()

    try:
        assert asyncio.run(scenario()).endswith(b"ok")
    finally:
        holder.close()


def test_a_missing_certificate_fails_the_start_and_frees_the_port(tmp_path):
    async def scenario() -> None:
        listener = HttpListener.for_server(_hello, ServerConfig(), "127.0.0.1", 0, "test",
                                           tls={"ssl_certfile": str(tmp_path / "missing.pem")})
        with pytest.raises(OSError, match="test failed to start on 127.0.0.1"):
            await listener.start()
        assert listener._socket is None  # the bound socket was closed, not leaked

    asyncio.run(scenario())


class _Echo(grpc.GenericRpcHandler):
    def service(self, handler_call_details):
        if handler_call_details.method != "/test.Echo/Say":
            return None

        async def say(request: bytes, context) -> bytes:
            return request

        return grpc.unary_unary_rpc_method_handler(say)


def test_grpcio_set_up_serves_and_refuses_a_taken_port():
    """start_grpcio is the core's grpcio port and every frontend worker's: one set-up for both."""
    async def scenario() -> tuple[bytes, str, bytes]:
        first, port = await start_grpcio(ServerConfig(), "127.0.0.1", 0, lambda s: s.add_generic_rpc_handlers((_Echo(),)))
        try:
            with pytest.raises(OSError) as taken:
                await start_grpcio(ServerConfig(), "127.0.0.1", port, lambda s: None)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                answer = await channel.unary_unary("/test.Echo/Say")(b"hello", timeout=10)
                again = await channel.unary_unary("/test.Echo/Say")(b"still serving", timeout=10)
        finally:
            await first.stop(0)
        return answer, str(taken.value), again

    answer, message, again = asyncio.run(scenario())
    assert answer == b"hello" and again == b"still serving"
    assert "cannot bind the gRPC frontend to 127.0.0.1:" in message
