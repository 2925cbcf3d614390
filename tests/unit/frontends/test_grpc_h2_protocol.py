"""Naiad's own gRPC server at the HTTP/2 level: a raw h2c client drives the protocol edges grpcio clients
rarely hit (deadlines, RST_STREAM, GOAWAY, malformed frames, huge declared lengths, stream limits)."""

from __future__ import annotations

import asyncio
import gzip
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb

from naiad.frontends.grpc import h2_wire as w
from naiad.frontends.grpc.guard import Guard
from naiad.frontends.grpc.h2_server import H2GrpcServer
from naiad.frontends.grpc.server import GrpcFrontend
from tests.unit.frontends.test_grpc_servicer import FakeServer

WAIT = 10.0
INFER = "/inference.GRPCInferenceService/ModelInfer"


class Served:
    def __init__(self, fake: FakeServer, frontend: GrpcFrontend, port: int, loop: asyncio.AbstractEventLoop) -> None:
        self.fake, self.frontend, self.port, self.loop = fake, frontend, port, loop

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop_in_background(self) -> Any:
        return asyncio.run_coroutine_threadsafe(self.frontend.stop(), self.loop)

    def release_gate(self, key: str) -> None:
        self.loop.call_soon_threadsafe(lambda: self.fake._gates.setdefault(key, asyncio.Event()).set())


def _serve(fake: FakeServer) -> Iterator[Served]:
    fake.config.grpc_server_impl = "naiad"  # these tests are about Naiad's own server, whatever the suite runs
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    frontend = GrpcFrontend(fake, "127.0.0.1", 0)
    port = asyncio.run_coroutine_threadsafe(frontend.start(), loop).result(WAIT)
    try:
        yield Served(fake, frontend, port, loop)
    finally:
        asyncio.run_coroutine_threadsafe(frontend.stop(), loop).result(WAIT)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(WAIT)
        loop.close()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    yield from _serve(FakeServer())


@pytest.fixture()
def own(request: pytest.FixtureRequest) -> Iterator[Served]:
    """A server of the test's own (stopped by the test, or with changed settings)."""
    fake = FakeServer()
    fake.config.grpc_incomplete_request_timeout_secs = 0.6  # what --grpc-incomplete-request-timeout-secs sets
    for key, value in getattr(request, "param", {}).items():
        setattr(fake.config, key, value)
    yield from _serve(fake)


