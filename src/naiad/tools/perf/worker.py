"""The load-generating process: an asyncio loop sending pre-built requests (closed loop or on a schedule).

The coordinator drives it over a multiprocessing pipe with small commands:
  ("start", level)  start sending (level = {"mode": "concurrency", "concurrency": n}
                    or {"mode": "rate", "rate": r, "distribution": "constant"|"poisson", "intervals_ns": [...]})
  ("flush",)        -> ("records", array, errors, first_error): requests completed since the last flush
  ("stop", secs)    stop sending, wait up to secs for in-flight requests -> ("stopped", array, errors, first_error)
  ("quit",)         end the process
Records are int64 rows (see measurement.py): start, end, send, recv, first response, responses, schedule lag.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from naiad.tools.http_wire import HttpConnection
from naiad.tools.perf.payloads import grpc_parameters, render_http
from naiad.tools.perf.sequences import Sequence, SequencePlanner, SequenceSpec

GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"
GRPC_STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
ERROR_BACKOFF_S = 0.01
STREAMS_PER_CHANNEL = 32


@dataclass
class WorkerSpec:
    protocol: str  # http | grpc
    host: str
    port: int
    payloads: list[bytes]
    streaming: bool = False
    decoupled: bool = False
    max_connections: int = 1024
    seed: int = 0
    request_timeout_s: float = 60.0
    sequence: SequenceSpec | None = None  # a sequence model: requests carry ids and start/end flags
    templates: list[Any] = field(default_factory=list)  # per payload: HttpTemplate (HTTP) or bytes (gRPC)
    process_index: int = 0
    process_count: int = 1


class RequestFailed(Exception):
    """The server answered the request with an error."""


class HttpSender:
    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.idle: list[HttpConnection] = []

    async def _connection(self) -> tuple[HttpConnection, bool]:
        """An idle keep-alive connection (reused=True) or a new one."""
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn, True
        return await HttpConnection.open(self.spec.host, self.spec.port), False

    async def send(self, payload: bytes) -> tuple[int, int, int, int, int]:
        """-> (start, end, send_ns, recv_ns, first_response)"""
        for _ in range(2):  # a reused connection the server closed while idle gets one retry on a new one
            conn, reused = await self._connection()
            start = time.monotonic_ns()
            waiter = conn.start(payload)
            sent = time.monotonic_ns()
            try:
                parser = await waiter
                break
            except ConnectionError:
                conn.close()
                if not reused or conn.first_byte_ns:
                    raise
            except BaseException:
                conn.close()
                raise
        else:
            raise ConnectionError("the server closed the connection before answering")
        end = time.monotonic_ns()
        first = conn.first_byte_ns or end
        if parser.headers.get("connection", "").lower() == "close" or conn.closed:
            conn.close()
        else:
            self.idle.append(conn)
        if parser.status != 200:
            raise RequestFailed(f"HTTP {parser.status}: {bytes(parser.body[:500]).decode(errors='replace')}")
        return start, end, sent - start, end - first, first

    async def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()


class GrpcSender:
    def __init__(self, spec: WorkerSpec) -> None:
        import grpc
        from tritonclient.grpc import service_pb2

        self.spec = spec
        self.grpc = grpc
        self.pb = service_pb2
        self.channels: list[Any] = []
        self.unary: list[Any] = []
        self.idle_streams: list[Any] = []
        self.open_streams = 0
        self.turn = itertools.count()

    def _channel(self, index: int) -> Any:
        while len(self.channels) <= index:
            channel = self.grpc.aio.insecure_channel(
                f"{self.spec.host}:{self.spec.port}",
                options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1),
                         ("grpc.use_local_subchannel_pool", 1)])
            self.channels.append(channel)
            self.unary.append(channel.unary_unary(GRPC_INFER))
        return self.channels[index]

    async def send(self, payload: bytes) -> tuple[int, int, int, int, int]:
        if self.spec.streaming:
            return await self._send_stream(payload)
        index = next(self.turn) % max(1, min(len(self.channels) or 1, 8))
        self._channel(index)
        start = time.monotonic_ns()
        try:
            await self.unary[index](payload, timeout=self.spec.request_timeout_s)
        except self.grpc.aio.AioRpcError as exc:
            raise RequestFailed(f"{exc.code().name}: {exc.details()}") from None
        end = time.monotonic_ns()
        return start, end, 0, 0, end

    def grow(self, concurrency: int) -> None:
        """Spread many outstanding unary calls over a few channels (HTTP/2 connections)."""
        self._channel(max(0, min(8, (concurrency + STREAMS_PER_CHANNEL - 1) // STREAMS_PER_CHANNEL) - 1))

    async def _send_stream(self, payload: bytes) -> tuple[int, int, int, int, int]:
        if self.idle_streams:
            call = self.idle_streams.pop()
        else:
            channel = self._channel(self.open_streams // STREAMS_PER_CHANNEL)
            call = channel.stream_stream(GRPC_STREAM)()
            self.open_streams += 1
        start = time.monotonic_ns()
        first = 0
        responses = 0
        try:
            await call.write(payload)
            while True:
                raw = await call.read()
                if raw is self.grpc.aio.EOF:
                    raise RequestFailed("the server closed the stream")
                now = time.monotonic_ns()
                first = first or now
                message = self.pb.ModelStreamInferResponse.FromString(raw)
                if message.error_message:
                    self.idle_streams.append(call)
                    raise RequestFailed(message.error_message)
                params = message.infer_response.parameters
                final = "triton_final_response" in params and params["triton_final_response"].bool_param
                if message.infer_response.outputs or not self.spec.decoupled:
                    responses += 1
                if not self.spec.decoupled or final:
                    break
        except self.grpc.aio.AioRpcError as exc:
            self.open_streams -= 1
            raise RequestFailed(f"{exc.code().name}: {exc.details()}") from None
        end = time.monotonic_ns()
        self.idle_streams.append(call)
        return start, end, 0, 0, first or end, responses

    async def close(self) -> None:
        for call in self.idle_streams:
            try:
                await call.done_writing()
            except Exception:
                pass
            call.cancel()
        for channel in self.channels:
            await channel.close()


class Worker:
    def __init__(self, conn: Connection, spec: WorkerSpec) -> None:
        self.conn = conn
        self.spec = spec
        self.sender: HttpSender | GrpcSender = GrpcSender(spec) if spec.protocol == "grpc" else HttpSender(spec)
        self.records: list[tuple[int, ...]] = []
        self.errors = 0
        self.first_error = ""
        self.stopping = False
        self.tasks: set[asyncio.Task[Any]] = set()
        self.commands: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self.payload_turn = itertools.count()
        self.slots: asyncio.Semaphore | None = None
        self.planner = (SequencePlanner(spec.sequence, spec.process_index, spec.process_count, spec.seed)
                        if spec.sequence else None)
        self.live: list[Sequence] = []  # request-rate mode: the sequences requests go to, in turn
        self.live_turn = itertools.count()

    def _on_readable(self) -> None:
        while self.conn.poll():
            try:
                self.commands.put_nowait(self.conn.recv())
            except EOFError:
                self.commands.put_nowait(("quit",))
                return

    def _take(self) -> np.ndarray:
        rows = np.array(self.records, dtype=np.int64).reshape(-1, 7)
        self.records = []
        return rows

    async def _one(self, lag_ns: int = 0, payload: bytes | None = None) -> None:
        if payload is None:
            payloads = self.spec.payloads
            payload = payloads[next(self.payload_turn) % len(payloads)]
        try:
            result = await self.sender.send(payload)
        except Exception as exc:
            self.errors += 1
            if not self.first_error:
                self.first_error = str(exc) or type(exc).__name__
            await asyncio.sleep(ERROR_BACKOFF_S)
            return
        start, end, send, recv, first = result[:5]
        responses = result[5] if len(result) > 5 else 1
        self.records.append((start, end, send, recv, first, responses, lag_ns))

    async def _closed_loop(self) -> None:
        while not self.stopping:
            await self._one()

    def _render(self, index: int, params: dict[str, object]) -> bytes:
        template = self.spec.templates[index]
        if self.spec.protocol == "http":
            return render_http(template, params)
        return template + grpc_parameters(params)

    async def _sequence_loop(self) -> None:
        """Closed loop over sequences: each slot plays one sequence at a time, one request after another."""
        assert self.planner is not None
        while not self.stopping:
            sequence = self.planner.new()
            while not sequence.done:
                if self.stopping and sequence.sent == 0:
                    break
                index, params = sequence.end_now() if self.stopping else sequence.next_step()
                await self._one(0, self._render(index, params))
            self.planner.finished(sequence)

    async def _sequence_request(self, lag_ns: int) -> None:
        """Request-rate mode: the next step of the next live sequence (a finished one is replaced at once)."""
        assert self.planner is not None
        slot = next(self.live_turn) % len(self.live)
        sequence = self.live[slot]
        index, params = sequence.next_step()
        if sequence.done:
            self.live[slot] = self._new_live()
        if sequence.lock is not None:
            async with sequence.lock:
                await self._one(lag_ns, self._render(index, params))
        else:
            await self._one(lag_ns, self._render(index, params))
        if params["sequence_end"]:
            self.planner.finished(sequence)

    def _new_live(self) -> Sequence:
        assert self.planner is not None and self.spec.sequence is not None
        sequence = self.planner.new()
        if self.spec.sequence.serial:
            sequence.lock = asyncio.Lock()
        return sequence

    async def _end_live(self) -> None:
        """Close the sequences a stopped request-rate level left open, so their ids are free again."""
        assert self.planner is not None
        open_ones = [s for s in self.live if 0 < s.sent < len(s.steps)]
        self.live = []
        for sequence in open_ones:
            index, params = sequence.end_now()
            await self._one(0, self._render(index, params))
            self.planner.finished(sequence)

    def _intervals(self, level: dict[str, Any]) -> Any:
        rng = np.random.default_rng(self.spec.seed)
        if level.get("intervals_ns"):
            yield from itertools.cycle(int(v) for v in level["intervals_ns"])
        mean_ns = 1e9 / float(level["rate"])
        while True:
            if level.get("distribution") == "poisson":
                block = rng.exponential(mean_ns, size=1024)
            else:
                block = np.full(1024, mean_ns)
            yield from block.astype(np.int64).tolist()

    async def _scheduled(self, level: dict[str, Any], slots: asyncio.Semaphore) -> None:
        intervals = self._intervals(level)
        next_ns = time.monotonic_ns() + int(level.get("offset_ns", 0))
        while not self.stopping:
            wait = next_ns - time.monotonic_ns()
            if wait > 0:
                await asyncio.sleep(wait / 1e9)
            if self.stopping:
                break
            await slots.acquire()
            lag = max(0, time.monotonic_ns() - next_ns)
            one = self._sequence_request(lag) if self.planner is not None else self._one(lag)
            task = asyncio.get_running_loop().create_task(one)
            self.tasks.add(task)
            task.add_done_callback(lambda t: (self.tasks.discard(t), slots.release()))
            next_ns += next(intervals)

    def _start(self, level: dict[str, Any]) -> None:
        self.stopping = False
        loop = asyncio.get_running_loop()
        if level["mode"] == "concurrency":
            count = int(level["concurrency"])
            if isinstance(self.sender, GrpcSender):
                self.sender.grow(count)
            loop_body = self._sequence_loop if self.planner is not None else self._closed_loop
            new = [loop.create_task(loop_body()) for _ in range(count)]
        else:
            slots = asyncio.Semaphore(self.spec.max_connections)
            if self.planner is not None and self.spec.sequence is not None:
                total, index, processes = self.spec.sequence.num_sequences, self.spec.process_index, self.spec.process_count
                share = max(1, total // processes + (1 if index < total % processes else 0))
                self.live = [self._new_live() for _ in range(share)]
            new = [loop.create_task(self._scheduled(level, slots))]
        for task in new:
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _stop(self, timeout_s: float) -> None:
        self.stopping = True
        if self.tasks:
            _, pending = await asyncio.wait(set(self.tasks), timeout=timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        self.tasks.clear()
        if self.live:
            await self._end_live()

    def _reply(self, kind: str) -> None:
        # uvloop made the pipe non-blocking for add_reader: a reply larger than the socket buffer
        # (a window of records) would fail with EAGAIN, so send it in blocking mode; the
        # coordinator is waiting for exactly this reply and drains it.
        fd = self.conn.fileno()
        os.set_blocking(fd, True)
        try:
            self.conn.send((kind, self._take(), self.errors, self.first_error))
        finally:
            os.set_blocking(fd, False)
        self.errors, self.first_error = 0, ""

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(self.conn.fileno(), self._on_readable)
        self.conn.send(("ready", None, 0, ""))
        try:
            while True:
                command = await self.commands.get()
                if command[0] == "start":
                    self.records.clear()
                    self._start(command[1])
                elif command[0] == "flush":
                    self._reply("records")
                elif command[0] == "stop":
                    await self._stop(float(command[1]))
                    self._reply("stopped")
                else:
                    break
        finally:
            loop.remove_reader(self.conn.fileno())
            await self._stop(1.0)
            await self.sender.close()


def worker_main(conn: Connection, spec: WorkerSpec) -> None:
    """Process entry point (spawned): uvloop for HTTP when installed, the stock loop for grpc.aio."""
    # Ctrl-C reaches the whole process group: the coordinator alone handles it and stops this process
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    runner: Any = asyncio.run
    if spec.protocol == "http":
        try:
            import uvloop

            runner = uvloop.run
        except ImportError:
            pass
    try:
        runner(Worker(conn, spec).run())
    except KeyboardInterrupt:
        pass
    finally:
        conn.close()
