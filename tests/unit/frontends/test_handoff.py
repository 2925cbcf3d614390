"""The core's acceptor keeps its first connections and hands the others to the workers in turn (handoff.py)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from naiad.frontends.handoff import Acceptor, ConnectionServer, HandedConnections, handoff_pair
from naiad.frontends.sockets import bind_socket


class _Tagging(asyncio.Protocol):
    """Answers every connection with the name of the process side serving it, then keeps it open."""

    def __init__(self, name: str, opened: set[_Tagging]) -> None:
        self.name = name
        self.opened = opened

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.opened.add(self)
        assert isinstance(transport, asyncio.Transport)
        transport.write(self.name.encode())

    def connection_lost(self, exc: Exception | None) -> None:
        self.opened.discard(self)


def _server(name: str) -> tuple[ConnectionServer, set[_Tagging]]:
    opened: set[_Tagging] = set()
    return ConnectionServer(lambda: _Tagging(name, opened), None, lambda: len(opened)), opened


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    sock = bind_socket("127.0.0.1", 0)
    yield sock
    sock.close()


async def _served_by(port: int) -> tuple[str, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    name = await asyncio.wait_for(reader.read(16), 10)
    return name.decode(), writer


async def _the_first_connections_stay_and_the_others_go_to_the_workers_in_turn(listening: socket.socket) -> None:
    here, opened_here = _server("core")
    workers = [handoff_pair() for _ in range(2)]
    received = [HandedConnections(theirs, _server(f"worker{i}")[0]) for i, (_, theirs) in enumerate(workers)]
    acceptor = Acceptor(listening, here, 2, lambda: [ours for ours, _ in workers])
    port = listening.getsockname()[1]
    try:
        served = [await _served_by(port) for _ in range(6)]
        assert [name for name, _ in served] == ["core", "core", "worker0", "worker1", "worker0", "worker1"]
        assert len(opened_here) == 2
        served[0][1].close()  # one of the core's own closes: the next connection is the core's again
        await asyncio.sleep(0.1)
        name, writer = await _served_by(port)
        assert name == "core"
        served.append((name, writer))
    finally:
        acceptor.close()
        for _, writer in served:
            writer.close()
        for handed in received:
            handed.close()
        for ours, _ in workers:
            ours.close()


async def _a_worker_gone_is_skipped_and_with_none_left_the_core_serves_all(listening: socket.socket) -> None:
    here, _ = _server("core")
    gone_ours, gone_theirs = handoff_pair()
    gone_theirs.close()  # its process died: sending to it fails
    up_ours, up_theirs = handoff_pair()
    received = HandedConnections(up_theirs, _server("worker")[0])
    outlets = [gone_ours, up_ours]
    acceptor = Acceptor(listening, here, 0, lambda: list(outlets))
    port = listening.getsockname()[1]
    writers: list[asyncio.StreamWriter] = []
    try:
        for _ in range(3):
            name, writer = await _served_by(port)
            writers.append(writer)
            assert name == "worker"
        outlets.clear()  # no worker up (all of them restarting)
        name, writer = await _served_by(port)
        writers.append(writer)
        assert name == "core"
    finally:
        acceptor.close()
        for writer in writers:
            writer.close()
        received.close()
        for sock in (gone_ours, up_ours):
            sock.close()


async def _a_closed_acceptor_takes_no_more_connections(listening: socket.socket) -> None:
    here, _ = _server("core")
    acceptor = Acceptor(listening, here, 1, list)
    port = listening.getsockname()[1]
    name, writer = await _served_by(port)
    assert name == "core"
    acceptor.close()
    writer.close()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)


async def _a_connection_failing_its_tls_handshake_is_closed(
        listening: socket.socket) -> None:
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)  # no certificate: every handshake fails
    opened: set[_Tagging] = set()
    here = ConnectionServer(lambda: _Tagging("core", opened), context, lambda: len(opened))
    acceptor = Acceptor(listening, here, 8, list)
    port = listening.getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"\x16\x03\x01\x00\x05hello")  # a TLS record that is no ClientHello
        assert await asyncio.wait_for(reader.read(), 10) is not None  # the server closes the connection
        writer.close()
        await asyncio.sleep(0.05)
        assert here.count() == 0 and not opened
    finally:
        acceptor.close()


def test_the_first_connections_stay_and_the_others_go_to_the_workers_in_turn(listening: socket.socket) -> None:
    asyncio.run(_the_first_connections_stay_and_the_others_go_to_the_workers_in_turn(listening))

def test_a_worker_gone_is_skipped_and_with_none_left_the_core_serves_all(listening: socket.socket) -> None:
    asyncio.run(_a_worker_gone_is_skipped_and_with_none_left_the_core_serves_all(listening))

def test_a_closed_acceptor_takes_no_more_connections(listening: socket.socket) -> None:
    asyncio.run(_a_closed_acceptor_takes_no_more_connections(listening))

def test_a_connection_failing_its_tls_handshake_is_closed(listening: socket.socket) -> None:
    asyncio.run(_a_connection_failing_its_tls_handshake_is_closed(listening))
