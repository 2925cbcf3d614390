"""Request bodies as Triton's JSON parser reads them: strict JSON plus NaN and Infinity literals.

Triton parses with rapidjson's NaN/Inf extension, so `NaN`, `Inf` and `Infinity` (with an
optional minus sign) are numbers there. orjson (fast, strict) reads every other body; only a
body it refuses that holds such a literal is read again with python-rapidjson, the same parser
family with the same extension. Both stop at a bounded nesting depth with an error, never
a crash or a RecursionError escaping.
"""

from __future__ import annotations

from typing import Any

import orjson
import rapidjson

from naiad.protocol.errors import invalid_arg

_NON_FINITE_MARKERS = (b"NaN", b"Inf")


def load_request_json(data: bytes | memoryview) -> Any:
    """Parse a request body; a malformed one is a 400 `failed to parse the request JSON buffer: ...`."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        error = str(exc)
    raw = bytes(data)
    if any(marker in raw for marker in _NON_FINITE_MARKERS):
        try:
            return rapidjson.loads(raw, number_mode=rapidjson.NM_NAN)
        except RecursionError:
            error = "the document is nested too deeply"
        except ValueError:
            pass  # not valid even with the extension: report orjson's finding
    raise invalid_arg(f"failed to parse the request JSON buffer: {error}")


def json_preview(value: Any, limit: int = 120) -> str:
    """Compact JSON text of a request value for an error message: bounded in length, and safe for
    values nested arbitrarily deep (orjson refuses depth past its limit instead of recursing)."""
    if isinstance(value, int) and not isinstance(value, bool):
        text = str(value)  # also integers beyond 64 bits, which orjson does not write
    else:
        try:
            text = orjson.dumps(value).decode("utf-8")
        except (orjson.JSONEncodeError, TypeError):
            text = f"<a {type(value).__name__} nested too deeply to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
