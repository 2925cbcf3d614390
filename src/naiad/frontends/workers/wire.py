"""The messages of the worker channel: their kinds, and the parts that do not pickle as they are.

Worker -> core:  (INFER, id, request, traceparent)           a decoded infer request (codec.py's tuple)
                 (RELAY, id, scope, body)                     any other HTTP request, run by the core's app
                 (CANCEL, id)                                 the client went away
                 (READY, pid)                                 the worker listens
Core -> worker:  (RESULT, id, response)                      codec.py's tuple
                 (ERROR, id, (ErrorCode, message))
                 (ASGI, id, message)                          one ASGI send() of a relayed request
                 (DONE, id)                                   the relayed request is answered
"""

from __future__ import annotations

from typing import Any

from naiad.protocol.errors import ErrorCode, NaiadError

INFER = "I"
RELAY = "R"
CANCEL = "C"
READY = "K"
RESULT = "i"
ERROR = "x"
ASGI = "a"
DONE = "d"

# The scope entries a relayed request carries (the rest are callbacks and state of the worker's connection).
_SCOPE_KEYS = ("type", "asgi", "http_version", "server", "client", "scheme", "method", "root_path", "path",
               "raw_path", "query_string", "headers")


def relayed_scope(scope: dict[str, Any]) -> dict[str, Any]:
    return {key: scope[key] for key in _SCOPE_KEYS if key in scope}


def error_value(exc: NaiadError) -> tuple[ErrorCode, str]:
    return exc.code, exc.message


def error_from_value(value: tuple[ErrorCode, str]) -> NaiadError:
    return NaiadError(value[0], value[1])
