"""The live progress line: one line rewritten in place on a terminal, silent otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressLine:
    def __init__(self, mode: str = "auto", stream: TextIO | None = None, min_interval_s: float = 0.2) -> None:
        self.stream = stream or sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)()
        self.enabled = mode == "on" or (mode == "auto" and isatty)
        self.min_interval_s = min_interval_s
        self._last = 0.0
        self._width = 0

    def update(self, text: str, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < self.min_interval_s:
            return
        self._last = now
        padded = text.ljust(self._width)
        self._width = len(text)
        self.stream.write("\r" + padded)
        self.stream.flush()

    def clear(self) -> None:
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0
