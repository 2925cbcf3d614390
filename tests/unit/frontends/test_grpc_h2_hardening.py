"""Naiad's own HTTP/2 gRPC server against the attacks production HTTP/2 servers were hardened for:
rapid reset, control-frame floods, slow readers, windows overrun, decompression bombs, and the
RFC 9113 stream-state rules. Raw h2c clients on loopback, each bounded in frames and time."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import socket
import struct
import time
import zlib
from collections.abc import Iterator

import grpc
import hpack
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from naiad.frontends.grpc import h2_limits as lim
from naiad.frontends.grpc import h2_wire as w
from naiad.frontends.grpc.h2_connection import (
    MAX_HEADER_BLOCK,
    RECV_CONN_WINDOW,
    H2Connection,
)
from naiad.frontends.grpc.h2_inflater import Inflater
from naiad.frontends.grpc.h2_server import H2GrpcServer
from tests.unit.frontends import test_grpc_h2_protocol as protocol
from tests.unit.frontends.test_grpc_h2_protocol import (
    INFER,
    WAIT,
    RawClient,
    Served,
    _gate,
    _message,
)

own = protocol.own  # the fixture: an in-process server of the test's own (settings through indirect params)

LIVE = "/inference.GRPCInferenceService/ServerLive"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
FLOOD = lim.CHEAP_FRAME_BURST + 1000  # past the burst, sent far faster than the budget refills


def _send_tolerant(client: RawClient, data: bytes) -> None:
    """Send; the server may already have closed the connection (that is what is being tested)."""
    try:
        client.send(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


def _goaway_code(client: RawClient, timeout: float = WAIT) -> int | None:
    """The error code of the server's GOAWAY (None if the connection closed without one)."""
    try:
        got = client.until(lambda f: f[0] == w.GOAWAY, timeout)
    except ConnectionResetError:
        return None
    return None if got is None else struct.unpack(">I", got[3][4:8])[0]


def _still_serving(served: Served) -> None:
    with grpcclient.InferenceServerClient(served.url) as good:
        assert good.is_server_live()


def test_a_connection_ended_for_abuse_is_held_a_while_before_it_closes(own: Served) -> None:
    """After GOAWAY ENHANCE_YOUR_CALM nothing more is read, and the connection closes only CALM_LINGER
    later: a client reconnecting at once cannot get a fresh budget every few milliseconds."""
    client = RawClient(own.port)
    try:
        _send_tolerant(client, w.frame(w.PING, 0, 0, b"12345678") * FLOOD)
        assert _goaway_code(client) == w.ENHANCE_YOUR_CALM
        client.sock.settimeout(lim.CALM_LINGER / 2)
        with pytest.raises(TimeoutError):  # still open (before, the server closed it with the GOAWAY)
            while client.sock.recv(65536):
                pass
        client.sock.settimeout(WAIT)
        try:
            assert client.sock.recv(65536) == b""
        except ConnectionResetError:
            pass  # closed with unread bytes of the flood
    finally:
        client.close()
    _still_serving(own)


# ---------------------------------------------------------------- rapid reset (CVE-2023-44487)


