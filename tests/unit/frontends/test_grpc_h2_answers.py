"""How Naiad's own gRPC server writes unary answers: in one piece when the windows allow, in order and
within the windows when they do not (no socket: a fake transport records every write)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator

import grpc
import hpack
import pytest

from naiad.frontends.grpc import h2_wire as w
from tests.unit.frontends.test_grpc_h2_hardening import _frames, _one_method_connection


@pytest.fixture()
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


async def _echo(request: bytes, context: object) -> bytes:
    return request


def _call(sid: int, block: bytes, body: bytes) -> bytes:
    message = b"\0" + len(body).to_bytes(4, "big") + body
    return w.frame(w.HEADERS, w.END_HEADERS, sid, block) + w.frame(w.DATA, w.END_STREAM, sid, message)


def test_a_unary_answer_is_written_at_once_in_one_piece(loop: asyncio.AbstractEventLoop) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        conn, transport, block = _one_method_connection(grpc.unary_unary_rpc_method_handler(_echo), 100)
        writes: list[bytes] = []
        transport.write = writes.append  # type: ignore[method-assign]
        conn.data_received(w.PREFACE + w.settings_frame({}))
        writes.clear()
        window = conn._send_window
        scheduled: list[object] = []
        call_soon = loop.call_soon
        loop.call_soon = lambda callback, *args, **kw: (scheduled.append(callback),  # type: ignore[method-assign]
                                                        call_soon(callback, *args, **kw))[1]
        conn.data_received(_call(1, block, b"hello"))
        loop.call_soon = call_soon  # type: ignore[method-assign]
        # the handler finished in its first step: its answer went out in the turn's one write, and
        # nothing is left scheduled for a later turn
        assert len(writes) == 1 and not scheduled
        frames = _frames(writes[0])
        assert [(f[0], f[1], f[2]) for f in frames] == [
            (w.HEADERS, w.END_HEADERS, 1), (w.DATA, 0, 1), (w.HEADERS, w.END_HEADERS | w.END_STREAM, 1)]
        decoder = hpack.Decoder()
        assert dict(decoder.decode(frames[0][3]))[":status"] == "200"
        assert frames[1][3] == b"\0" + struct.pack(">I", 5) + b"hello"
        assert dict(decoder.decode(frames[2][3])) == {"grpc-status": "0"}
        assert conn._send_window == window - 10 and not conn.streams
        conn.connection_lost(None)

    loop.run_until_complete(scenario())


def test_an_answer_larger_than_the_stream_window_waits_for_it(loop: asyncio.AbstractEventLoop) -> None:
    async def scenario() -> None:
        conn, transport, block = _one_method_connection(grpc.unary_unary_rpc_method_handler(_echo), 100)
        conn.data_received(w.PREFACE + w.settings_frame({w.S_INITIAL_WINDOW_SIZE: 8}) + _call(1, block, b"0123456789"))
        await asyncio.sleep(0)
        frames = _frames(bytes(transport.out))
        data = [f[3] for f in frames if f[0] == w.DATA and f[2] == 1]
        assert data == [b"\0\0\0\0\x0a012"]  # the window's 8 bytes, and no trailers yet
        assert not [f for f in frames if f[0] == w.HEADERS and f[1] & w.END_STREAM]
        conn.data_received(w.window_update(1, 100))
        await asyncio.sleep(0)
        frames = _frames(bytes(transport.out))
        assert b"".join(f[3] for f in frames if f[0] == w.DATA and f[2] == 1) == b"\0\0\0\0\x0a0123456789"
        assert frames[-1][0] == w.HEADERS and frames[-1][1] & w.END_STREAM and not conn.streams
        conn.connection_lost(None)

    loop.run_until_complete(scenario())
