"""Progress: one line rewritten in place on a terminal; plain lines every few seconds otherwise (logs, CI)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

LOG_INTERVAL_S = 5.0  # between progress lines when the stream is not a terminal


class ProgressLine:
    def __init__(self, mode: str = "auto", stream: TextIO | None = None, min_interval_s: float = 0.2) -> None:
        self.stream = stream or sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)()
        self.enabled = mode != "off"
        self.in_place = mode == "on" or isatty
        self.min_interval_s = min_interval_s if self.in_place else LOG_INTERVAL_S
        self._last = -float("inf")
        self._width = 0

    def update(self, text: str, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < self.min_interval_s:
            return
        self._last = now
        if not self.in_place:
            self.stream.write(f"naiad perf: {text}\n")
            self.stream.flush()
            return
        padded = text.ljust(self._width)
        self._width = len(text)
        self.stream.write("\r" + padded)
        self.stream.flush()

    def clear(self) -> None:
        if self.enabled and self.in_place and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0