def test_rapid_reset_ends_in_goaway_enhance_your_calm(own: Served) -> None:
    client = RawClient(own.port)
    try:
        body = _message(_gate("rr", "rr-never"))
        sid = 1
        for _ in range((lim.RESET_BURST + 1000) // 100):
            batch = []
            for _ in range(100):
                client.call(sid, INFER, body)  # whole request, then cancelled at once
                batch.append(w.rst_stream(sid, w.CANCEL))
                sid += 2
            _send_tolerant(client, b"".join(batch))
        assert _goaway_code(client) == w.ENHANCE_YOUR_CALM
    except (BrokenPipeError, ConnectionResetError):
        pass  # closed while sending: the GOAWAY was checked by the test below
    finally:
        client.close()
    # A request reset in the frame batch that completed it never reached the core.
    assert len(own.fake.seen) < lim.RESET_BURST
    _still_serving(own)


def test_rapid_reset_in_separate_writes_is_refused_too(own: Served) -> None:
    client = RawClient(own.port)
    try:
        body = _message(_gate("rr2", "rr2-never"))
        code = None
        for sid in range(1, 2 * (lim.RESET_BURST + 500), 2):
            try:
                client.call(sid, INFER, body)
                client.send(w.rst_stream(sid, w.CANCEL))
            except (BrokenPipeError, ConnectionResetError):
                break
        code = _goaway_code(client)
        assert code == w.ENHANCE_YOUR_CALM
    finally:
        client.close()
    _still_serving(own)


# ---------------------------------------------------------------- cheap-frame floods


def _open_stream(client: RawClient) -> None:
    client.call(1, INFER, _message(_gate("flood", "flood-never")), end=False)


FLOODS = {
    "priority": (None, w.frame(w.PRIORITY, 0, 1, b"\x00\x00\x00\x00\x10")),
    "unknown": (None, w.frame(0x20, 0, 0, b"x")),
    "ping": (None, w.frame(w.PING, 0, 0, b"12345678")),
    "settings": (None, w.settings_frame({})),
    "window_update": (None, w.window_update(0, 1)),
    "empty_data": (_open_stream, w.frame(w.DATA, 0, 1)),
    "empty_continuation": (
        lambda c: c.send(w.frame(w.HEADERS, 0, 1, c.encoder.encode([(":method", "POST")]))),
        w.frame(w.CONTINUATION, 0, 1),
    ),
}


@pytest.mark.parametrize("kind", sorted(FLOODS))
def test_cheap_frame_flood_ends_in_goaway_enhance_your_calm(own: Served, kind: str) -> None:
    setup, one = FLOODS[kind]
    client = RawClient(own.port)
    try:
        if setup is not None:
            setup(client)
        for _ in range(FLOOD // 500):
            _send_tolerant(client, one * 500)
        assert _goaway_code(client) == w.ENHANCE_YOUR_CALM
    finally:
        client.close()
    _still_serving(own)


def test_usual_control_traffic_stays_within_the_budgets(own: Served) -> None:
    client = RawClient(own.port)
    try:
        for sid in range(1, 401, 2):  # a busy client: a call, a PING and a WINDOW_UPDATE each time
            client.call(sid, LIVE, _message(pb.ServerLiveRequest()))
            client.send(w.frame(w.PING, 0, 0, b"abcdefgh") + w.window_update(0, 100))
            assert client.status(sid)["grpc-status"] == "0"
    finally:
        client.close()


# ---------------------------------------------------------------- flow control and held request bytes


def test_data_past_the_connection_window_is_a_flow_control_error(own: Served) -> None:
    """Streams that each declare a large message and keep sending without waiting for WINDOW_UPDATE:
    once the connection holds HELD_BYTES_LIMIT for them, its window stays shut and the overrun is caught."""
    client = RawClient(own.port)
    per_stream, streams = 2 << 20, (lim.HELD_BYTES_LIMIT + RECV_CONN_WINDOW) // (2 << 20) + 8
    chunk = b"\x00" * w.DEFAULT_FRAME_SIZE
    try:
        for i in range(streams):
            sid = 2 * i + 1
            client.call(sid, INFER, b"\x00" + (64 << 20).to_bytes(4, "big"), end=False)
            frames = [w.frame(w.DATA, 0, sid, chunk) for _ in range(per_stream // len(chunk))]
            client.send(b"".join(frames))
    except (BrokenPipeError, ConnectionResetError):
        pass
    try:
        assert _goaway_code(client) == w.FLOW_CONTROL_ERROR
    finally:
        client.close()
    _still_serving(own)


def test_a_large_message_alone_still_arrives(own: Served) -> None:
    """More than HELD_BYTES_LIMIT in a single message: the stream holding the most keeps its windows."""
    import numpy as np

    big = np.ones((1, (lim.HELD_BYTES_LIMIT + (4 << 20)) // 4), dtype=np.float32)
    with grpcclient.InferenceServerClient(own.url) as client:
        inp = grpcclient.InferInput("X", list(big.shape), "FP32")
        inp.set_data_from_numpy(big)
        out = client.infer("echo", [inp], client_timeout=60).as_numpy("OUT_X")
    assert out.shape == big.shape


# ---------------------------------------------------------------- decompression


@pytest.mark.parametrize("own", [{"grpc_max_decompressed_size": 1 << 20}], indirect=True)
def test_gzip_bomb_is_resource_exhausted(own: Served) -> None:
    bomb = gzip.compress(b"\x00" * (16 << 20))  # 16 KiB on the wire, 16 MiB inflated
    client = RawClient(own.port)
    try:
        client.call(1, INFER, b"\x01" + len(bomb).to_bytes(4, "big") + bomb, extra=(("grpc-encoding", "gzip"),))
        trailers = client.status(1)
        assert trailers["grpc-status"] == str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
        client.call(3, STREAM, b"\x01" + len(bomb).to_bytes(4, "big") + bomb, extra=(("grpc-encoding", "gzip"),))
        assert client.status(3)["grpc-status"] == str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
    finally:
        client.close()
    _still_serving(own)


@pytest.mark.parametrize("own", [{"grpc_max_decompressed_size": 1 << 20}], indirect=True)
def test_refused_messages_past_their_budget_stop_the_connection_being_read(own: Served) -> None:
    """Decompression bombs sent back to back: the first REFUSED_MESSAGE_BURST are answered at once, the
    rest only as fast as the budget refills, while other connections are served."""
    bomb = gzip.compress(b"\x00" * (4 << 20))
    message = b"\x01" + len(bomb).to_bytes(4, "big") + bomb
    client = RawClient(own.port)
    try:
        sids = range(1, 2 * (lim.REFUSED_MESSAGE_BURST + 40), 2)
        sent = time.monotonic()  # the budget refills from here on, however long the burst takes to answer
        for sid in sids:
            client.call(sid, INFER, message, extra=(("grpc-encoding", "gzip"),))
        answered = [client.status(sid) for sid in sids[:lim.REFUSED_MESSAGE_BURST]]
        assert all(t["grpc-status"] == str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]) for t in answered)
        started, more = time.monotonic(), 0
        with contextlib.suppress(TimeoutError):
            while time.monotonic() - started < 1.5:
                client.until(lambda f: f[0] == w.HEADERS and f[1] & w.END_STREAM, 1.5 - (time.monotonic() - started))
                more += 1
        assert more <= lim.REFUSED_MESSAGE_RATE * (time.monotonic() - sent) + 2
        _still_serving(own)
        # later bombs are answered in the end (any of them: which one comes next is not what is tested)
        later = client.until(lambda f: f[0] == w.HEADERS and f[1] & w.END_STREAM and f[2] > sids[lim.REFUSED_MESSAGE_BURST - 1])
        assert later is not None and later[2] in sids
    finally:
        client.close()


@pytest.mark.parametrize("own", [{"grpc_max_message_size": 1000}], indirect=True)
def test_max_message_size_flag_applies(own: Served) -> None:
    client = RawClient(own.port)
    try:
        client.call(1, INFER, b"\x00" + (1001).to_bytes(4, "big") + b"x" * 1001)
        trailers = client.status(1)
        assert trailers["grpc-status"] == str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
        assert "1001 vs. 1000" in trailers["grpc-message"]
    finally:
        client.close()


def test_large_messages_inflate_in_a_low_priority_process() -> None:
    """A bomb whose gzip trailer lies is inflated up to the limit in a worker process at nice 19: the
    server's own process spends next to no CPU time on it."""
    inflater = Inflater(1)
    try:
        data = bytes(range(256)) * 4096
        assert bytes(inflater.submit("gzip", gzip.compress(data), len(data)).result(WAIT)) == data
        bomb = gzip.compress(b"\x00" * (64 << 20))
        lying = bomb[:-4] + (1000).to_bytes(4, "little")
        before = time.process_time()
        for _ in range(3):
            with pytest.raises(w.MessageTooLarge):
                inflater.submit("gzip", lying, 32 << 20).result(60)
        assert time.process_time() - before < 0.1  # inflating 96 MiB here would take several times that
        with pytest.raises(ValueError):
            inflater.submit("deflate", b"not deflate" * 10_000, 1 << 20).result(WAIT)
        (worker,) = inflater._workers
        assert os.getpriority(os.PRIO_PROCESS, worker.process.pid) == 19
    finally:
        inflater.close()
    assert worker.process.poll() is not None


def test_inflation_is_incremental_and_capped() -> None:
    data = b"abc" * 100_000
    job = w.Inflation("gzip", gzip.compress(data), len(data))
    assert not job.run(1000)  # stops after the budget
    assert job.run(len(data)) and job.result() == data
    with pytest.raises(w.MessageTooLarge):
        w.Inflation("deflate", zlib.compress(data), len(data) - 1).run(len(data) + 1)
    truncated = w.Inflation("gzip", gzip.compress(data)[:100], len(data))
    truncated.run(len(data))
    with pytest.raises(ValueError):
        truncated.result()


# ---------------------------------------------------------------- RFC 9113 conformance


def test_reused_stream_id_is_a_protocol_error(own: Served) -> None:
    client = RawClient(own.port)
    try:
        client.call(1, LIVE, _message(pb.ServerLiveRequest()))
        assert client.status(1)["grpc-status"] == "0"
        client.call(1, LIVE, _message(pb.ServerLiveRequest()))
        assert _goaway_code(client) == w.PROTOCOL_ERROR
    finally:
        client.close()


def test_lower_stream_id_is_a_protocol_error(own: Served) -> None:
    client = RawClient(own.port)
    try:
        client.call(5, LIVE, _message(pb.ServerLiveRequest()))
        assert client.status(5)["grpc-status"] == "0"
        client.call(3, LIVE, _message(pb.ServerLiveRequest()))
        assert _goaway_code(client) == w.PROTOCOL_ERROR
    finally:
        client.close()


class _NoSettingsClient(RawClient):
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        self.encoder, self.decoder, self.buf = hpack.Encoder(), hpack.Decoder(), b""


def test_headers_before_the_clients_settings_are_a_protocol_error(own: Served) -> None:
    client = _NoSettingsClient(own.port)
    try:
        block = client.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", LIVE),
                                       (":authority", "x"), ("content-type", "application/grpc")])
        client.send(w.PREFACE + w.frame(w.HEADERS, w.END_HEADERS, 1, block)
                    + w.frame(w.DATA, w.END_STREAM, 1, _message(pb.ServerLiveRequest())))
        assert _goaway_code(client) == w.PROTOCOL_ERROR
    finally:
        client.close()


def test_window_update_on_an_idle_stream_is_a_protocol_error(own: Served) -> None:
    client = RawClient(own.port)
    try:
        client.send(w.window_update(7, 100))
        assert _goaway_code(client) == w.PROTOCOL_ERROR
    finally:
        client.close()


def test_rst_stream_on_an_idle_stream_is_a_protocol_error(own: Served) -> None:
    client = RawClient(own.port)
    try:
        client.send(w.rst_stream(9, w.CANCEL))
        assert _goaway_code(client) == w.PROTOCOL_ERROR
    finally:
        client.close()


def test_initial_window_change_past_the_maximum_is_a_flow_control_error(own: Served) -> None:
    client = RawClient(own.port)
    try:
        client.call(1, INFER, _message(_gate("win", "win-never")))
        own.fake.wait_seen("win")
        client.send(w.window_update(1, w.MAX_WINDOW - w.DEFAULT_WINDOW))  # stream 1's send window is now the maximum
        client.send(w.settings_frame({w.S_INITIAL_WINDOW_SIZE: w.DEFAULT_WINDOW + 1}))
        assert _goaway_code(client) == w.FLOW_CONTROL_ERROR
    finally:
        client.close()
    _still_serving(own)


@pytest.mark.parametrize("own", [{"grpc_max_concurrent_streams": 1}], indirect=True)
def test_frames_on_a_stream_the_server_reset_are_ignored(own: Served) -> None:
    client = RawClient(own.port)
    try:
        client.call(1, INFER, _message(_gate("one-r", "one-r-after")))
        own.fake.wait_seen("one-r")
        client.call(3, LIVE, _message(pb.ServerLiveRequest()), end=False)
        refused = client.until(lambda f: f[2] == 3)
        assert refused[0] == w.RST_STREAM
        client.send(w.frame(w.HEADERS, w.END_HEADERS | w.END_STREAM, 3, client.encoder.encode([("x-t", "1")])))
        own.release_gate("one-r-after")
        assert client.status(1)["grpc-status"] == "0"
        client.call(5, LIVE, _message(pb.ServerLiveRequest()))
        assert client.status(5)["grpc-status"] == "0"
    finally:
        client.close()


# ---------------------------------------------------------------- fairness, back-pressure, fuzzing (no socket)


class FakeTransport(asyncio.Transport):
    """Collects what the connection writes and whether it wants to read."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.reading = True
        self.closed = False

    def write(self, data: bytes) -> None:  # type: ignore[override]
        self.out += data

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


def _frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out, pos = [], 0
    while len(data) - pos >= 9:
        length = int.from_bytes(data[pos:pos + 3], "big")
        out.append((data[pos + 3], data[pos + 4], struct.unpack(">I", data[pos + 5:pos + 9])[0] & 0x7FFFFFFF,
                    data[pos + 9:pos + 9 + length]))
        pos += 9 + length
    return out


@pytest.fixture()
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _connect(loop: asyncio.AbstractEventLoop) -> tuple[H2Connection, FakeTransport]:
    async def make() -> tuple[H2Connection, FakeTransport]:
        conn = H2Connection(H2GrpcServer(max_concurrent_streams=100))
        transport = FakeTransport()
        conn.connection_made(transport)
        return conn, transport

    return loop.run_until_complete(make())


def _pings(transport: FakeTransport) -> int:
    return sum(1 for f in _frames(bytes(transport.out)) if f[0] == w.PING)


def test_one_connection_handles_a_bounded_number_of_frames_per_turn(loop: asyncio.AbstractEventLoop) -> None:
    conn, transport = _connect(loop)
    conn.data_received(w.PREFACE + w.settings_frame({}) + w.frame(w.PING, 0, 0, b"12345678") * 1000)
    assert _pings(transport) == lim.FRAMES_PER_TURN - 1  # the SETTINGS frame was one of them
    assert not transport.reading  # the rest waits for a later turn, after the other connections

    async def turns() -> None:
        for _ in range(10):
            await asyncio.sleep(0)

    loop.run_until_complete(turns())
    assert _pings(transport) == 1000 and transport.reading
    conn.connection_lost(None)


def test_reading_stops_while_the_client_does_not_read(loop: asyncio.AbstractEventLoop) -> None:
    conn, transport = _connect(loop)
    conn.data_received(w.PREFACE + w.settings_frame({}))
    conn.pause_writing()  # the transport's write buffer passed its high-water mark
    assert not transport.reading
    conn.resume_writing()
    assert transport.reading
    conn.connection_lost(None)



def _one_method_connection(handler: grpc.RpcMethodHandler, max_streams: int,
                           request_timeout: float = 30.0) -> tuple[H2Connection, FakeTransport, bytes]:
    """A connection to a server whose one method /t.S/M is `handler`, and the header block that calls it."""
    server = H2GrpcServer(max_concurrent_streams=max_streams, request_timeout=request_timeout)
    server.add_registered_method_handlers("t.S", {"M": handler})
    conn, transport = H2Connection(server), FakeTransport()
    conn.connection_made(transport)
    block = b"".join(w.literal(n.encode(), v.encode()) for n, v in (
        (":method", "POST"), (":scheme", "http"), (":path", "/t.S/M"), (":authority", "x"),
        ("content-type", "application/grpc")))
    return conn, transport, block

def test_pings_and_window_updates_of_a_busy_client_are_not_a_flood(loop: asyncio.AbstractEventLoop) -> None:
    """A client making many calls sends PINGs and WINDOW_UPDATEs with them (as gRPC C-core does): far
    past the control-frame burst in no time, and still no GOAWAY."""

    async def echo(request: bytes, context: object) -> bytes:
        return request

    async def scenario() -> list[tuple[int, int, int, bytes]]:
        conn, transport, block = _one_method_connection(grpc.unary_unary_rpc_method_handler(echo), 100)
        conn.data_received(w.PREFACE + w.settings_frame({}))
        for sid in range(1, 2 * lim.CHEAP_FRAME_BURST, 2):
            conn.data_received(w.frame(w.HEADERS, w.END_HEADERS, sid, block) + w.frame(w.DATA, w.END_STREAM, sid, b"\0" * 5)
                               + w.frame(w.PING, 0, 0, b"12345678") + w.window_update(0, 5) + w.window_update(0, 5))
            await asyncio.sleep(0)
        frames = _frames(bytes(transport.out))
        conn.connection_lost(None)
        return frames

    frames = loop.run_until_complete(scenario())
    assert not [f for f in frames if f[0] == w.GOAWAY]
    assert sum(1 for f in frames if f[0] == w.HEADERS and f[1] & w.END_STREAM) == lim.CHEAP_FRAME_BURST


def test_acknowledging_the_answers_of_one_long_stream_is_not_a_flood(loop: asyncio.AbstractEventLoop) -> None:
    """One bidirectional call carrying many messages (perf_analyzer --streaming on a decoupled model): the
    client acknowledges each answer with a stream and a connection WINDOW_UPDATE and a PING, far past the
    control-frame burst on a single call, and still gets no GOAWAY."""

    async def echo(requests: object, context: object) -> object:
        async for request in requests:  # type: ignore[attr-defined]
            yield request

    async def scenario() -> list[tuple[int, int, int, bytes]]:
        conn, transport, block = _one_method_connection(grpc.stream_stream_rpc_method_handler(echo), 100)
        conn.data_received(w.PREFACE + w.settings_frame({}) + w.frame(w.HEADERS, w.END_HEADERS, 1, block))
        messages = lim.CHEAP_FRAME_BURST
        for _ in range(messages):
            conn.data_received(w.frame(w.DATA, 0, 1, b"\0" * 5))
            for _ in range(3):
                await asyncio.sleep(0)  # the handler answers
            conn.data_received(w.frame(w.PING, 0, 0, b"12345678") + w.window_update(1, 5) + w.window_update(0, 5))
        conn.data_received(w.frame(w.DATA, w.END_STREAM, 1, b""))
        for _ in range(10):
            await asyncio.sleep(0)
        frames = _frames(bytes(transport.out))
        conn.connection_lost(None)
        return frames

    frames = loop.run_until_complete(scenario())
    assert not [f for f in frames if f[0] == w.GOAWAY]
    assert sum(1 for f in frames if f[0] == w.DATA and f[2] == 1) >= lim.CHEAP_FRAME_BURST


def test_answers_waiting_for_window_hold_off_reading(loop: asyncio.AbstractEventLoop) -> None:
    """A client that gives no window for answers: once STALLED_STREAMS of them wait, the connection is
    read only a turn per STALL_PAUSE, so it cannot keep the server running calls whose answers it will
    not take. Its window update, read in its turn, still gets every answer out."""

    async def echo(request: bytes, context: object) -> bytes:
        return request

    async def scenario() -> None:
        conn, transport, block = _one_method_connection(grpc.unary_unary_rpc_method_handler(echo), 1000)
        calls = b"".join(w.frame(w.HEADERS, w.END_HEADERS, sid, block) + w.frame(w.DATA, w.END_STREAM, sid, b"\0" * 5)
                         for sid in range(1, 2 * (lim.STALLED_STREAMS + 400), 2))
        conn.data_received(w.PREFACE + w.settings_frame({w.S_INITIAL_WINDOW_SIZE: 0}) + calls)
        for _ in range(50):  # event-loop turns, no time passing
            await asyncio.sleep(0)
        started = len(conn.streams)  # calls run, their answers waiting for window
        assert lim.STALLED_STREAMS <= started < lim.STALLED_STREAMS + lim.FRAMES_PER_TURN
        assert not transport.reading
        conn.data_received(w.settings_frame({w.S_INITIAL_WINDOW_SIZE: w.DEFAULT_WINDOW}))
        deadline = loop.time() + WAIT
        while conn.streams and loop.time() < deadline:
            await asyncio.sleep(lim.STALL_PAUSE / 2)
        assert not conn.streams, "answers still waiting"
        assert sum(1 for f in _frames(bytes(transport.out)) if f[0] == w.DATA) == lim.STALLED_STREAMS + 400
        assert transport.reading
        conn.connection_lost(None)

    loop.run_until_complete(scenario())


_FRAME = st.tuples(
    st.sampled_from([*range(11), 0x20]),                      # every type, and an unknown one
    st.integers(0, 255),                                       # flags
    st.sampled_from([0, 1, 2, 3, 5, 7, 2**31 - 1]),            # stream ids
    st.one_of(st.binary(max_size=40),
              st.sampled_from([b"", b"\x00" * 4, b"\x00\x00\x00\x01", b"\x7f\xff\xff\xff", b"\x00" * 8,
                               b"\x00\x04\x7f\xff\xff\xff", b"\x00\x00\x00\x00\x05", b"\x82\x84\x86"])),
).map(lambda t: w.frame(*t))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.lists(_FRAME, max_size=40), garbage=st.binary(max_size=64), with_settings=st.booleans())
@example(frames=[w.frame(w.HEADERS, 0x24, 1, b"\x00" * 8)], garbage=b"", with_settings=True)  # an empty header name
def test_fuzzed_frames_only_ever_end_in_protocol_errors(loop: asyncio.AbstractEventLoop, frames: list[bytes],
                                                        garbage: bytes, with_settings: bool) -> None:
    """Random frames never hit the server's internal-error path and never grow its buffers past their bounds."""
    conn, transport = _connect(loop)
    data = w.PREFACE + (w.settings_frame({}) if with_settings else b"") + b"".join(frames) + garbage
    for i in range(0, len(data), 97):  # in pieces, as TCP may deliver them
        conn.data_received(data[i:i + 97])
    codes = [struct.unpack(">I", f[3][4:8])[0] for f in _frames(bytes(transport.out)) if f[0] == w.GOAWAY]
    assert w.INTERNAL_ERROR not in codes
    assert len(conn._rbuf) <= 9 + w.DEFAULT_FRAME_SIZE + 97
    assert len(conn._headers_block) <= MAX_HEADER_BLOCK
    assert conn._held <= lim.HELD_BYTES_LIMIT
    assert len(transport.out) <= 200 * (len(frames) + 1) + 200
    conn.connection_lost(None)
    assert conn._held == 0 and not conn.streams


def test_handlers_of_reset_streams_count_against_the_stream_limit(loop: asyncio.AbstractEventLoop) -> None:
    """Resetting a stream does not free its slot until its handler has ended: a reset cannot start more work."""
    release = asyncio.Event()

    async def stubborn(request: bytes, context: object) -> bytes:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await release.wait()  # a handler that takes its time to wind down
            raise
        return request

    async def scenario() -> tuple[list[tuple[int, int, int, bytes]], bool]:
        conn, transport, block = _one_method_connection(grpc.unary_unary_rpc_method_handler(stubborn), 2)

        def call(sid: int) -> bytes:
            return w.frame(w.HEADERS, w.END_HEADERS, sid, block) + w.frame(w.DATA, w.END_STREAM, sid, b"\0\0\0\0\0")

        conn.data_received(w.PREFACE + w.settings_frame({}) + call(1) + call(3))
        await asyncio.sleep(0.01)
        conn.data_received(w.rst_stream(1, w.CANCEL) + w.rst_stream(3, w.CANCEL))
        await asyncio.sleep(0.01)
        assert not conn.streams and conn.handlers == 2
        conn.data_received(call(5))  # both handlers still run: refused
        release.set()
        await asyncio.sleep(0.01)
        assert conn.handlers == 0
        conn.data_received(call(7))  # accepted once they ended
        await asyncio.sleep(0.01)
        accepted = 7 in conn.streams and conn.handlers == 1
        conn.connection_lost(None)
        await asyncio.sleep(0.01)  # its handler winds down
        return _frames(bytes(transport.out)), accepted

    frames, accepted = loop.run_until_complete(scenario())
    resets = {f[2]: struct.unpack(">I", f[3])[0] for f in frames if f[0] == w.RST_STREAM}
    assert resets == {5: w.REFUSED_STREAM}
    assert accepted


def test_a_call_whose_message_waits_behind_a_penalty_is_not_timed_out(loop: asyncio.AbstractEventLoop) -> None:
    """A unary call whose HEADERS were read before the connection's refusal penalty began and whose
    message arrives during it: the server, not the client, holds the message back, so the call is
    not reset as a half-sent request; it is answered once reading resumes. (A call the client itself
    leaves half-sent is still reset: test_grpc_h2_protocol.py::test_half_sent_request_is_timed_out.)"""

    async def echo(request: bytes, context: object) -> bytes:
        return request

    timeout = 0.2

    async def scenario() -> list[tuple[int, int, int, bytes]]:
        conn, transport, block = _one_method_connection(grpc.unary_unary_rpc_method_handler(echo), 100, timeout)
        conn.data_received(w.PREFACE + w.settings_frame({}) + w.frame(w.HEADERS, w.END_HEADERS, 1, block))
        for _ in range(lim.REFUSED_MESSAGE_BURST + 1):  # refused messages past the budget: reading stops
            conn.refused_message()
        assert not transport.reading
        conn.data_received(w.frame(w.DATA, w.END_STREAM, 1, b"\0\0\0\0\0"))  # (read before the pause took hold)
        await asyncio.sleep(3 * timeout)  # the penalty (1 / REFUSED_MESSAGE_RATE) outlasts the timeout
        while not transport.reading:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.05)
        frames = _frames(bytes(transport.out))
        conn.connection_lost(None)
        return frames

    frames = loop.run_until_complete(scenario())
    assert not [f for f in frames if f[0] == w.RST_STREAM]
    assert [f for f in frames if f[0] == w.HEADERS and f[1] & w.END_STREAM and f[2] == 1]  # answered
