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


def _waiting_method(replies: dict[bytes, asyncio.Future[bytes]]) -> grpc.RpcMethodHandler:
    """A method whose answer to a request is what the future registered under it is given (as an infer
    call waits for its model's reply)."""
    async def wait(request: bytes, context: object) -> bytes:
        reply = asyncio.get_running_loop().create_future()
        replies[request] = reply
        return await reply
    return grpc.unary_unary_rpc_method_handler(wait)


def test_the_answer_to_a_reply_is_written_in_the_turn_the_reply_arrives(loop: asyncio.AbstractEventLoop) -> None:
    """The one call in flight on a connection: when what it waits for is done, its answer goes out from
    that completion's callback, with no task and no later flush in between (each costs a loop turn
    while the client waits, and at one call in flight the server then idles for as long)."""
    async def scenario() -> None:
        replies: dict[bytes, asyncio.Future[bytes]] = {}
        conn, transport, block = _one_method_connection(_waiting_method(replies), 100)
        writes: list[bytes] = []
        transport.write = writes.append  # type: ignore[method-assign]
        conn.data_received(w.PREFACE + w.settings_frame({}) + _call(1, block, b"a"))
        writes.clear()
        tasks = len(asyncio.all_tasks())
        replies[b"a"].set_result(b"reply")  # its done callbacks run in the next turn
        await asyncio.sleep(0)  # this coroutine's next step is queued behind them
        assert len(asyncio.all_tasks()) == tasks
        assert len(writes) == 1
        frames = _frames(writes[0])
        assert [(f[0], f[2]) for f in frames] == [(w.HEADERS, 1), (w.DATA, 1), (w.HEADERS, 1)]
        assert frames[1][3] == b"\0\0\0\0\x05reply" and frames[2][1] & w.END_STREAM
        assert not conn.streams and conn.handlers == 0
        conn.connection_lost(None)

    loop.run_until_complete(scenario())


def test_answers_ready_in_the_same_turn_share_one_write(loop: asyncio.AbstractEventLoop) -> None:
    """Several calls in flight: answers completed in one turn still go out together, in one write."""
    async def scenario() -> None:
        replies: dict[bytes, asyncio.Future[bytes]] = {}
        conn, transport, block = _one_method_connection(_waiting_method(replies), 100)
        writes: list[bytes] = []
        transport.write = writes.append  # type: ignore[method-assign]
        conn.data_received(w.PREFACE + w.settings_frame({}) + b"".join(
            _call(sid, block, body) for sid, body in ((1, b"a"), (3, b"b"), (5, b"c"))))
        writes.clear()
        replies[b"a"].set_result(b"A")
        replies[b"b"].set_result(b"B")
        for _ in range(3):
            await asyncio.sleep(0)
        assert len(writes) == 1
        frames = _frames(writes[0])
        assert [f[3] for f in frames if f[0] == w.DATA] == [b"\0\0\0\0\x01A", b"\0\0\0\0\x01B"]
        assert conn.handlers == 1 and list(conn.streams) == [5]
        replies[b"c"].set_result(b"C")  # now the only call in flight
        await asyncio.sleep(0)
        assert len(writes) == 2 and [f[3] for f in _frames(writes[1]) if f[0] == w.DATA] == [b"\0\0\0\0\x01C"]
        assert not conn.streams and conn.handlers == 0
        conn.connection_lost(None)

    loop.run_until_complete(scenario())


def test_a_call_cancelled_while_it_waits_ends_without_a_task(loop: asyncio.AbstractEventLoop) -> None:
    """The deadline passes while the handler waits: what it waits on is cancelled, the handler ends,
    and the client gets DEADLINE_EXCEEDED."""
    async def scenario() -> None:
        replies: dict[bytes, asyncio.Future[bytes]] = {}
        conn, transport, block = _one_method_connection(_waiting_method(replies), 100)
        block += w.literal(b"grpc-timeout", b"1m")
        conn.data_received(w.PREFACE + w.settings_frame({}) + _call(1, block, b"a"))
        for _ in range(200):
            if replies[b"a"].cancelled() and conn.handlers == 0:
                break
            await asyncio.sleep(0.005)
        assert replies[b"a"].cancelled() and conn.handlers == 0 and not conn.streams
        trailers = [f for f in _frames(bytes(transport.out)) if f[0] == w.HEADERS and f[1] & w.END_STREAM]
        assert dict(hpack.Decoder().decode(trailers[-1][3]))["grpc-status"] == str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
        conn.connection_lost(None)

    loop.run_until_complete(scenario())


