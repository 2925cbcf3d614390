"""What answers at host:port, to say what is wrong before a run: nothing, an HTTP/1.1 server, or HTTP/2 (gRPC)."""

from __future__ import annotations

import socket

NOTHING, HTTP1, HTTP2, SILENT, OTHER = "nothing", "http/1.1", "http/2", "silent", "other"
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS_FRAME = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame


def _read(sock: socket.socket) -> bytes:
    try:
        return sock.recv(64)
    except (TimeoutError, OSError):
        return b""


def probe(host: str, port: int, protocol: str, timeout: float = 3.0) -> str:
    """Speaks the protocol the run will use and classifies the first bytes of the answer."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except ConnectionRefusedError:
        return NOTHING
    except OSError:
        return NOTHING
    with sock:
        try:
            if protocol == "grpc":
                sock.sendall(HTTP2_PREFACE + SETTINGS_FRAME)
            else:
                sock.sendall(f"GET /v2/health/live HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        except OSError:
            return SILENT
        head = _read(sock)
    if head.startswith(b"HTTP/1."):
        return HTTP1
    if len(head) >= 9 and head[3] in (0x04, 0x07):  # an HTTP/2 frame: SETTINGS or GOAWAY
        return HTTP2
    return SILENT if not head else OTHER


def wrong_endpoint(host: str, port: int, protocol: str) -> str:
    """A sentence saying why host:port cannot serve this run ("" when it speaks the expected protocol)."""
    found = probe(host, port, protocol)
    where = f"{host}:{port}"
    if found == NOTHING:
        return f"nothing is listening on {where}"
    if protocol == "grpc" and found == HTTP1:
        return f"{where} answered with HTTP/1.1, not gRPC: drop -i grpc, or give the gRPC port (default 8001)"
    if protocol != "grpc" and found == HTTP2:
        return f"{where} answered with HTTP/2 (gRPC?): use -i grpc, or give the HTTP port (default 8000)"
    if found == OTHER:
        expected = "gRPC (HTTP/2)" if protocol == "grpc" else "HTTP/1.1"
        return f"{where} does not answer in {expected}"
    return ""
