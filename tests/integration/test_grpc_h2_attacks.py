"""The real server on Naiad's own HTTP/2 gRPC implementation under attack from raw h2c clients on
loopback: each attack runs a few seconds (reconnecting whenever the server closes the attacker)
while a tritonclient.grpc client keeps calling a model. The server must stay up, serve every normal
call with bounded latency, and keep its memory growth bounded."""

from __future__ import annotations

import socket
import statistics
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb

from naiad.frontends.grpc import h2_wire as w
from tests.support.onnx_models import add_sub_model
from tests.support.servers import RunningServer, start_server

ATTACK_SECS = 2.5
MAX_RSS_GROWTH_MIB = 100
MAX_MEDIAN_LATENCY = 1.0  # seconds; the idle server answers in milliseconds (the machine may be loaded)
INFER = "/inference.GRPCInferenceService/ModelInfer"
LIVE = "/inference.GRPCInferenceService/ServerLive"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo: Path = tmp_path_factory.mktemp("h2_attacks") / "models"
    add_sub_model(repo, "add_sub", datatype="INT32", dims=4)
    with start_server(repo, "--grpc-server-impl", "naiad") as running:
        yield running


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _message(request: object) -> bytes:
    raw = request.SerializeToString()  # type: ignore[attr-defined]
    return b"\x00" + len(raw).to_bytes(4, "big") + raw


def _infer_body() -> bytes:
    request = pb.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 4])
        tensor.contents.int_contents.extend([1, 2, 3, 4])
    return _message(request)


class Attacker:
    """One raw h2c connection that never reads; `send` reports False once the server closed it."""

    def __init__(self, port: int, stop: threading.Event) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=0.2)
        self.stop = stop
        self.encoder = hpack.Encoder()
        self.sid = 1
        self.send(w.PREFACE + w.settings_frame({}))

    def headers(self, path: str, end: bool = False, extra: tuple = ()) -> bytes:
        block = self.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
                                     ("content-type", "application/grpc"), ("te", "trailers"), *extra])
        return w.frame(w.HEADERS, w.END_HEADERS | (w.END_STREAM if end else 0), self.sid, block)

    def send(self, data: bytes) -> bool:
        """All of `data`, waiting while the server does not read us (back-pressure), until told to stop."""
        view = memoryview(data)
        while view:
            try:
                view = view[self.sock.send(view):]
            except TimeoutError:
                if self.stop.is_set():
                    return False
            except OSError:
                return False
        return True

    def close(self) -> None:
        self.sock.close()


def rapid_reset(a: Attacker) -> bytes:
    out = []
    body = _infer_body()
    for _ in range(50):
        out += [a.headers(INFER), w.frame(w.DATA, w.END_STREAM, a.sid, body), w.rst_stream(a.sid, w.CANCEL)]
        a.sid += 2
    return b"".join(out)


def _repeat(frame: bytes) -> Callable[[Attacker], bytes]:
    return lambda a: frame * 500


def empty_continuation(a: Attacker) -> bytes:
    if a.sid == 1:
        a.sid = 3
        return w.frame(w.HEADERS, 0, 1, a.encoder.encode([(":method", "POST")])) + w.frame(w.CONTINUATION, 0, 1) * 499
    return w.frame(w.CONTINUATION, 0, 1) * 500


def empty_data(a: Attacker) -> bytes:
    if a.sid == 1:
        a.sid = 3
        return a.headers(INFER) + w.frame(w.DATA, 0, 1) * 499
    return w.frame(w.DATA, 0, 1) * 500


def unread_responses(a: Attacker) -> bytes:
    out = []
    body = _message(pb.ServerLiveRequest())
    for _ in range(50):
        out += [a.headers(LIVE), w.frame(w.DATA, w.END_STREAM, a.sid, body)]
        a.sid += 2
    return b"".join(out)


def window_overrun(a: Attacker) -> bytes:
    """A stream declaring a 64 MiB message, then 2 MiB of it without waiting for any WINDOW_UPDATE."""
    chunk = w.frame(w.DATA, 0, a.sid, b"\x00" * w.DEFAULT_FRAME_SIZE)
    out = a.headers(INFER) + w.frame(w.DATA, 0, a.sid, b"\x00" + (64 << 20).to_bytes(4, "big")) + chunk * 128
    a.sid += 2
    return out


_BOMB: list[bytes] = []


