"""One running worker process as the server sees it: its channel, its batches, BLS calls and shared memory."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import subprocess
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from naiad.backends.base import (
    BackendRequest,
    BackendResponse,
    ResponseCallback,
    ServerServices,
)
from naiad.protocol.errors import ErrorCode, NaiadError, internal
from naiad.runtime.process import bls
from naiad.runtime.process.framing import FrameDecoder, encode
from naiad.runtime.process.launcher import Launch, spawn
from naiad.runtime.process.outputs import OutputReader
from naiad.runtime.process.reply_spin import ReplySpin, cpus_beside_the_loop
from naiad.runtime.process.shm import (
    DEFAULT_BYTE_SIZE,
    GROWTH_BYTE_SIZE,
    BlockPool,
    PeerBlocks,
    remove_prefixed,
)
from naiad.runtime.process.tensors import NUMPY_OF, append_flat_inputs, datatype_of, pack

log = logging.getLogger("naiad.python")

RELEASE_DELAY = 0.002  # seconds a worker block may wait for a batch message to carry its release
RELEASE_BATCH = 16
_LOG_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}


class WorkerStartError(Exception):
    """The worker could not start or its initialize failed; the message is the load error."""


def error_of(error: tuple[Any, ...] | None) -> NaiadError | None:
    if error is None:
        return None
    message, code = error
    return NaiadError(ErrorCode[code] if code in ErrorCode.__members__ else ErrorCode.INTERNAL, message)


def _parameters(text: str | None) -> dict[str, Any]:
    if not text or text == "{}":
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _flat_request(request: BackendRequest, input_types: dict[str, str]) -> list[Any] | None:
    """The "y" message of a batch of one request whose inputs are small numeric arrays: ["y", batch_id,
    requested outputs, parameters, releases, request_id, correlation_id, flags, timeout, then (name,
    datatype, shape, data) of each input], batch_id and releases left for the caller (0 and []); None when
    an input does not fit it (BYTES, another dtype, empty, or too big to travel inline).

    What the "x" message says for such a batch, flat: fewer objects to build, pickle and unpickle
    (add_sub, with the flat "o" reply: ~9k instructions less per request in the server, ~2k in the worker)."""
    parameters = request.parameters
    fields: list[Any] = ["y", 0, tuple(request.requested_outputs),
                         json.dumps(parameters, default=str) if parameters else "{}", [],
                         request.request_id, request.correlation_id, request.flags, request.timeout_us]
    return fields if append_flat_inputs(fields, request.inputs, input_types) else None


class _Batch:
    __slots__ = ("requests", "respond", "open", "done", "block", "future")

    def __init__(self, requests: list[BackendRequest], respond: ResponseCallback, block: str | None,
                 future: asyncio.Future[Any]) -> None:
        self.requests = requests
        self.respond = respond
        self.open = {0} if len(requests) == 1 else set(range(len(requests)))
        self.done = False
        self.block = block
        self.future = future


class _Protocol(asyncio.Protocol):
    def __init__(self, session: WorkerSession) -> None:
        self._session = session
        self._decoder = FrameDecoder()

    def data_received(self, data: bytes) -> None:
        session = self._session
        for message in self._decoder.feed(data):
            try:
                kind = message[0]
                if kind == "o":  # a finished batch of one request, the usual message: no dispatch call
                    session._on_output(message)
                elif kind == "d":
                    session._on_done(message)
                else:
                    session.dispatch(message)
            except Exception:  # a bad message must not break the channel
                log.exception("error handling a message from worker %s", session.name)
        session.schedule_releases()

    def connection_lost(self, exc: Exception | None) -> None:
        self._session.on_lost()


class _WriteEnd(asyncio.BaseProtocol):
    """The pipe to the worker: it closes when the worker is gone."""

    def __init__(self, session: WorkerSession) -> None:
        self._session = session

    def connection_lost(self, exc: Exception | None) -> None:
        self._session.on_lost()


class WorkerSession:
    """A worker from spawn to exit. Any way it ends, its requests get an error and its segments are removed."""

    def __init__(self, name: str, launch: Launch, init: dict[str, Any], input_types: dict[str, str],
                 services: ServerServices | None, shm_prefix: str, on_death: Callable[[WorkerSession], None],
                 shm_sizes: tuple[int, int] = (DEFAULT_BYTE_SIZE, GROWTH_BYTE_SIZE)) -> None:
        self.name = name
        # Kept: asyncio.get_running_loop() costs a getpid() system call on every use.
        self._loop = asyncio.get_running_loop()
        self._launch = launch
        self._init = dict(init)
        self._input_types = input_types
        self.services = services
        self._on_death = on_death
        token = secrets.token_hex(4)
        self._server_prefix = f"{shm_prefix}{token}s"
        self._worker_prefix = f"{shm_prefix}{token}w"
        self.pool = BlockPool(self._server_prefix, *shm_sizes)
        self.peers = PeerBlocks()
        self.outputs: OutputReader | None = None
        self._batches: dict[int, _Batch] = {}
        self._next_batch = 0
        self._releases: list[str] = []
        self._release_timer: asyncio.TimerHandle | None = None
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._health_calls: dict[int, asyncio.Future[bool]] = {}
        self._next_health = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._reading: asyncio.ReadTransport | None = None
        self._transport: asyncio.WriteTransport | None = None  # sends to the worker
        self._outgoing: list[bytes] = []  # messages sent during this turn of the loop, written at its end
        self._reply_spin: ReplySpin | None = None  # set at start where the worker can run beside the loop
        self._spin_for_reply = False  # a batch goes out with this turn's write: wait for it if it is alone
        self._started: asyncio.Future[Any] | None = None
        self._exited = asyncio.Event()
        self.alive = False
        self.closing = False
        self.info: dict[str, Any] = {}
        self.async_execute = False  # info["async_execute"], read once per batch
        # A Python model's worker also takes a batch of one request as a flat "y" message (see _flat_request).
        self._flat_batches = init.get("host") != "backend"
        # Set by an instance that queues several batches at this worker: receives (requests, respond,
        # future) of the batches that had not started when the worker died.
        self.keep_unstarted: Callable[[list[tuple[Any, ...]]], None] | None = None
        self.pid = 0

    # ------------------------------------------------------------ start / stop

    async def start(self) -> dict[str, Any]:
        loop = self._loop
        self._started = loop.create_future()
        self.outputs = OutputReader(self.peers, self.release_peer, loop)
        process, read_fd, write_fd = spawn(self._launch)
        self._process = process
        self.pid = process.pid
        self.alive = True
        self._watch_exit(loop, process)
        # A pipe each way (see framing.BlockingChannel); the transports own and close the descriptors.
        reading, writing = open(read_fd, "rb", buffering=0), open(write_fd, "wb", buffering=0)
        protocol = _Protocol(self)
        self._reading, _ = await loop.connect_read_pipe(lambda: protocol, reading)
        if cpus_beside_the_loop():
            self._reply_spin = ReplySpin(read_fd, protocol.data_received)
        self._transport, _ = await loop.connect_write_pipe(lambda: _WriteEnd(self), writing)
        self._init["prefix"] = self._worker_prefix
        try:
            self._init["prewarmed"] = self.pool.prewarm()
        except OSError:  # no room in /dev/shm now: blocks are created on demand (and fail there, per request)
            self._init["prewarmed"] = None
        self.send(("init", self._init))
        self.info = await self._started
        self.async_execute = bool(self.info.get("async_execute"))
        if self.info.get("prewarmed"):
            self.peers.view(self.info["prewarmed"])
        return self.info

    def _watch_exit(self, loop: asyncio.AbstractEventLoop, process: subprocess.Popen[bytes]) -> None:
        """Notice the process ending even if something else holds its pipes open (pidfd, else a thread)."""
        pidfd_open = getattr(os, "pidfd_open", None)
        if pidfd_open is not None:
            try:
                fd = pidfd_open(process.pid)
            except OSError:
                fd = -1
            if fd >= 0:
                def readable() -> None:
                    loop.remove_reader(fd)
                    os.close(fd)
                    process.poll()
                    self.on_lost()
                loop.add_reader(fd, readable)
                return

        def wait() -> None:  # no pidfd (non-Linux): one small thread per worker waits for its exit
            process.wait()
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self.on_lost)
        threading.Thread(target=wait, name=f"naiad-wait-{process.pid}", daemon=True).start()

    async def finalize(self, timeout: float) -> None:
        """Ask the worker to run finalize and exit; kill it after `timeout` seconds."""
        self.closing = True
        if self.alive:
            with contextlib.suppress(Exception):
                self.send(("f",))
            try:
                await asyncio.wait_for(self._exited.wait(), timeout)
            except TimeoutError:
                log.warning("worker %s did not finish finalize within %ss: killing it", self.name, timeout)
                self.kill()
        await self.wait_exit()

    def kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(OSError):
                self._process.kill()

    async def wait_exit(self) -> None:
        if self._process is None:  # never spawned
            return
        if self._process.poll() is None:
            await asyncio.get_running_loop().run_in_executor(None, self._process.wait)
        await self._exited.wait()

    def on_lost(self) -> None:
        """The channel closed or the process ended: fail everything in flight, free the shared memory."""
        if not self.alive:
            return
        self.alive = False
        if not self.closing:
            self.kill()
        for transport in (self._reading, self._transport):
            if transport is not None:
                transport.close()
        message = f"Stub process '{self.name}' is not healthy."
        if self._started is not None and not self._started.done():
            code = self._process.poll() if self._process is not None else None
            detail = f" (exit code {code})" if code is not None else ""
            self._started.set_exception(WorkerStartError(
                f"the worker process of '{self.name}' exited during start-up{detail}; see the server log for its output"))
        batches = list(self._batches.values())
        if self.keep_unstarted is not None and not self.async_execute:
            batches = self._hand_back_unstarted(batches, self.keep_unstarted)
        for batch in batches:
            for index in sorted(batch.open):
                batch.respond(index, BackendResponse(None, error=internal(message), final=True))
            batch.open.clear()
            if not batch.future.done():
                batch.future.set_result(None)
        self._batches.clear()
        if self._release_timer is not None:
            self._release_timer.cancel()
            self._release_timer = None
        for task in self._tasks.values():
            task.cancel()
        for future in self._health_calls.values():
            if not future.done():
                future.set_result(False)
        if self.outputs is not None:
            self.outputs.closed = True
        self.pool.close()
        self.peers.close()
        remove_prefixed(self._worker_prefix)
        remove_prefixed(self._server_prefix)
        self._exited.set()
        if not self.closing:
            self._on_death(self)

    def _hand_back_unstarted(self, batches: list[_Batch],
                             keep: Callable[[list[tuple[Any, ...]]], None]) -> list[_Batch]:
        """Batches queued behind the one the worker was running never started (it runs them in order):
        they go to `keep_unstarted` to run on the next worker; the rest fail."""
        running = next((i for i, batch in enumerate(batches) if not batch.done), len(batches))
        unstarted = [b for b in batches[running + 1:] if not b.done and len(b.open) == len(b.requests)]
        if unstarted:
            keep([(b.requests, b.respond, b.future) for b in unstarted])
        return [b for b in batches if b not in unstarted]

    # ------------------------------------------------------------ sending

    def send(self, message: tuple[Any, ...]) -> None:
        if self._transport is None or self._transport.is_closing():
            raise internal(f"Stub process '{self.name}' is not healthy.")
        self._write(encode(message))

    def _write(self, data: bytes) -> None:
        """Queue one encoded message: those of one turn of the loop go out in one write, at its end.

        Each write to a worker blocked reading its pipe wakes it, and that wake-up was the largest kernel
        cost of a request in the server process (unpinned, wrk at c=32, perf: ~11% of its time); the
        worker reads every message a write brought at once."""
        outgoing = self._outgoing
        if not outgoing:
            self._loop.call_soon(self._flush)
        outgoing.append(data)

    def _flush(self) -> None:
        messages, self._outgoing = self._outgoing, []
        transport = self._transport
        if transport is not None and not transport.is_closing():  # else on_lost fails their batches
            transport.write(messages[0] if len(messages) == 1 else b"".join(messages))
            if self._spin_for_reply:
                self._spin_for_reply = False
                self._wait_if_alone()

    def _wait_if_alone(self) -> None:
        """The batch just written is the server's only request in flight: wait briefly for its reply
        here rather than in the loop's poll (reply_spin.py)."""
        spin, services = self._reply_spin, self.services
        # (alive: once the worker is lost its pipe's descriptor is closed, and its number may be reused)
        if (spin is not None and self.alive and len(self._batches) == 1
                and (services is None or services.inflight_requests <= 1)):
            spin.wait()

    def release_peer(self, name: str) -> None:
        """Hand a worker block back (its data was copied out); batched, see schedule_releases."""
        self._releases.append(name)
        self.schedule_releases()

    def schedule_releases(self) -> None:
        """Releases ride on the next batch message; a timer sends them if none comes soon (or many piled up)."""
        dropped = self.pool.take_dropped()
        if dropped and self.alive:
            self.send(("D", dropped))
        if not self._releases:
            return
        if len(self._releases) >= RELEASE_BATCH:
            self.flush_releases()
        elif self._release_timer is None:
            self._release_timer = self._loop.call_later(RELEASE_DELAY, self.flush_releases)

    def take_releases(self) -> list[str]:
        releases, self._releases = self._releases, []
        if self._release_timer is not None:
            self._release_timer.cancel()
            self._release_timer = None
        return releases

    def flush_releases(self) -> None:
        releases = self.take_releases()
        if releases and self.alive and self._transport is not None and not self._transport.is_closing():
            self.send(("R", releases))

    # ------------------------------------------------------------ batches

    def submit(self, requests: list[BackendRequest], respond: ResponseCallback) -> asyncio.Future[Any]:
        """Send one batch; the future resolves with the execution's (start, end) when execute returned
        (None when the worker was lost first)."""
        transport = self._transport
        if transport is None or transport.is_closing():
            raise internal(f"Stub process '{self.name}' is not healthy.")
        input_types = self._input_types
        flat = None
        if len(requests) == 1 and self._flat_batches:
            flat = _flat_request(requests[0], input_types)
        if flat is not None:
            block = None
            self._next_batch = batch_id = flat[1] = self._next_batch + 1
            releases = self._releases
            if releases:  # the worker's blocks read since the last message ride along
                flat[4] = self.take_releases()
            data = encode(flat)
        else:
            groups = []  # loops, not comprehensions: a comprehension is a function call each (3.11)
            for request in requests:
                groups.append([(name, input_types.get(name) or datatype_of(array), array)
                               for name, array in request.inputs.items()])
            block, metas = pack(self.pool, groups)
            described = []
            for r, meta in zip(requests, metas):
                described.append((r.request_id, r.correlation_id, r.flags,
                                  json.dumps(r.parameters, default=str) if r.parameters else "{}",
                                  r.timeout_us, tuple(r.requested_outputs), meta))
            self._next_batch = batch_id = self._next_batch + 1
            releases = self._releases
            if releases:  # the worker's blocks read since the last message ride along
                releases = self.take_releases()
            try:
                data = encode(("x", batch_id, block, described, releases))
            except Exception:
                if block:
                    self.pool.release(block)
                raise
        future = self._loop.create_future()
        self._batches[batch_id] = _Batch(requests, respond, block, future)
        self._write(data)
        self._spin_for_reply = True
        return future

    def finished(self, future: asyncio.Future[Any]) -> asyncio.Future[Any]:
        """`future`, from submit(), was cancelled along with its caller while the worker may still run its
        batch: a fresh future that resolves when the batch has finished (at once if it has)."""
        for batch in self._batches.values():
            if batch.future is future:
                if not batch.done and self.alive:
                    batch.future = self._loop.create_future()
                    return batch.future
                break
        ended = self._loop.create_future()
        ended.set_result(None)
        return ended

    def _close_if_complete(self, batch_id: int, batch: _Batch) -> None:
        if batch.done and not batch.open:
            self._batches.pop(batch_id, None)
            if batch.block:
                self.pool.release(batch.block)

    def _on_done(self, message: tuple[Any, ...]) -> None:
        _, batch_id, block, responses, error, rescheduled, timing = message
        reader = self.outputs
        assert reader is not None, "messages arrive only after start()"
        batch = self._batches.get(batch_id)
        if batch is None:
            reader.done_with(block)
            return
        for index in rescheduled:
            self._reschedule(batch, index)
        still_open = batch.open
        respond = batch.respond
        if error is not None:
            failure = error_of(error)
            for index in sorted(still_open):
                respond(index, BackendResponse(None, error=failure, final=True, execution_ns=timing))
            still_open.clear()
        elif responses is not None:
            for index, (metas, parameters, err) in enumerate(responses):
                if index not in still_open:
                    continue
                still_open.discard(index)
                if err is not None:  # an InferenceResponse(error=...): a success in Triton's statistics
                    respond(index, BackendResponse(None, _parameters(parameters), error_of(err), True,
                                                   counts_as_failure=False, execution_ns=timing))
                else:
                    outputs = reader.read(block, metas)
                    # "{}", the usual parameters, without a call
                    extra = {} if parameters == "{}" else _parameters(parameters)
                    respond(index, BackendResponse(outputs, extra, None, True, True, timing))
        if block:
            reader.done_with(block)
        batch.done = True
        if not batch.future.done():
            batch.future.set_result(timing)
        if not still_open:
            self._close_if_complete(batch_id, batch)

    def _on_output(self, message: tuple[Any, ...]) -> None:
        """("o", batch_id, parameters, timing, then (name, datatype, shape, data) of each output): a batch of
        one request answered with numeric outputs carried in the message (see python_host._finish),
        handled as _on_done handles the same batch in a "d" message."""
        batch_id = message[1]
        batch = self._batches.get(batch_id)
        if batch is None:
            return
        timing = message[3]
        still_open = batch.open
        if 0 in still_open:
            still_open.discard(0)
            outputs = {}
            for name, datatype, shape, data in message[4:]:
                outputs[name] = np.ndarray(shape, NUMPY_OF[datatype], data)
            parameters = message[2]
            extra = {} if parameters == "{}" else _parameters(parameters)
            batch.respond(0, BackendResponse(outputs, extra, None, True, True, timing))
        batch.done = True
        if not batch.future.done():
            batch.future.set_result(timing)
        if not still_open:  # what _close_if_complete does, without the call
            self._batches.pop(batch_id, None)
            if batch.block:
                self.pool.release(batch.block)

    def _reschedule(self, batch: _Batch, index: int) -> None:
        """The model released request `index` with RESCHEDULE: hand it back to the scheduler (it is no longer
        part of this batch), or answer it with an error when the model's scheduler cannot run it again."""
        if index not in batch.open:
            return  # already completed (a decoupled model sent FINAL): nothing to run again
        batch.open.discard(index)
        reschedule = batch.requests[index].reschedule
        if reschedule is None:
            batch.respond(index, BackendResponse(None, error=internal(
                "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, but the scheduler of model "
                f"'{self._init['model_name']}' cannot reschedule requests: use 'sequence_batching {{ iterative_sequence: "
                "true }' or no batching scheduler"), final=True))
            return
        reschedule()

    def _on_response(self, message: tuple[Any, ...]) -> None:
        _, batch_id, index, block, metas, parameters, err, final = message
        reader = self.outputs
        assert reader is not None, "messages arrive only after start()"
        batch = self._batches.get(batch_id)
        if batch is None or index not in batch.open:
            reader.done_with(block)
            return
        response: BackendResponse | None
        if err is not None:
            response = BackendResponse(None, _parameters(parameters), error_of(err), final, counts_as_failure=False)
        elif metas is None:
            response = BackendResponse(None, final=True) if final else None
        else:
            response = BackendResponse(reader.read(block, metas), _parameters(parameters), None, final)
        reader.done_with(block)
        if final:
            batch.open.discard(index)
        if response is not None:
            batch.respond(index, response)
        self._close_if_complete(batch_id, batch)

    # ------------------------------------------------------------ health (model.is_ready)

    async def check_ready(self, timeout: float = 5.0) -> bool:
        if not self.alive:
            return False
        self._next_health += 1
        call_id = self._next_health
        future = asyncio.get_running_loop().create_future()
        self._health_calls[call_id] = future
        try:
            self.send(("h", call_id))
            return bool(await asyncio.wait_for(future, timeout))
        except (TimeoutError, NaiadError):
            return False
        finally:
            self._health_calls.pop(call_id, None)

    # ------------------------------------------------------------ dispatch

    def dispatch(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "o":
            self._on_output(message)
        elif kind == "d":
            self._on_done(message)
        elif kind == "r":
            self._on_response(message)
        elif kind == "R":
            for name in message[1]:
                self.pool.release(name)
        elif kind == "D":
            self.peers.drop(message[1])
        elif kind == "b":
            self._start_task(message[1], bls.run_bls(self, message))
        elif kind == "B":
            task = self._tasks.get(message[1])
            if task is not None:
                task.cancel()
        elif kind == "q":
            self._on_query(message)
        elif kind == "l":
            log.log(_LOG_LEVELS.get(message[1], logging.INFO), "%s: %s", self.name, message[2])
        elif kind == "m":
            bls.forward_metric(self, message[1], message[2])
        elif kind == "H":
            future = self._health_calls.get(message[1])
            if future is not None and not future.done():
                future.set_result(message[2])
        elif kind == "ready":
            if self._started is not None and not self._started.done():
                self._started.set_result(message[1])
        elif kind == "init_error":
            if self._started is not None and not self._started.done():
                self._started.set_exception(WorkerStartError(message[1]))
        elif kind == "F":
            self.closing = True

    def _start_task(self, call_id: int, coroutine: Any) -> None:
        task = self._loop.create_task(coroutine)
        self._tasks[call_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(call_id, None))

    def _on_query(self, message: tuple[Any, ...]) -> None:
        _, call_id, op, args = message
        if op == "cancelled":
            batch_id, index = args
            batch = self._batches.get(batch_id)
            cancelled = bool(batch is not None and index < len(batch.requests) and batch.requests[index].is_cancelled())
            self.send(("q", call_id, True, cancelled))
            return
        self._start_task(-call_id, bls.run_control(self, call_id, op, args))
