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


def test_a_handler_that_waits_goes_on_without_a_task_until_it_yields_bare(loop: asyncio.AbstractEventLoop) -> None:
    """A call whose handler waits (for its batch, its thread) goes on in the callback of what it waited
    on, however many times it waits; it gets a task only after a bare yield, and ends either way."""
    seen: dict[bytes, bool] = {}

    async def waits(request: bytes, context: object) -> bytes:
        loop = asyncio.get_running_loop()
        for _ in range(2):
            done = loop.create_future()
            loop.call_soon(done.set_result, None)
            await done
        if request == b"yield":
            await asyncio.sleep(0)
        seen[request] = asyncio.current_task() is not None
        return request

    async def scenario() -> None:
        conn, transport, block = _one_method_connection(grpc.unary_unary_rpc_method_handler(waits), 100)
        conn.data_received(w.PREFACE + w.settings_frame({}) + _call(1, block, b"wait") + _call(3, block, b"yield"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert seen == {b"wait": False, b"yield": True}
        answers = {f[2]: f[3] for f in _frames(bytes(transport.out)) if f[0] == w.DATA}
        assert answers == {1: b"\0\0\0\0\x04wait", 3: b"\0\0\0\0\x05yield"}
        assert conn.handlers == 0 and not conn.streams
        conn.connection_lost(None)

    loop.run_until_complete(scenario())


def test_a_reset_cancels_a_handler_waiting_again_without_a_task(loop: asyncio.AbstractEventLoop) -> None:
    """RST_STREAM reaches a handler in its second wait (it has no task): it is cancelled, and its slot freed."""
    outcome: list[str] = []
    first: asyncio.Future[None] | None = None

    async def waits_twice(request: bytes, context: object) -> bytes:
        nonlocal first
        loop = asyncio.get_running_loop()
        first = loop.create_future()
        await first
        try:
            await loop.create_future()  # never done
        except asyncio.CancelledError:
            outcome.append("cancelled" if asyncio.current_task() is None else "cancelled in a task")
            raise
        return request

    async def scenario() -> None:
        conn, transport, block = _one_method_connection(grpc.unary_unary_rpc_method_handler(waits_twice), 100)
        conn.data_received(w.PREFACE + w.settings_frame({}) + _call(1, block, b"x"))
        assert first is not None and conn.handlers == 1
        first.set_result(None)
        for _ in range(3):
            await asyncio.sleep(0)
        assert conn.handlers == 1 and not outcome
        conn.data_received(w.rst_stream(1, w.CANCEL))
        for _ in range(3):
            await asyncio.sleep(0)
        assert outcome == ["cancelled"]
        assert conn.handlers == 0 and not conn.streams
        assert not [f for f in _frames(bytes(transport.out)) if f[2] == 1 and f[0] == w.DATA]
        conn.connection_lost(None)

    loop.run_until_complete(scenario())