def _bomb() -> bytes:
    """A 256 KiB gzip message that inflates to 256 MiB (past the 64 MiB default of --grpc-max-decompressed-size)."""
    if not _BOMB:
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        zeros = bytes(1 << 20)
        _BOMB.append(b"".join(z.compress(zeros) for _ in range(256)) + z.flush())
    return _BOMB[0]


def gzip_bomb(a: Attacker) -> bytes:
    return _compressed_call(a, _bomb())


def gzip_bomb_lying_trailer(a: Attacker) -> bytes:
    """The same bomb whose gzip trailer claims 1000 bytes: only inflating it shows its size."""
    return _compressed_call(a, _bomb()[:-4] + (1000).to_bytes(4, "little"))


def _compressed_call(a: Attacker, bomb: bytes) -> bytes:
    out = a.headers(INFER, extra=(("grpc-encoding", "gzip"),))
    out += w.frame(w.DATA, 0, a.sid, b"\x01" + len(bomb).to_bytes(4, "big"))
    for i in range(0, len(bomb), w.DEFAULT_FRAME_SIZE):
        out += w.frame(w.DATA, 0, a.sid, bomb[i:i + w.DEFAULT_FRAME_SIZE])
    out += w.frame(w.DATA, w.END_STREAM, a.sid)
    a.sid += 2
    return out


ATTACKS: dict[str, Callable[[Attacker], bytes]] = {
    "rapid_reset": rapid_reset,
    "priority_flood": _repeat(w.frame(w.PRIORITY, 0, 1, b"\x00\x00\x00\x00\x10")),
    "unknown_frame_flood": _repeat(w.frame(0x20, 0, 0, b"x")),
    "ping_flood": _repeat(w.frame(w.PING, 0, 0, b"12345678")),
    "settings_flood": _repeat(w.settings_frame({w.S_INITIAL_WINDOW_SIZE: 65535})),
    "window_update_flood": _repeat(w.window_update(0, 1)),
    "empty_continuation_flood": empty_continuation,
    "empty_data_flood": empty_data,
    "unread_responses": unread_responses,
    "window_overrun": window_overrun,
    "gzip_bomb": gzip_bomb,
    "gzip_bomb_lying_trailer": gzip_bomb_lying_trailer,
}


def _attack(port: int, make: Callable[[Attacker], bytes], stop: threading.Event, stats: dict[str, int]) -> None:
    """Attack from one connection at a time; reconnect whenever the server ends it."""
    while not stop.is_set():
        try:
            attacker = Attacker(port, stop)
        except OSError:
            stats["connect_failures"] += 1
            time.sleep(0.05)
            continue
        stats["connections"] += 1
        try:
            while not stop.is_set() and attacker.send(make(attacker)):
                pass
        finally:
            attacker.close()


@pytest.mark.parametrize("kind", sorted(ATTACKS))
def test_attack_leaves_the_server_serving(server: RunningServer, kind: str) -> None:
    pid = server.process.pid
    data = np.array([[1, 2, 3, 4]], dtype=np.int32)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        inputs = [grpcclient.InferInput(name, [1, 4], "INT32") for name in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(data)
        client.infer("add_sub", inputs)  # warm
        baseline = rss_mib(pid)
        stop = threading.Event()
        stats = {"connections": 0, "connect_failures": 0}
        thread = threading.Thread(target=_attack, args=(server.grpc_port, ATTACKS[kind], stop, stats), daemon=True)
        latencies: list[float] = []
        peak = baseline
        thread.start()
        try:
            deadline = time.monotonic() + ATTACK_SECS
            while time.monotonic() < deadline:
                started = time.monotonic()
                result = client.infer("add_sub", inputs, client_timeout=30)
                latencies.append(time.monotonic() - started)
                assert np.array_equal(result.as_numpy("OUTPUT0"), data + data)
                peak = max(peak, rss_mib(pid))
                time.sleep(0.05)
        finally:
            stop.set()
            thread.join(30)
        assert server.process.poll() is None, "the server died"
        after = time.monotonic()
        assert client.is_server_live()
        client.infer("add_sub", inputs, client_timeout=30)
        assert time.monotonic() - after < 10, "normal calls were slow after the attack"
    assert latencies and statistics.median(latencies) < MAX_MEDIAN_LATENCY, latencies
    assert peak - baseline < MAX_RSS_GROWTH_MIB, f"RSS {baseline:.0f} -> {peak:.0f} MiB ({stats})"
    assert rss_mib(pid) - baseline < MAX_RSS_GROWTH_MIB
