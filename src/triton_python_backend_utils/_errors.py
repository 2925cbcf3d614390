"""TritonError (an error value with a code) and TritonModelException (the exception models raise)."""

from __future__ import annotations


class TritonModelException(Exception):
    """Raised by pb_utils on misuse, and by models to fail their requests."""

    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class TritonError:
    """An error to return in an InferenceResponse; `code` selects the HTTP/gRPC status."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    _NAMES = ("UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED", "ALREADY_EXISTS", "CANCELLED")

    def __init__(self, message: str, code: int = 1) -> None:
        if int(code) not in range(len(self._NAMES)):
            raise TritonModelException(f"unknown TritonError code {code!r}")
        self._message = str(message)
        self._code = int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def code_name(self) -> str:
        return self._NAMES[self._code]

    @classmethod
    def from_name(cls, message: str, name: str) -> TritonError:
        code = cls._NAMES.index(name) if name in cls._NAMES else cls.INTERNAL
        return cls(message, code)

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._NAMES[self._code]})"

    def __str__(self) -> str:
        return self._message