def test_calls_split_across_reads_at_any_byte_are_answered_alike(loop: asyncio.AbstractEventLoop) -> None:
    """Frames are read straight from what was received when nothing is buffered: a read that ends inside a
    frame (its header or its payload) keeps the rest for the next read, whichever way the bytes come."""
    async def scenario(cut: int) -> None:
        conn, transport, block = _one_method_connection(grpc.unary_unary_rpc_method_handler(_echo), 100)
        conn.data_received(w.PREFACE + w.settings_frame({}))
        data = _call(1, block, b"first") + _call(3, block, b"second")
        conn.data_received(data[:cut])
        conn.data_received(data[cut:])
        frames = _frames(bytes(transport.out))
        answers = [(f[2], f[3]) for f in frames if f[0] == w.DATA]
        assert answers == [(1, b"\0\0\0\0\x05first"), (3, b"\0\0\0\0\x06second")], cut
        assert not conn.streams and not conn._rbuf and not [f for f in frames if f[0] == w.GOAWAY]
        conn.connection_lost(None)

    size = len(_call(1, b"", b"first")) + 2 * 40  # covers both calls' frame headers and payloads
    for cut in range(1, size):
        loop.run_until_complete(scenario(cut))


def test_calls_sent_a_byte_at_a_time_are_answered(loop: asyncio.AbstractEventLoop) -> None:
    async def scenario() -> None:
        conn, transport, block = _one_method_connection(grpc.unary_unary_rpc_method_handler(_echo), 100)
        data = w.PREFACE + w.settings_frame({}) + _call(1, block, b"a") + _call(3, block, b"bc")
        for i in range(len(data)):
            conn.data_received(data[i:i + 1])
        answers = [(f[2], f[3]) for f in _frames(bytes(transport.out)) if f[0] == w.DATA]
        assert answers == [(1, b"\0\0\0\0\x01a"), (3, b"\0\0\0\0\x02bc")]
        assert not conn.streams and not conn._rbuf
        conn.connection_lost(None)

    loop.run_until_complete(scenario())


def test_an_answer_before_the_client_half_closed_resets_the_stream_in_the_same_write(
        loop: asyncio.AbstractEventLoop) -> None:
    """A client-streaming call answered while the client may still send: the answer and RST_STREAM(NO_ERROR)
    go out together, and later DATA for the stream is ignored."""
    async def first(requests: object, context: object) -> bytes:
        async for request in requests:  # type: ignore[attr-defined]
            return b"got " + request
        return b"none"

    async def scenario() -> None:
        conn, transport, block = _one_method_connection(grpc.stream_unary_rpc_method_handler(first), 100)
        writes: list[bytes] = []
        transport.write = writes.append  # type: ignore[method-assign]
        conn.data_received(w.PREFACE + w.settings_frame({}))
        writes.clear()
        conn.data_received(w.frame(w.HEADERS, w.END_HEADERS, 1, block)
                           + w.frame(w.DATA, 0, 1, b"\0\0\0\0\x01x"))
        for _ in range(3):
            await asyncio.sleep(0)
        assert len(writes) == 1
        frames = _frames(writes[0])
        assert [(f[0], f[2]) for f in frames] == [(w.HEADERS, 1), (w.DATA, 1), (w.HEADERS, 1), (w.RST_STREAM, 1)]
        assert frames[1][3] == b"\0\0\0\0\x05got x" and frames[2][1] & w.END_STREAM
        assert struct.unpack(">I", frames[3][3])[0] == w.NO_ERROR
        conn.data_received(w.frame(w.DATA, w.END_STREAM, 1, b"\0\0\0\0\x01y"))  # sent before it saw the reset
        await asyncio.sleep(0)
        assert len(writes) == 1 and not conn.streams and conn.handlers == 0
        conn.connection_lost(None)

    loop.run_until_complete(scenario())
