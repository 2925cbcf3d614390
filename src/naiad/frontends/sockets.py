"""The listening socket every port Naiad opens itself binds (the HTTP-style ports and Naiad's own HTTP/2 gRPC server)."""

from __future__ import annotations

import socket

BACKLOG = 2048


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0 = any free port); IPv6 when the host is IPv6."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, socktype, proto, _, address = infos[0]
    sock = socket.socket(family, socktype, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and host in ("::", ""):
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def reserve_port(host: str, port: int) -> socket.socket:
    """A bound, not listening, SO_REUSEPORT socket holding host:port (port 0 = a free port) for the
    frontend worker processes that bind it too (grpcio with `grpc.so_reuseport`); it accepts nothing."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, socktype, proto, _, address = infos[0]
    sock = socket.socket(family, socktype, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6 and host in ("::", ""):
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock
