"""The messages of the worker channel: their kinds, and the parts that do not pickle as they are.

Worker -> core:  (INFER, id, request, traceparent, received) a decoded infer request (codec.py's tuple), and
                                                              when the worker sent it (time.perf_counter_ns)
                 (RELAY, id, scope, body)                     any other HTTP request, run by the core's app
                 (CANCEL, id)                                 the client went away
                 (READY, pid)                                 the worker listens
                 (GRPC_CALL, id, method, metadata, request)   a gRPC call run by the core's servicer (request
                                                              bytes, or None: the requests follow as below)
                 (GRPC_MESSAGE, id, request)                  one request message of a streaming call
                 (GRPC_HALF_CLOSE, id)                        the client sent its last request message
Core -> worker:  (RESULT, id, response)                      codec.py's tuple
                 (ERROR, id, (ErrorCode, message))
                 (ASGI, id, message)                          one ASGI send() of a relayed request
                 (DONE, id)                                   the relayed request is answered
                 (GRPC_OUT, id, response)                     one serialized response message of a gRPC call
                 (GRPC_END, id, status name, details)         the gRPC call ended ("OK", or its error status)
                 (GRPC_TAKEN, id)                             the core's servicer read one request message of
                                                              a stream (the worker sends at most STREAM_WINDOW
                                                              messages ahead, so a client that floods a stream
                                                              is held back by HTTP/2 flow control, as without workers)

An ERROR whose value is DECOUPLED is a DecoupledModelError: each protocol words it its own way.

An INFER or RESULT whose request or response is codec.py's short form (plain tensors only) may be
sent plain (Channel.send_plain): it arrives as its type in PLAIN, the same tuple a pickle gives back,
but for the containers' types (`Any` where a value need not be a string; tuples and lists as written).
"""

from __future__ import annotations

from typing import Any

from naiad.protocol.errors import DecoupledModelError, ErrorCode, NaiadError

INFER = "I"
RELAY = "R"
CANCEL = "C"
READY = "K"
RESULT = "i"
ERROR = "x"
ASGI = "a"
DONE = "d"
GRPC_CALL = "G"
GRPC_MESSAGE = "M"
GRPC_HALF_CLOSE = "H"
GRPC_OUT = "o"
GRPC_END = "e"
GRPC_TAKEN = "t"
# codec.py's 5-tuple of a plain tensor: (name, datatype, shape, dtype character, bytes)
_PLAIN_TENSOR = tuple[Any, Any, tuple[Any, ...], Any, Any]
PLAIN: dict[str, Any] = {
    INFER: tuple[Any, Any, tuple[Any, Any, Any, list[_PLAIN_TENSOR]], Any, int],  # (model, version, id, inputs)
    RESULT: tuple[Any, Any, tuple[Any, Any, Any, Any, list[_PLAIN_TENSOR]]],  # (model, version, id, None, outputs)
}
STREAM_WINDOW = 256
DECOUPLED = "decoupled"

# The scope entries a relayed request carries (the rest are callbacks and state of the worker's connection).
_SCOPE_KEYS = ("type", "asgi", "http_version", "server", "client", "scheme", "method", "root_path", "path",
               "raw_path", "query_string", "headers")


def relayed_scope(scope: dict[str, Any]) -> dict[str, Any]:
    return {key: scope[key] for key in _SCOPE_KEYS if key in scope}


def error_value(exc: NaiadError) -> tuple[ErrorCode | str, str]:
    if isinstance(exc, DecoupledModelError):
        return DECOUPLED, exc.model_name
    return exc.code, exc.message


def error_from_value(value: tuple[ErrorCode | str, str]) -> NaiadError:
    code, text = value
    if isinstance(code, ErrorCode):
        return NaiadError(code, text)
    return DecoupledModelError(text)
