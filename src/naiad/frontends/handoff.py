"""Accepted connections served by whichever process the core picks (`--frontend-processes N`, Naiad's own servers).

The core owns a port's one listening socket and accepts every connection (Acceptor). It serves a
connection itself while it serves fewer than `--frontend-core-connections` of that port's
connections: a client alone then pays no hop through a worker process (on two CPUs, one HTTP client
served by the core gets 1.4-2x the requests per second a worker relaying it does). Every other
connection goes to the frontend workers in turn, its descriptor sent over the worker's hand-off
socket (a unix SOCK_SEQPACKET pair; SCM_RIGHTS, one descriptor per message). A worker that is down
gets none; with no worker up, the core serves them all. In a worker, HandedConnections receives them.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from collections.abc import Callable, Iterable

log = logging.getLogger("naiad.frontends")

ACCEPT_BURST = 64  # connections accepted per wake-up before the loop runs anything else
ACCEPT_RETRY_SECS = 1.0  # out of descriptors or memory: accepting pauses this long (as asyncio's servers do)
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


def handoff_pair() -> tuple[socket.socket, socket.socket]:
    """(the core's end, the worker's end) of a hand-off socket."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    return ours, theirs


async def serve_accepted(protocol: Callable[[], asyncio.BaseProtocol], sock: socket.socket,
                         tls: ssl.SSLContext | None) -> None:
    """Serve an accepted connection with a new `protocol()`, after the TLS handshake when `tls` is set."""
    try:
        # small answers go out at once (asyncio's own loop leaves Nagle on for an accepted socket)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.get_running_loop().connect_accepted_socket(protocol, sock, ssl=tls)
    except (TimeoutError, OSError, ssl.SSLError) as exc:  # a client gone or failing its handshake
        log.debug("connection dropped before it was served: %r", exc)
        sock.close()


class ConnectionServer:
    """What serves a connection in one process: its server's protocol and TLS, and its open connections."""

    def __init__(self, protocol: Callable[[], asyncio.BaseProtocol], tls: ssl.SSLContext | None,
                 open_connections: Callable[[], int]) -> None:
        self.protocol = protocol
        self.tls = tls
        self.open_connections = open_connections
        # accepted, not served yet (a TLS handshake): counted, and held here (the loop keeps only weak references)
        self._opening: set[asyncio.Task[None]] = set()

    def serve(self, sock: socket.socket) -> None:
        task = asyncio.get_running_loop().create_task(serve_accepted(self.protocol, sock, self.tls))
        self._opening.add(task)
        task.add_done_callback(self._opening.discard)

    def count(self) -> int:
        return self.open_connections() + len(self._opening)


class Acceptor:
    """Accepts on `listen`; keeps up to `keep` connections for `here`, hands the rest to `outlets()`
    (the hand-off sockets of the workers that are up, asked at each connection)."""

    def __init__(self, listen: socket.socket, here: ConnectionServer, keep: int,
                 outlets: Callable[[], Iterable[socket.socket]]) -> None:
        self.listen = listen
        self.here = here
        self.keep = keep
        self.outlets = outlets
        self.handed = 0  # connections handed to workers so far (the round-robin turn)
        self._loop = asyncio.get_running_loop()
        self._retry: asyncio.TimerHandle | None = None
        listen.setblocking(False)
        self._loop.add_reader(listen.fileno(), self._accept)

    def _accept(self) -> None:
        for _ in range(ACCEPT_BURST):
            try:
                conn, _address = self.listen.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    log.error("cannot accept connections (%s); trying again in %g s", exc.strerror, ACCEPT_RETRY_SECS)
                    self._pause()
                return
            self._place(conn)

    def _place(self, conn: socket.socket) -> None:
        # (a connection its client has just closed counts until the loop reads that: the count is of
        # connections the core has not seen end, so it may keep a little fewer than `keep` for a moment)
        if self.here.count() < self.keep or not self._hand(conn):
            conn.setblocking(False)
            self.here.serve(conn)

    def _hand(self, conn: socket.socket) -> bool:
        """Send `conn` to the next worker that takes it; the core's copy is closed once sent."""
        outlets = list(self.outlets())
        for turn in range(len(outlets)):
            outlet = outlets[(self.handed + turn) % len(outlets)]
            try:
                socket.send_fds(outlet, [b"c"], [conn.fileno()])
            except OSError:  # that worker is gone or not reading: the next one
                continue
            self.handed += turn + 1
            conn.close()
            return True
        return False

    def _pause(self) -> None:
        self._loop.remove_reader(self.listen.fileno())
        self._retry = self._loop.call_later(ACCEPT_RETRY_SECS, self._resume)

    def _resume(self) -> None:
        self._retry = None
        self._loop.add_reader(self.listen.fileno(), self._accept)

    def close(self) -> None:
        """Stop accepting and close the listening socket (connections queued on it are refused)."""
        if self._retry is not None:
            self._retry.cancel()
        else:
            self._loop.remove_reader(self.listen.fileno())
        self.listen.close()


class HandedConnections:
    """A worker's end of its hand-off socket: every connection the core sends is served by `here`."""

    def __init__(self, sock: socket.socket, here: ConnectionServer) -> None:
        self.sock = sock
        self.here = here
        self._loop = asyncio.get_running_loop()
        sock.setblocking(False)
        self._loop.add_reader(sock.fileno(), self._receive)

    def _receive(self) -> None:
        while True:
            try:
                message, fds, _flags, _address = socket.recv_fds(self.sock, 1, 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.close()
                return
            if not message and not fds:  # the core closed its end
                self.close()
                return
            for fd in fds:
                conn = socket.socket(fileno=fd)
                conn.setblocking(False)
                self.here.serve(conn)

    def close(self) -> None:
        if self.sock.fileno() >= 0:
            self._loop.remove_reader(self.sock.fileno())
            self.sock.close()
