"""ModelStreamInfer: one bidirectional stream, requests handed to the core in arrival order, responses written as they complete."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb

from naiad.frontends.grpc.infer_codec import decode_infer_request, encode_infer_response
from naiad.frontends.grpc.params import FINAL_RESPONSE, empty_final_response_flag
from naiad.frontends.grpc.status import error_of
from naiad.protocol.errors import NaiadError
from naiad.protocol.types import InferenceRequest, InferenceResponse

logger = logging.getLogger(__name__)

# Produces the responses of one request as (response, is_final) pairs; a flag-only final is (None, True).
ResponseSource = Callable[[InferenceRequest], AsyncIterator[tuple[InferenceResponse | None, bool]]]
Decode = Callable[[pb.ModelInferRequest], InferenceRequest]

GRPC_ERROR_HEADER = "triton_grpc_error"
MAX_IN_FLIGHT = 4096  # per stream: past this, reading pauses and HTTP/2 flow control pushes back
_DONE = object()


class Fatal:
    """Queued in `triton_grpc_error` mode: ends the stream with this error's status."""

    __slots__ = ("error",)

    def __init__(self, error: NaiadError) -> None:
        self.error = error


def grpc_error_mode(context: grpc.aio.ServicerContext) -> bool:
    """True when the client opened the stream with metadata `triton_grpc_error: true`."""
    for key, value in context.invocation_metadata() or ():
        if key == GRPC_ERROR_HEADER and str(value).lower() == "true":
            return True
    return False


def error_response(message: pb.ModelInferRequest, err: NaiadError) -> pb.ModelStreamInferResponse:
    """A per-request failure: error_message set, request identity echoed so the client can correlate."""
    return pb.ModelStreamInferResponse(
        error_message=err.message,
        infer_response=pb.ModelInferResponse(
            id=message.id, model_name=message.model_name, model_version=message.model_version
        ),
    )


def stream_response(
    response: InferenceResponse | None, final: bool, message: pb.ModelInferRequest, version: str = ""
) -> pb.ModelStreamInferResponse:
    """A successful stream response carrying `triton_final_response`.

    None is the empty final response: identity from the request, with `version` (the version
    that served the earlier responses, when known) in place of the requested one.
    """
    if response is None:
        infer = pb.ModelInferResponse(
            id=message.id, model_name=message.model_name, model_version=version or message.model_version
        )
    else:
        infer = encode_infer_response(response)
    infer.parameters[FINAL_RESPONSE].bool_param = final
    return pb.ModelStreamInferResponse(infer_response=infer)


class StreamSession:
    """State of one ModelStreamInfer call: a reader task, in-flight request tasks and one writer."""

    def __init__(self, source: ResponseSource, decode: Decode | None, fatal_errors: bool) -> None:
        """`decode` turns a message into a request (None: decode_infer_request, shared memory refused)."""
        self._source = source
        self._decode = decode or partial(decode_infer_request, allow_shared_memory=False)
        self._fatal_errors = fatal_errors
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._in_flight: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._reading = True

    async def responses(self, requests: AsyncIterator[pb.ModelInferRequest]) -> AsyncIterator[Any]:
        """Yield outbound messages until the client half-closed and every request finished.

        Items are ModelStreamInferResponse messages, or one final `Fatal` (triton_grpc_error mode)
        that the caller turns into the RPC status. Close the generator (aclosing) when done with it.
        """
        reader = asyncio.create_task(self._read(requests))
        try:
            while True:
                item = await self._queue.get()
                if item is _DONE:
                    break
                yield item
                if isinstance(item, Fatal):
                    return
            await reader
        finally:
            reader.cancel()
            for task in list(self._in_flight):
                task.cancel()

    async def _read(self, requests: AsyncIterator[pb.ModelInferRequest]) -> None:
        try:
            async for message in requests:
                await self._slots.acquire()
                self._start(message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.debug("stream read ended: %r", exc)
        finally:
            self._reading = False
            self._maybe_done()

    def _start(self, message: pb.ModelInferRequest) -> None:
        try:
            send_empty_final = empty_final_response_flag(message.parameters)
            request = self._decode(message)
        except Exception as exc:
            self._slots.release()
            self._fail(message, error_of(exc))
            return
        task = asyncio.get_running_loop().create_task(self._run(request, message, send_empty_final))
        self._in_flight.add(task)
        task.add_done_callback(self._finished)

    async def _run(self, request: InferenceRequest, message: pb.ModelInferRequest, send_empty_final: bool) -> None:
        version = ""
        try:
            async for response, final in self._source(request):
                if isinstance(response, NaiadError):
                    self._fail(message, response)  # an error response: the stream goes on
                    continue
                if response is not None:
                    version = response.model_version
                elif not send_empty_final:
                    continue
                self._queue.put_nowait(stream_response(response, final, message, version))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(message, error_of(exc))

    def _fail(self, message: pb.ModelInferRequest, err: NaiadError) -> None:
        self._queue.put_nowait(Fatal(err) if self._fatal_errors else error_response(message, err))

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._slots.release()
        self._maybe_done()

    def _maybe_done(self) -> None:
        if not self._reading and not self._in_flight:
            self._queue.put_nowait(_DONE)
