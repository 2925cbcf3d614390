"""Hosts a Triton Python model (model.py) in a worker process: initialize / execute / finalize, auto_complete_config."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import os
import re
import sys
import threading
import time
import types
from collections.abc import Awaitable
from typing import Any

import numpy as np

import triton_python_backend_utils as pb_utils
from naiad.runtime.process.framing import BlockingChannel
from naiad.runtime.process.host import WorkerHost
from naiad.runtime.process.tensors import ALIGN, INLINE_MAX, NUMERIC, NUMPY_OF, pack, unpack_one
from naiad.runtime.process.worker_runtime import error_tuple, exit_worker
from triton_python_backend_utils import _runtime

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# Bound once: these run for every request.
_tensor = pb_utils.Tensor._wrap
_received = pb_utils.InferenceRequest._received
_RESCHEDULE = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
InferenceResponse = pb_utils.InferenceResponse


class ReturnValueError(Exception):
    """execute() returned something other than one InferenceResponse per request (reported verbatim)."""


def format_exception(exc: BaseException) -> str:
    """`Type: message` plus the model's frames, innermost first (the layout Triton's stub uses)."""
    if isinstance(exc, ReturnValueError):
        return str(exc)
    text = f"{type(exc).__name__}: {exc}"
    tb = exc.__traceback__
    if tb is None:
        return text
    while tb.tb_next is not None:
        tb = tb.tb_next
    lines = []
    frame: types.FrameType | None = tb.tb_frame
    while frame is not None:
        filename = frame.f_code.co_filename
        if os.path.dirname(os.path.abspath(filename)) == _PACKAGE_DIR:
            break
        lineno = tb.tb_lineno if frame is tb.tb_frame else frame.f_lineno
        lines.append(f"  {filename}({lineno}): {frame.f_code.co_name}\n")
        frame = frame.f_back
    if not lines:
        return text
    return text + "\n\nAt:\n" + "".join(lines)


def import_model(model_file: str) -> Any:
    """Import model.py as `<version>.<stem>` (relative imports work) with its directories on sys.path."""
    version_dir = os.path.dirname(os.path.abspath(model_file))
    model_dir = os.path.dirname(version_dir)
    for path in (version_dir, model_dir):
        if path not in sys.path:
            sys.path.append(path)
    # A private package name: a backend directory named like a library (e.g. `vllm/model.py`)
    # must not shadow that library for the model code importing it.
    package = "_naiad_model_" + re.sub(r"\W", "_", os.path.basename(version_dir))
    if package not in sys.modules:
        module = types.ModuleType(package)
        module.__path__ = [version_dir]
        sys.modules[package] = module
    stem = os.path.splitext(os.path.basename(model_file))[0]
    name = f"{package}.{stem}"
    spec = importlib.util.spec_from_file_location(name, model_file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import '{model_file}'")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    if not hasattr(module, "TritonPythonModel"):
        raise AttributeError(f"'{model_file}' does not define class TritonPythonModel")
    return module.TritonPythonModel


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    """A coroutine of any awaitable the model returns (what asyncio's thread-safe runners take)."""
    return await awaitable


class PythonModelHost(WorkerHost):
    """Runs one Python model instance: batches from the server, responses back, BLS through the runtime."""

    def __init__(self, channel: BlockingChannel, init: dict[str, Any]) -> None:
        super().__init__(channel, init)
        self.runtime.on_health = self._on_health
        self.model: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.async_execute = False

    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        assert self.loop is not None, "only async models run an event loop"
        return self.loop

    # ------------------------------------------------------------ start-up

    def start(self) -> bool:
        _runtime.install(self.runtime)
        _runtime.set_phase("initialize")
        try:
            model_class = import_model(self.init["model_file"])
            self.model = model_class()
            if not callable(getattr(self.model, "execute", None)):
                raise AttributeError("TritonPythonModel must define execute(self, requests)")
            self.async_execute = inspect.iscoroutinefunction(self.model.execute)
            if self.async_execute or inspect.iscoroutinefunction(getattr(self.model, "initialize", None)):
                self.loop = asyncio.new_event_loop()
                asyncio.set_event_loop(self.loop)
            initialize = getattr(self.model, "initialize", None)
            if initialize is not None:
                result = initialize(dict(self.init["args"]))
                if inspect.isawaitable(result):
                    self._loop.run_until_complete(_awaited(result))
        except BaseException as exc:  # any failure of the model's import or initialize fails the load
            self.channel.send(("init_error", format_exception(exc)))
            return False
        _runtime.set_phase("execute")
        self.announce_ready({"async_execute": self.async_execute,
                             "has_is_ready": callable(getattr(self.model, "is_ready", None))})
        return True

    # ------------------------------------------------------------ messages handled off the main thread

    def _on_health(self, message: tuple[Any, ...]) -> None:
        threading.Thread(target=self._check_ready, args=(message[1],), daemon=True).start()

    def _on_async_batch(self, message: tuple[Any, ...]) -> None:
        self._loop.call_soon_threadsafe(self._start_async_batch, message)

    def _check_ready(self, call_id: int) -> None:
        try:
            result = self.model.is_ready()
            if inspect.isawaitable(result):
                if self.loop is not None and self.loop.is_running():
                    result = asyncio.run_coroutine_threadsafe(_awaited(result), self.loop).result(5)
                else:
                    result = asyncio.run(_awaited(result))
            ready = bool(result)
        except BaseException:  # a failing is_ready means not ready
            ready = False
        self.channel.send(("H", call_id, ready))

    # ------------------------------------------------------------ batches

    def _requests(self, message: Any) -> list[Any]:
        runtime = self.runtime
        if message[0] == "y":  # a batch of one request, flat (see session._flat_request)
            inputs = []
            for name, datatype, shape, data in message[9:]:
                inputs.append(_tensor(name, np.ndarray(shape, NUMPY_OF[datatype], data), datatype))
            return [_received(runtime, (message[1], 0), inputs, message[2], message[5], message[6], message[7],
                              message[3], message[8], runtime.model_name, runtime.model_version)]
        _, batch_id, block, described, _ = message
        view = runtime.peers.view(block) if block else None
        model_name, model_version = runtime.model_name, runtime.model_version
        requests = []
        index = 0
        for request_id, correlation_id, flags, parameters, timeout, requested, metas in described:
            inputs = []
            for meta in metas:
                where = meta[3]
                if type(where) is bytearray:  # a numeric tensor carried in the message: an array over its bytes
                    array = np.ndarray(meta[2], NUMPY_OF[meta[1]], where)
                else:
                    array = unpack_one(view, meta, copy=False)
                inputs.append(_tensor(meta[0], array, meta[1]))
            requests.append(_received(runtime, (batch_id, index), inputs, requested, request_id, correlation_id,
                                      flags, parameters, timeout, model_name, model_version))
            index += 1
        return requests

    def _failure(self, exc: BaseException) -> tuple[Any, ...]:
        text = f"Failed to process the request(s) for model '{self.instance_name}', message: {format_exception(exc)}"
        return (text, "INTERNAL")

    def _finish(self, batch_id: int, requests: list[Any], result: Any, timing: tuple[int, int]) -> None:
        """Send the batch's "done" message: responses of a default-mode model, or just completion.

        Its fields after the responses: the error, the requests released with
        TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, and (start, end) of the execution in
        time.perf_counter_ns() (CLOCK_MONOTONIC, the server's clock too).
        """
        if self.runtime.decoupled or result is None:
            error = None
            if result is not None:
                error = (f"Python model '{self.instance_name}' is using the decoupled mode and the execute function "
                         "must return None.", "INTERNAL")
            self.channel.send(("d", batch_id, None, None, error, _rescheduled(requests) if error is None else (), timing))
            return
        if len(requests) == 1 and type(result) is list and len(result) == 1:
            # The usual batch of one request answered by one plain response: what the loop below sends
            # for it, without its bookkeeping lists (add_sub: ~8k instructions less per request).
            request = requests[0]
            response = result[0]
            if (type(response) is InferenceResponse and response._error is None
                    and request._release_flags != _RESCHEDULE):
                requested = request._requested
                # Small numeric outputs: the flat "o" message, ("o", batch_id, parameters, timing, then (name,
                # datatype, shape, data) of each output). What the "d" message says for such a batch, with
                # about a third fewer objects to build, pickle and unpickle (add_sub: ~5k instructions less
                # per request in the worker, ~4k in the server). The rules of tensors.append_flat_inputs, applied to
                # the response's tensors as they are (no list of (name, datatype, array) first, no call:
                # ~1.5k instructions less): BYTES, other dtypes, empty and too big outputs go in the "d" message.
                fields: list[Any] = ["o", batch_id, response._parameters, timing]
                total = 0
                for tensor in response._tensors:
                    if tensor._name in requested:
                        array = tensor._array
                        nbytes = array.nbytes
                        if array.dtype is not NUMERIC.get(tensor._datatype) or not nbytes:
                            break
                        total += (nbytes + ALIGN - 1) & ~(ALIGN - 1)
                        if total > INLINE_MAX:
                            break
                        fields.append((tensor._name, tensor._datatype, array.shape, bytearray(array.tobytes())))
                else:
                    self.channel.send(tuple(fields))
                    return
                # A loop, not a list comprehension: 3.11 makes and calls a function for one (~1.5k instructions).
                group = []
                for tensor in response._tensors:
                    if tensor._name in requested:
                        group.append((tensor._name, tensor._datatype, tensor._array))
                block, metas = pack(self.runtime.pool, [group])
                self.channel.send(("d", batch_id, block, [(metas[0], response._parameters, None)], None, (), timing))
                return
        if not isinstance(result, list):
            raise ReturnValueError(f"Expected a list in the execute return, found type '{type(result)}'.")
        if len(result) != len(requests):
            raise ReturnValueError(
                "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
                f"InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) size is:{len(result)}\n")
        rescheduled = _rescheduled(requests)
        groups: list[list[tuple[str, str, Any]]] = []
        extras: list[tuple[bool, Any, tuple[str, str] | None]] = []
        index = 0
        for request, response in zip(requests, result):
            if rescheduled and index in rescheduled:
                if response is not None:
                    raise ReturnValueError("Expected a None object in the execute function return list for reschduled "
                                           f"request, found type '{type(response)}'.")
                groups.append([])
                extras.append((False, None, None))
            elif response is None:
                groups.append([])
                extras.append((False, None, ("execute() returned None for a request", "INTERNAL")))
            elif not isinstance(response, InferenceResponse):
                raise ReturnValueError("Expected an 'InferenceResponse' object in the execute function return list, "
                                       f"found type '{type(response)}'.")
            elif response._error is not None:
                groups.append([])
                extras.append((False, response._parameters, error_tuple(response._error)))
            else:
                requested = request._requested
                group = []
                for tensor in response._tensors:
                    if tensor._name in requested:
                        group.append((tensor._name, tensor._datatype, tensor._array))
                groups.append(group)
                extras.append((True, response._parameters, None))
            index += 1
        block, metas = pack(self.runtime.pool, groups)
        responses = []
        for meta, (ok, parameters, error) in zip(metas, extras):
            responses.append((meta if ok else None, parameters, error))
        self.channel.send(("d", batch_id, block, responses, None, rescheduled, timing))

    def _run_batch(self, message: tuple[Any, ...]) -> None:
        batch_id = message[1]
        start = time.perf_counter_ns()
        try:
            requests = self._requests(message)
            result = self.model.execute(requests)
            self._finish(batch_id, requests, result, (start, time.perf_counter_ns()))
        except BaseException as exc:  # the whole batch fails with the exception's text
            self.channel.send(("d", batch_id, None, None, self._failure(exc), (), (start, time.perf_counter_ns())))

    def _start_async_batch(self, message: tuple[Any, ...]) -> None:
        self._loop.create_task(self._run_async_batch(message))

    async def _run_async_batch(self, message: tuple[Any, ...]) -> None:
        batch_id = message[1]
        start = time.perf_counter_ns()
        try:
            requests = self._requests(message)
            result = await self.model.execute(requests)
            self._finish(batch_id, requests, result, (start, time.perf_counter_ns()))
        except BaseException as exc:  # the whole batch fails with the exception's text
            self.channel.send(("d", batch_id, None, None, self._failure(exc), (), (start, time.perf_counter_ns())))

    # ------------------------------------------------------------ main loop and finalize

    def serve(self) -> None:
        if self.async_execute:
            # Batches run as tasks on this thread's loop; another thread reads and waits for "f".
            self.runtime.on_async_batch = self._on_async_batch
            threading.Thread(target=self._command_loop, name="naiad-worker-commands", daemon=True).start()
            self._loop.run_forever()
            return
        super().serve()

    def _finalize(self) -> None:
        _runtime.set_phase("finalize")
        finalize = getattr(self.model, "finalize", None)
        try:
            if finalize is not None:
                result = finalize()
                if inspect.isawaitable(result):
                    if self.loop is not None and self.loop.is_running():
                        asyncio.run_coroutine_threadsafe(_awaited(result), self.loop).result()
                    else:
                        asyncio.new_event_loop().run_until_complete(_awaited(result))
        except BaseException as exc:  # finalize errors are logged, the worker still ends
            self.runtime.log(pb_utils.LogLevel.ERROR, f"finalize failed: {format_exception(exc)}", "model.py", 0)
        self.channel.send(("F",))
        exit_worker(self.runtime, 0)


def _rescheduled(requests: list[Any]) -> tuple[Any, ...]:
    """Indices of the requests the model released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE."""
    indices = []
    index = 0
    for request in requests:
        if request._release_flags == _RESCHEDULE:
            indices.append(index)
        index += 1
    return tuple(indices)


def auto_complete(channel: BlockingChannel, message: tuple[Any, ...]) -> None:
    _, config_json, model_file = message
    _runtime.set_phase("auto_complete")
    try:
        model_class = import_model(model_file)
        method = getattr(model_class, "auto_complete_config", None)
        if method is None:
            channel.send(("auto_ok", None))
            return
        result = method(pb_utils.ModelConfig(config_json))
        if not isinstance(result, pb_utils.ModelConfig):
            raise pb_utils.TritonModelException("auto_complete_config must return the ModelConfig object it was given")
        channel.send(("auto_ok", json.dumps(result.as_dict())))
    except BaseException as exc:  # reported as the load error
        channel.send(("auto_error", format_exception(exc)))
