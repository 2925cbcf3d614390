"""String arguments as Triton's Python backend takes them: `str`, or UTF-8 `bytes` / `bytearray`.

Triton's C++ bindings convert any of the three to a C++ string, so model code may pass e.g.
`tensor.as_numpy()[0]` (a numpy bytes scalar) as a model or tensor name.
"""

from __future__ import annotations

from typing import Any


def text(value: Any, what: str) -> str:
    """`value` as a str; bytes are decoded as UTF-8 (undecodable bytes become U+FFFD, never an exception)."""
    if type(value) is str:
        return value
    if isinstance(value, str):
        return str(value)  # numpy str_ becomes a plain str
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    raise TypeError(f"{what} must be a str or bytes, got {type(value).__name__}")


def texts(values: Any, what: str) -> list[str]:
    """A sequence of string arguments (a list, a tuple or a numpy array of str / bytes)."""
    if values is None:
        return []
    if isinstance(values, (str, bytes, bytearray)):
        raise TypeError(f"{what} must be a sequence of str or bytes, not a single {type(values).__name__}")
    return [text(value, what) for value in values]
