"""Worker side of the IPC: the channel, its reader, the shared-memory blocks, and what pb_utils calls
(responses, BLS, model control, logs, metrics)."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable
from typing import Any

import triton_python_backend_utils as pb_utils
from naiad.runtime.process.framing import BlockingChannel
from naiad.runtime.process.inbox import Call, Inbox
from naiad.runtime.process.shm import BlockPool, PeerBlocks
from naiad.runtime.process.tensors import pack, unpack_one
from triton_python_backend_utils import _runtime

_END = object()


def error_tuple(error: Any) -> tuple[Any, ...] | None:
    if error is None:
        return None
    return (error.message(), error.code_name())


class BlsCall(Call):
    """One BLS request: its responses arrive as pb_utils.InferenceResponse objects, then _END."""

    __slots__ = ("runtime", "call_id")

    def __init__(self, runtime: WorkerRuntime, call_id: int) -> None:
        super().__init__()
        self.runtime = runtime
        self.call_id = call_id

    def next_response(self) -> Any:
        if self.finished:
            return None
        item = self.runtime.inbox.wait(self)
        if item is _END:
            self.finished = True
            return None
        return item

    async def next_response_async(self) -> Any:
        if self.finished:
            return None
        item = await self.runtime.inbox.wait_async(self)
        if item is _END:
            self.finished = True
            return None
        return item

    def cancel(self) -> None:
        if not self.finished:
            self.runtime.channel.send(("B", self.call_id))


class WorkerRuntime:
    """Installed into pb_utils; owns the worker's channel, its output blocks and the server's blocks it reads."""

    def __init__(self, channel: BlockingChannel, prefix: str, decoupled: bool, model_name: str, model_version: int,
                 log_verbose: int, shm_sizes: tuple[int, int] | None = None) -> None:
        self.channel = channel
        self.pool = BlockPool(prefix, *(shm_sizes or ()))
        self.peers = PeerBlocks()
        self.decoupled = decoupled
        self.model_name = model_name
        self.model_version = model_version
        self.log_verbose = log_verbose
        self._calls: dict[int, Call] = {}
        self._ids = itertools.count(1)
        self.inbox = Inbox(channel, self._dispatch, self._on_eof)
        # Called (by the reading thread) for "x" and "y" when batches run on an event loop instead of the main thread.
        self.on_async_batch: Callable[[tuple[Any, ...]], None] | None = None
        self.on_health: Callable[[tuple[Any, ...]], None] = lambda message: None

    # ------------------------------------------------------------ responses (pb_utils sender)

    def pack_response(self, requested: tuple[Any, ...], response: Any) -> tuple[Any, ...]:
        tensors = [(t._name, t._datatype, t._array) for t in response._tensors if t._name in requested]
        block, metas = pack(self.pool, [tensors])
        return block, metas[0]

    def send_response(self, handle: tuple[Any, ...], requested: tuple[Any, ...], response: Any, final: bool) -> None:
        batch_id, index = handle
        if response is None:
            self.channel.send(("r", batch_id, index, None, None, None, None, final))
            return
        if response.has_error():
            self.channel.send(("r", batch_id, index, None, None, response.parameters(), error_tuple(response.error()), final))
            return
        block, metas = self.pack_response(requested, response)
        self.channel.send(("r", batch_id, index, block, metas, response.parameters(), None, final))

    def is_cancelled(self, handle: tuple[Any, ...]) -> bool:
        return bool(self._query("cancelled", handle))

    # ------------------------------------------------------------ queries and model control

    def _query(self, op: str, args: tuple[Any, ...]) -> Any:
        call = Call()
        call_id = next(self._ids)
        self._calls[call_id] = call
        try:
            self.channel.send(("q", call_id, op, args))
            ok, value = self.inbox.wait(call)
        finally:
            self._calls.pop(call_id, None)
        if not ok:
            raise pb_utils.TritonModelException(value)
        return value

    def model_control(self, op: str, *args: Any) -> Any:
        return self._query(op, args)

    # ------------------------------------------------------------ BLS

    def _start_bls(self, request: Any, decoupled: bool) -> BlsCall:
        if _runtime.phase() != "execute":
            raise pb_utils.TritonModelException("BLS requests can only be made from execute() (not in initialize or finalize)")
        call_id = next(self._ids)
        call = BlsCall(self, call_id)
        self._calls[call_id] = call
        tensors = [(t.name(), t.datatype(), t._array) for t in request.inputs()]
        try:
            block, metas = pack(self.pool, [tensors])
            self.channel.send((
                "b", call_id, request.model_name(), request.model_version(), request.request_id(),
                request.correlation_id(), request.flags(), request.timeout(), request.parameters(),
                tuple(request.requested_output_names()), block, metas[0], decoupled,
            ))
        except BaseException:
            self._calls.pop(call_id, None)
            raise
        return call

    def bls(self, request: Any, decoupled: bool) -> Any:
        call = self._start_bls(request, decoupled)
        if decoupled:
            return pb_utils.ResponseIterator(call)
        response = call.next_response()
        return response if response is not None else pb_utils.InferenceResponse(
            error=pb_utils.TritonError("BLS request ended without a response"))

    async def bls_async(self, request: Any, decoupled: bool) -> Any:
        call = self._start_bls(request, decoupled)
        if decoupled:
            return pb_utils.ResponseIterator(call)
        response = await call.next_response_async()
        return response if response is not None else pb_utils.InferenceResponse(
            error=pb_utils.TritonError("BLS request ended without a response"))

    def _bls_item(self, message: tuple[Any, ...]) -> None:
        _, call_id, block, metas, parameters, error, final = message
        call = self._calls.get(call_id)
        item = None
        if error is not None:
            item = pb_utils.InferenceResponse(error=pb_utils.TritonError.from_name(error[0], error[1]))
        elif metas is not None:
            view = self.peers.view(block) if block else None
            tensors = [pb_utils.Tensor._wrap(m[0], unpack_one(view, m, copy=True), m[1]) for m in metas]
            if block:
                self.channel.send(("R", [block]))
            item = pb_utils.InferenceResponse(tensors, parameters=parameters)
        if call is None:
            return
        if item is not None:
            self.inbox.push(call, item)
        if final:
            self._calls.pop(call_id, None)
            self.inbox.push(call, _END)

    # ------------------------------------------------------------ logs and metrics

    def log(self, level: int, message: str, filename: str, line: int) -> None:
        if level == pb_utils.LogLevel.VERBOSE and self.log_verbose <= 0:
            return
        self.channel.send(("l", level, f"{filename}:{line}] {message}"))

    def metric(self, op: str, *args: Any) -> None:
        self.channel.send(("m", op, args))

    # ------------------------------------------------------------ incoming messages

    def _dispatch(self, message: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """Handle one message from the server (in whichever thread read it); commands are returned."""
        kind = message[0]
        if kind == "x" or kind == "y":
            if message[4]:  # our blocks the server has read since its last message
                self._release_blocks(message[4])
            if self.on_async_batch is not None:
                self.on_async_batch(message)
                return None
            return message
        if kind == "b":
            self._bls_item(message)
        elif kind == "q":
            call = self._calls.get(message[1])
            if call is not None:
                self.inbox.push(call, (message[2], message[3]))
        elif kind == "R":
            self._release_blocks(message[1])
        elif kind == "D":
            self.peers.drop(message[1])
        elif kind == "h":
            self.on_health(message)
        else:
            return message
        return None

    def _on_eof(self) -> None:
        """The server is gone (or closed us): never outlive it, never leave segments behind."""
        self.shutdown_resources()
        os._exit(0)

    def _release_blocks(self, names: list[Any]) -> None:
        if not names:
            return
        for name in names:
            self.pool.release(name)
        dropped = self.pool.take_dropped()
        if dropped:
            self.channel.send(("D", dropped))

    def shutdown_resources(self) -> None:
        self.pool.close()
        self.peers.close()


def exit_worker(runtime: WorkerRuntime, code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    runtime.shutdown_resources()
    os._exit(code)
