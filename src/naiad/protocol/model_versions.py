"""The version string of a request, read the way Triton reads it (a C `stol`), with Triton's error texts:
clients match on them (e.g. "failed to get model version from specified version string")."""

from __future__ import annotations

import re

from naiad.protocol.errors import invalid_arg

# `stol`: optional leading whitespace, an optional sign, then decimal digits; anything after is ignored.
_LEADING_INTEGER = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def parse_model_version(text: str) -> int | None:
    """The requested version number, None for "" (the latest ready version); INVALID_ARG otherwise."""
    if not text:
        return None
    match = _LEADING_INTEGER.match(text)
    value = int(match.group(1)) if match else None
    if value is None or not _INT64_MIN <= value <= _INT64_MAX:
        raise invalid_arg(
            f"failed to get model version from specified version string '{text}' (details: stol), "
            "version should be an integral value > 0"
        )
    if value < 0:
        raise invalid_arg(f"invalid model version specified '{text}' , version should be an integral value > 0")
    return value