class RawClient:
    """HTTP/2 with prior knowledge over a blocking socket; frames are read as (type, flags, stream, payload)."""

    def __init__(self, port: int, preface: bytes = w.PREFACE) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.buf = b""
        self.sock.sendall(preface + w.settings_frame({}))

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def call(self, sid: int, path: str = INFER, body: bytes | None = None, extra: tuple = (), end: bool = True) -> None:
        headers = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
                   ("content-type", "application/grpc"), ("te", "trailers"), *extra]
        block = self.encoder.encode(headers)
        out = w.frame(w.HEADERS, w.END_HEADERS | (w.END_STREAM if body is None and end else 0), sid, block)
        if body is not None:
            out += w.frame(w.DATA, w.END_STREAM if end else 0, sid, body)
        self.send(out)

    def frame(self, timeout: float = WAIT) -> tuple[int, int, int, bytes] | None:
        """The next frame, or None when the server closed the connection."""
        self.sock.settimeout(timeout)
        while True:
            if len(self.buf) >= 9:
                length = int.from_bytes(self.buf[:3], "big")
                if len(self.buf) >= 9 + length:
                    ftype, flags = self.buf[3], self.buf[4]
                    sid = struct.unpack(">I", self.buf[5:9])[0] & 0x7FFFFFFF
                    payload, self.buf = self.buf[9:9 + length], self.buf[9 + length:]
                    return ftype, flags, sid, payload
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk

    def until(self, wanted: Any, timeout: float = WAIT) -> tuple[int, int, int, bytes] | None:
        """Frames up to the first one `wanted(frame)` accepts; None if the connection closes first."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.frame(max(deadline - time.monotonic(), 0.01))
            if got is None or wanted(got):
                return got

    def status(self, sid: int) -> dict[str, str]:
        """The trailers of stream `sid` (the HEADERS frame with END_STREAM)."""
        got = self.until(lambda f: f[0] == w.HEADERS and f[2] == sid and f[1] & w.END_STREAM)
        assert got is not None, "connection closed before the call's trailers"
        return dict(self.decoder.decode(got[3]))


def _message(request: Any) -> bytes:
    raw = request.SerializeToString()
    return b"\x00" + len(raw).to_bytes(4, "big") + raw


def _gate(key: str, after: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="gate", id=key)
    request.inputs.add(name="KEY", datatype="BYTES", shape=[1]).contents.bytes_contents.append(key.encode())
    request.inputs.add(name="AFTER", datatype="BYTES", shape=[1]).contents.bytes_contents.append(after.encode())
    return request


# ---------------------------------------------------------------- connection basics


def test_settings_ping_and_a_unary_call(served: Served) -> None:
    client = RawClient(served.port)
    try:
        settings = client.until(lambda f: f[0] == w.SETTINGS and not f[1] & w.ACK)
        assert settings is not None
        client.send(w.frame(w.PING, 0, 0, b"12345678"))
        assert client.until(lambda f: f[0] == w.PING)[1:] == (w.ACK, 0, b"12345678")
        client.call(1, "/inference.GRPCInferenceService/ServerLive", _message(pb.ServerLiveRequest()))
        trailers = client.status(1)
        assert trailers["grpc-status"] == "0"
    finally:
        client.close()


def test_requests_that_are_not_plain_grpc_calls_get_their_answers(served: Served) -> None:
    """Wrong method or content type, a bad grpc-timeout, an unknown grpc-encoding: each gets its answer, also
    when its header block is a remembered one (literals without indexing, sent twice), and the connection
    goes on serving calls."""
    def block(*headers: tuple[bytes, bytes]) -> bytes:
        return b"".join(w.literal(name, value) for name, value in headers)

    base = ((b":scheme", b"http"), (b":path", b"/inference.GRPCInferenceService/ServerLive"), (b":authority", b"x"))
    grpc_post = ((b":method", b"POST"), *base, (b"content-type", b"application/grpc"))
    cases = [
        (((b":method", b"GET"), *base, (b"content-type", b"application/grpc")), {":status": "405"}),
        (((b":method", b"POST"), *base, (b"content-type", b"text/plain")), {":status": "415"}),
        ((*grpc_post, (b"grpc-timeout", b"soon")), {"grpc-status": "13", "grpc-message": "Invalid grpc-timeout: soon"}),
        ((*grpc_post, (b"grpc-encoding", b"br")), {"grpc-status": "12"}),
        (grpc_post, {"grpc-status": "0"}),
    ]
    client = RawClient(served.port)
    try:
        sid = 1
        for _ in range(2):
            for headers, expected in cases:
                body = _message(pb.ServerLiveRequest())
                client.send(w.frame(w.HEADERS, w.END_HEADERS, sid, block(*headers))
                            + w.frame(w.DATA, w.END_STREAM, sid, body))
                got = client.status(sid)
                assert {key: got.get(key) for key in expected} == expected, headers
                sid += 2
    finally:
        client.close()


def test_unknown_method_is_unimplemented(served: Served) -> None:
    with grpc.insecure_channel(served.url) as channel:
        call = channel.unary_unary("/no.Such/Method", request_serializer=lambda b: b, response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as info:
            call(b"", timeout=WAIT)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_error_message_is_percent_encoded(served: Served) -> None:
    client = RawClient(served.port)
    try:
        request = pb.ModelInferRequest(model_name="unknown-ü%model")
        client.call(1, INFER, _message(request))
        trailers = client.status(1)
        assert trailers["grpc-status"] == str(grpc.StatusCode.NOT_FOUND.value[0])
        assert "%C3%BC%25model" in trailers["grpc-message"]
        assert w.decode_message(trailers["grpc-message"]).endswith("'unknown-ü%model' is not found")
    finally:
        client.close()


def test_large_tensors_both_ways_and_gzip_requests(served: Served) -> None:
    big = np.arange(1 << 20, dtype=np.float32).reshape(1, -1)  # 4 MB each way
    with grpcclient.InferenceServerClient(served.url) as client:
        inp = grpcclient.InferInput("X", list(big.shape), "FP32")
        inp.set_data_from_numpy(big)
        assert np.array_equal(client.infer("echo", [inp]).as_numpy("OUT_X"), big)
        assert np.array_equal(client.infer("echo", [inp], compression_algorithm="gzip").as_numpy("OUT_X"), big)


def test_compressed_message_body_is_inflated(served: Served) -> None:
    client = RawClient(served.port)
    try:
        raw = gzip.compress(pb.ServerLiveRequest().SerializeToString() or b"")
        client.call(1, "/inference.GRPCInferenceService/ServerLive", b"\x01" + len(raw).to_bytes(4, "big") + raw,
                    extra=(("grpc-encoding", "gzip"),))
        assert client.status(1)["grpc-status"] == "0"
        client.call(3, "/inference.GRPCInferenceService/ServerLive", b"\x01" + len(raw).to_bytes(4, "big") + raw)
        assert client.status(3)["grpc-status"] == str(grpc.StatusCode.INTERNAL.value[0])
    finally:
        client.close()


# ---------------------------------------------------------------- deadlines and cancellation


def test_deadline_expiry_cancels_the_handler(served: Served) -> None:
    client = RawClient(served.port)
    try:
        started = time.monotonic()
        client.call(1, INFER, _message(_gate("dl-wait", "dl-never")), extra=(("grpc-timeout", "300m"),))
        trailers = client.status(1)
        assert trailers["grpc-status"] == str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
        assert 0.25 < time.monotonic() - started < 5
        assert served.fake.cancelled.get(timeout=WAIT) == "dl-wait"
    finally:
        client.close()


def test_rst_stream_cancels_the_handler(served: Served) -> None:
    client = RawClient(served.port)
    try:
        client.call(1, INFER, _message(_gate("rst-wait", "rst-never")))
        served.fake.wait_seen("rst-wait")
        client.send(w.rst_stream(1, w.CANCEL))
        assert served.fake.cancelled.get(timeout=WAIT) == "rst-wait"
        client.call(3, "/inference.GRPCInferenceService/ServerReady", _message(pb.ServerReadyRequest()))
        assert client.status(3)["grpc-status"] == "0"
    finally:
        client.close()


@pytest.mark.parametrize("own", [{"exit_timeout_secs": 5.0}], indirect=True)
def test_goaway_lets_in_flight_calls_finish(own: Served) -> None:
    client = RawClient(own.port)
    try:
        client.call(1, INFER, _message(_gate("drain", "drain-after")))
        own.fake.wait_seen("drain")
        stopping = own.stop_in_background()
        goaway = client.until(lambda f: f[0] == w.GOAWAY)
        assert goaway is not None and struct.unpack(">II", goaway[3][:8]) == (1, w.NO_ERROR)
        client.call(3, "/inference.GRPCInferenceService/ServerReady", _message(pb.ServerReadyRequest()))
        refused = client.until(lambda f: f[2] == 3)
        assert refused is not None and refused[0] == w.RST_STREAM
        own.release_gate("drain-after")
        assert client.status(1)["grpc-status"] == "0"
        assert client.until(lambda f: False) is None  # the server closes the drained connection
        stopping.result(WAIT)
    finally:
        client.close()


@pytest.mark.parametrize("own", [{"exit_timeout_secs": 0.3}], indirect=True)
def test_calls_past_the_exit_timeout_are_cancelled(own: Served) -> None:
    client = RawClient(own.port)
    try:
        client.call(1, INFER, _message(_gate("late", "late-never")))
        own.fake.wait_seen("late")
        own.stop_in_background().result(WAIT)
        assert own.fake.cancelled.get(timeout=WAIT) == "late"
        assert client.until(lambda f: False) is None
    finally:
        client.close()


# ---------------------------------------------------------------- hostile input


@pytest.mark.parametrize("bad", [
    w.frame(w.PING, 0, 0, b"short"),                          # PING must be 8 bytes
    b"\x01\x00\x00" + bytes((w.DATA, 0)) + b"\x00\x00\x00\x01",  # declared frame of 64 KiB > max frame size
    w.frame(w.HEADERS, w.END_HEADERS, 2, b"\x82"),            # even (server-side) stream id
    w.frame(w.HEADERS, w.END_HEADERS, 1, b"\xff\xff\xff\xff"),  # undecodable HPACK
    w.frame(w.DATA, 0, 0, b"x"),                              # DATA on stream 0
    w.frame(w.SETTINGS, 0, 0, b"12345"),                      # SETTINGS not a multiple of 6
])
def test_malformed_frames_end_the_connection_with_goaway(served: Served, bad: bytes) -> None:
    client = RawClient(served.port)
    try:
        client.send(bad)
        goaway = client.until(lambda f: f[0] == w.GOAWAY)
        assert goaway is not None and struct.unpack(">I", goaway[3][4:8])[0] != w.NO_ERROR
        assert client.until(lambda f: False) is None
    finally:
        client.close()
    with grpcclient.InferenceServerClient(served.url) as good:
        assert good.is_server_live()


def test_not_http2_is_closed(served: Served) -> None:
    client = RawClient(served.port, preface=b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        assert client.until(lambda f: False) is None
    finally:
        client.close()


def test_oversized_declared_message_is_resource_exhausted(served: Served) -> None:
    client = RawClient(served.port)
    try:
        client.call(1, INFER, b"\x00\xff\xff\xff\xf0" + b"x" * 10, end=False)
        trailers = client.status(1)
        assert trailers["grpc-status"] == str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
    finally:
        client.close()


def test_half_sent_request_is_timed_out(own: Served) -> None:
    client = RawClient(own.port)
    try:
        client.call(1, INFER, b"\x00\x10\x00\x00\x00" + b"x" * 100, end=False)  # declares 256 MiB, sends 100 B
        reset = client.until(lambda f: f[0] == w.RST_STREAM and f[2] == 1, timeout=5)
        assert reset is not None
        client.send(b"\x00\x00\x10")  # a partial frame header, never completed
        assert client.until(lambda f: f[0] == w.GOAWAY, timeout=5) is not None
    finally:
        client.close()


def test_missing_preface_is_timed_out(own: Served) -> None:
    sock = socket.create_connection(("127.0.0.1", own.port), timeout=WAIT)
    try:
        sock.sendall(w.PREFACE[:10])
        started = time.monotonic()
        while sock.recv(65536):
            pass
        assert time.monotonic() - started < 5
    finally:
        sock.close()


@pytest.mark.parametrize("own", [{"grpc_max_concurrent_streams": 1}], indirect=True)
def test_concurrent_stream_limit_is_advertised_and_enforced(own: Served) -> None:
    client = RawClient(own.port)
    try:
        settings = client.until(lambda f: f[0] == w.SETTINGS and not f[1] & w.ACK)
        pairs = dict(struct.unpack(">HI", settings[3][i:i + 6]) for i in range(0, len(settings[3]), 6))
        assert pairs[w.S_MAX_CONCURRENT_STREAMS] == 1
        client.call(1, INFER, _message(_gate("one", "one-after")))
        own.fake.wait_seen("one")
        client.call(3, "/inference.GRPCInferenceService/ServerReady", _message(pb.ServerReadyRequest()))
        refused = client.until(lambda f: f[2] == 3)
        assert refused[0] == w.RST_STREAM and struct.unpack(">I", refused[3])[0] == w.REFUSED_STREAM
        own.release_gate("one-after")
        assert client.status(1)["grpc-status"] == "0"
    finally:
        client.close()


def test_default_stream_limit_is_advertised_and_the_stream_past_it_is_refused(own: Served) -> None:
    limit = own.fake.config.grpc_max_concurrent_streams
    assert limit == 1000  # ServerConfig's default, what `naiad serve` uses without --grpc-max-concurrent-streams
    client = RawClient(own.port)
    try:
        settings = client.until(lambda f: f[0] == w.SETTINGS and not f[1] & w.ACK)
        pairs = dict(struct.unpack(">HI", settings[3][i:i + 6]) for i in range(0, len(settings[3]), 6))
        assert pairs[w.S_MAX_CONCURRENT_STREAMS] == limit
        held = [2 * i + 1 for i in range(limit)]
        for sid in held:  # every one waits in the core for the same release
            client.call(sid, INFER, _message(_gate(f"held-{sid}", "release")))
        own.fake.wait_seen(f"held-{held[-1]}")
        past = held[-1] + 2
        client.call(past, "/inference.GRPCInferenceService/ServerReady", _message(pb.ServerReadyRequest()))
        refused = client.until(lambda f: f[2] == past)
        assert refused[0] == w.RST_STREAM and struct.unpack(">I", refused[3])[0] == w.REFUSED_STREAM
        own.release_gate("release")
        assert all(client.status(sid)["grpc-status"] == "0" for sid in held)
        client.call(past + 2, "/inference.GRPCInferenceService/ServerReady", _message(pb.ServerReadyRequest()))
        assert client.status(past + 2)["grpc-status"] == "0"  # slots free again: new streams are served
    finally:
        client.close()


@pytest.mark.parametrize("own", [{"grpc_max_concurrent_streams": 0}], indirect=True)
def test_no_stream_limit_when_set_to_zero(own: Served) -> None:
    client = RawClient(own.port)
    try:
        settings = client.until(lambda f: f[0] == w.SETTINGS and not f[1] & w.ACK)
        pairs = dict(struct.unpack(">HI", settings[3][i:i + 6]) for i in range(0, len(settings[3]), 6))
        assert w.S_MAX_CONCURRENT_STREAMS not in pairs
    finally:
        client.close()


@pytest.mark.parametrize("own", [{"grpc_max_concurrent_rpcs": 1}], indirect=True)
def test_rpcs_over_the_server_limit_are_resource_exhausted(own: Served) -> None:
    client = RawClient(own.port)
    try:
        client.call(1, INFER, _message(_gate("hold", "hold-after")))
        own.fake.wait_seen("hold")
        client.call(3, "/inference.GRPCInferenceService/ServerReady", _message(pb.ServerReadyRequest()))
        assert client.status(3)["grpc-status"] == str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
        own.release_gate("hold-after")
        assert client.status(1)["grpc-status"] == "0"
        client.call(5, "/inference.GRPCInferenceService/ServerReady", _message(pb.ServerReadyRequest()))
        assert client.status(5)["grpc-status"] == "0"
    finally:
        client.close()


def test_wire_helpers() -> None:
    assert w.parse_timeout("300m") == pytest.approx(0.3)
    assert w.parse_timeout("2S") == 2.0 and w.parse_timeout("1H") == 3600.0
    assert w.parse_timeout("12") is None and w.parse_timeout("123456789S") is None and w.parse_timeout("1x") is None
    encoder = hpack.Encoder()
    decoder = w.HeaderDecoder(1 << 16)
    warm = encoder.encode([(":path", "/a/B"), ("x-key", "v")])  # incremental indexing: not remembered
    assert decoder.decode(warm).path == "/a/B"
    again = encoder.encode([(":path", "/a/B"), ("x-key", "v")])  # now indexed-only: remembered
    first = decoder.decode(again)
    assert first.metadata == (("x-key", "v"),) and decoder.decode(again) is first


def test_the_guard_is_applied_once_per_registered_method_unless_a_call_may_be_restricted() -> None:
    async def method(request: bytes, context: object) -> bytes:
        return request

    async def scenario(restricted: list[str]) -> tuple[list[str], list[Any]]:
        guard = Guard(restricted, "")
        applied: list[str] = []
        apply = guard.apply
        guard.apply = lambda path, handler, metadata: (applied.append(path), apply(path, handler, metadata))[1]  # type: ignore[method-assign]
        server = H2GrpcServer(guard=guard)
        try:
            server.add_registered_method_handlers("inference.GRPCInferenceService",
                                                  {"ModelInfer": grpc.unary_unary_rpc_method_handler(method)})
            calls = [(), (("triton-grpc-protocol-key", "v"),), ()]
            return applied, [server.handler(INFER, metadata) for metadata in calls]
        finally:
            server.inflater.close()

    applied, handlers = asyncio.run(scenario([]))
    assert applied == [INFER] and handlers[0] is handlers[1] is handlers[2]
    applied, handlers = asyncio.run(scenario(["inference:key=v"]))  # the header decides, call by call
    assert applied == [INFER] * 3
    assert handlers[0] is not handlers[1] and handlers[1].unary_unary is method
