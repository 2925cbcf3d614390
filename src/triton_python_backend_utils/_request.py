"""InferenceRequest (received and BLS), InferenceResponse, the response sender and the BLS response iterator."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

from triton_python_backend_utils import _runtime
from triton_python_backend_utils._errors import TritonError, TritonModelException
from triton_python_backend_utils._tensor import Tensor
from triton_python_backend_utils._text import text, texts

TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


def _parameters_json(parameters: Any, what: str) -> str:
    if parameters is None:
        return "{}"
    if isinstance(parameters, str):
        try:
            decoded = json.loads(parameters)
        except ValueError:
            raise TritonModelException(f"{what} parameters must be a dict or a JSON object string") from None
        parameters = decoded
    if not isinstance(parameters, dict):
        raise TritonModelException(f"{what} parameters must be a dict with str keys and bool, int or str values")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(f"{what} parameter keys must be str, got {key!r}")
        if not isinstance(value, (bool, int, str, float)):
            raise TritonModelException(
                f"{what} parameter '{key}' has a value of type {type(value).__name__}: expected bool, int or str"
            )
    return json.dumps(parameters)


class PreferredMemory:
    """Where BLS outputs should be placed (always CPU memory on this server)."""

    def __init__(self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class InferenceTrace:
    """The trace a request belongs to (tracing context is not propagated here)."""

    def __init__(self, context: str | None = None) -> None:
        self._context = context

    def get_context(self, mode: str = "opentelemetry") -> str | None:
        return self._context


class InferenceResponse:
    """Outputs of one request, or an error; `parameters` go back to the client."""

    def __init__(self, output_tensors: Any = None, error: TritonError | None = None, parameters: Any = None) -> None:
        tensors = list(output_tensors) if output_tensors is not None else []
        for tensor in tensors:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(
                    f"InferenceResponse output_tensors must be pb_utils.Tensor objects, got {type(tensor).__name__}"
                )
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException(f"InferenceResponse error must be a pb_utils.TritonError, got {type(error).__name__}")
        self._tensors = tensors
        self._error = error
        self._parameters = "{}" if parameters is None else _parameters_json(parameters, "response")

    def output_tensors(self) -> list[Tensor]:
        return self._tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters

    def __repr__(self) -> str:
        return f"InferenceResponse(outputs={[t.name() for t in self._tensors]}, error={self._error!r})"


class InferenceResponseSender:
    """Sends the responses of one received request; closed after the FINAL flag."""

    def __init__(self, runtime: Any, handle: tuple, requested: tuple) -> None:
        self._runtime = runtime
        self._handle = handle
        self._requested = requested
        self._closed = False
        self._sent = 0
        self._lock = threading.Lock()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException(f"unknown response flags {flags}")
        if response is None and not final:
            raise TritonModelException("Inference Response object must be provided when the response flags is set to zero.")
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException("send() expects a pb_utils.InferenceResponse")
        with self._lock:
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if not self._runtime.decoupled:
                if response is not None and self._sent >= 1:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send more than one response."
                    )
                if final and response is None and self._sent == 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send complete final before sending a response."
                    )
            if final:
                self._closed = True
            if response is not None:
                self._sent += 1
            self._runtime.send_response(self._handle, self._requested, response, final)

    def is_cancelled(self) -> bool:
        return self._runtime.is_cancelled(self._handle)

    def _is_closed(self) -> bool:
        return self._closed


class ResponseIterator:
    """Responses of a BLS call to a decoupled model, in order; the last one may carry no outputs."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        response = self._call.next_response()
        if response is None:
            raise StopIteration
        return response

    def __aiter__(self) -> ResponseIterator:
        return self

    async def __anext__(self) -> InferenceResponse:
        response = await self._call.next_response_async()
        if response is None:
            raise StopAsyncIteration
        return response

    def cancel(self) -> None:
        self._call.cancel()


class InferenceRequest:
    """A request received in execute(), or one built by the model for BLS (then call exec / async_exec)."""

    # What a received request starts with (set per instance only when they change: less to do per request).
    _preferred_memory: PreferredMemory | None = None
    _trace: InferenceTrace | None = None
    _release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
    _sender: InferenceResponseSender | None = None

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: Any = None,
        requested_output_names: Any = None,
        model_name: str = "",
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
        parameters: Any = None,
    ) -> None:
        model_name = text(model_name, "InferenceRequest model_name")
        if not model_name:
            raise TritonModelException("InferenceRequest needs a model_name")
        tensors = list(inputs) if inputs is not None else []
        for tensor in tensors:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(f"InferenceRequest inputs must be pb_utils.Tensor objects, got {type(tensor).__name__}")
        if not isinstance(correlation_id, (int, str)):
            raise TritonModelException("correlation_id must be an int or a str")
        self._inputs = tensors
        self._requested: Sequence[str] = texts(requested_output_names, "InferenceRequest requested_output_names")
        self._model_name = model_name
        self._model_version = int(model_version)
        self._request_id = text(request_id, "InferenceRequest request_id")
        self._correlation_id = correlation_id
        self._flags = int(flags)
        self._timeout = int(timeout)
        self._preferred_memory = preferred_memory or PreferredMemory()
        self._trace = trace or InferenceTrace()
        self._parameters = _parameters_json(parameters, "request")
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._runtime: Any = None
        self._handle: tuple | None = None
        self._sender = None

    @classmethod
    def _received(cls, runtime: Any, handle: tuple, inputs: list, requested: tuple, request_id: str,
                  correlation_id: int | str, flags: int, parameters: str, timeout: int, model_name: str,
                  model_version: int) -> InferenceRequest:
        request = cls.__new__(cls)
        request._inputs = inputs
        request._requested = requested  # a tuple: read-only here (requested_output_names() gives a list)
        request._model_name = model_name
        request._model_version = model_version
        request._request_id = request_id
        request._correlation_id = correlation_id
        request._flags = flags
        request._timeout = timeout
        request._parameters = parameters
        request._runtime = runtime
        request._handle = handle
        # _preferred_memory and _trace (made on first use: most models never ask), _release_flags and
        # _sender keep the class defaults.
        return request

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return list(self._requested)

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = int(flags)

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return self._parameters

    def trace(self) -> InferenceTrace:
        if self._trace is None:
            self._trace = InferenceTrace()
        return self._trace

    def preferred_memory(self) -> PreferredMemory:
        if self._preferred_memory is None:
            self._preferred_memory = PreferredMemory()
        return self._preferred_memory

    def get_response_sender(self) -> InferenceResponseSender:
        if self._handle is None:
            raise TritonModelException("only requests received in execute() have a response sender")
        if self._sender is None:
            self._sender = InferenceResponseSender(self._runtime, self._handle, tuple(self._requested))
        return self._sender

    def is_cancelled(self) -> bool:
        if self._handle is None:
            return False
        return self._runtime.is_cancelled(self._handle)

    def set_release_flags(self, flags: int) -> None:
        if flags not in (TRITONSERVER_REQUEST_RELEASE_ALL, TRITONSERVER_REQUEST_RELEASE_RESCHEDULE):
            raise TritonModelException(f"unknown request release flags {flags}")
        self._release_flags = flags

    def release_flags(self) -> int:
        return self._release_flags

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on its model and wait: an InferenceResponse, or a ResponseIterator if decoupled."""
        return _runtime.current().bls(self, bool(decoupled))

    async def async_exec(self, decoupled: bool = False) -> Any:
        """Like exec() but awaitable, so several BLS requests can run at once."""
        return await _runtime.current().bls_async(self, bool(decoupled))
