"""Incremental detokenization of one sequence and stop-string handling (held-back partial matches)."""

from __future__ import annotations

from typing import Any


class TextStream:
    """Turns generated token ids into text deltas; finds stop strings and withholds a possible prefix."""

    def __init__(self, tokenizer: Any, stops: list[str], include_stop: bool, skip_special_tokens: bool) -> None:
        self._tokenizer = tokenizer
        self._stops = stops
        self._include_stop = include_stop
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""
        self._emitted = 0
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip, clean_up_tokenization_spaces=False)

    def add(self, token: int) -> None:
        """Append a token; sets `stopped` when a stop string completed (the text is cut there)."""
        self._ids.append(token)
        prefix = self._decode(self._ids[self._prefix_offset:self._read_offset])
        full = self._decode(self._ids[self._prefix_offset:])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return  # an incomplete character: wait for the next token
        before = len(self.text)
        self.text += full[len(prefix):]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        if self._stops:
            self._find_stop(before)

    def flush(self) -> None:
        """The generation ended: text of tokens still held as an incomplete character becomes U+FFFD, so the
        text accounts for every generated token (as tokenizer.decode of them all does)."""
        if self._read_offset == len(self._ids):
            return
        prefix = self._decode(self._ids[self._prefix_offset:self._read_offset])
        full = self._decode(self._ids[self._prefix_offset:])
        self.text += full[len(prefix):]
        self._prefix_offset = self._read_offset = len(self._ids)

    def _find_stop(self, before: int) -> None:
        longest = max(len(s) for s in self._stops)
        start = max(0, before - longest + 1)
        best: tuple[int, str] | None = None
        for stop in self._stops:
            index = self.text.find(stop, start)
            if index >= 0 and (best is None or index < best[0]):
                best = (index, stop)
        if best is not None:
            index, stop = best
            self.text = self.text[: index + len(stop) if self._include_stop else index]
            self.stopped = True

    def _held(self) -> int:
        """Characters at the end that may begin a stop string (not sent until resolved)."""
        if self.stopped or not self._stops:
            return 0
        hold = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(self.text)), hold, -1):
                if self.text.endswith(stop[:k]):
                    hold = k
                    break
        return hold

    def take(self, final: bool) -> str:
        """New text since the previous call (everything when final)."""
        end = len(self.text) if final else len(self.text) - self._held()
        if end <= self._emitted:
            return ""
        piece = self.text[self._emitted:end]
        self._emitted = end
        return piece
