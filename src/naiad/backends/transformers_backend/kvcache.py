"""The running batch's KV cache: one preallocated buffer per layer, written in place at every decode step.

Row i of every buffer belongs to the i-th running sequence and holds its `lengths[i]` tokens
from column 0 on (right-padded). A decode step writes each row's new key/value at its own
column and attends over columns `0..longest` with a padding mask, so no step copies the cache
(Hugging Face's DynamicCache concatenates a new tensor per layer per step, and gathering
per-sequence caches into a batch costs as much again). A sequence that leaves hands its row
to the last one (one row copy), so rows stay dense.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

ROW_GROWTH = 8  # rows are added this many at a time
MIN_CAPACITY = 64  # columns


class BatchKV:
    """Per-layer key/value buffers [rows, heads, capacity, head_dim] and the tokens each row holds.

    Buffers start zeroed: masked-out columns still enter attention as 0 x value, and uninitialised
    memory could hold NaN."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.lengths: list[int] = []

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def allocated_tokens(self) -> int:
        return self.keys[0].shape[0] * self.keys[0].shape[2] if self.keys else 0

    def add(self, layers: list[tuple[torch.Tensor, torch.Tensor]], length: int, limit: int) -> None:
        """Append a row holding `length` tokens of per-layer (keys, values) [heads, >= length, head_dim]."""
        if not self.keys:
            self.keys = [k.new_zeros((ROW_GROWTH, k.shape[0], max(MIN_CAPACITY, length + 1), k.shape[2])) for k, _ in layers]
            self.values = [v.new_zeros((ROW_GROWTH, v.shape[0], max(MIN_CAPACITY, length + 1), v.shape[2]))
                           for _, v in layers]
        self.reserve(self.rows + 1, length + 1, limit)
        row = self.rows
        for index, (k, v) in enumerate(layers):
            self.keys[index][row, :, :length] = k[:, :length]
            self.values[index][row, :, :length] = v[:, :length]
        self.lengths.append(length)

    def remove(self, row: int) -> None:
        """Drop a row; the last row moves into its place (callers move their sequence the same way)."""
        last = self.rows - 1
        if row != last:
            n = self.lengths[last]
            with torch.inference_mode():  # called on the event loop; the buffers are inference tensors
                for k, v in zip(self.keys, self.values):
                    k[row, :, :n] = k[last, :, :n]
                    v[row, :, :n] = v[last, :, :n]
            self.lengths[row] = n
        self.lengths.pop()
        if not self.lengths:
            self.keys, self.values = [], []  # an idle engine holds no KV memory

    def truncate(self, rows: int) -> None:
        """Forget rows past `rows` (a failed prefill may have added some)."""
        del self.lengths[rows:]
        if not self.lengths:
            self.keys, self.values = [], []

    def reserve(self, rows: int, columns: int, limit: int) -> None:
        """Grow the buffers to at least `rows` x `columns` (columns doubling, capped at `limit`)."""
        have_rows, have_cols = self.keys[0].shape[0], self.keys[0].shape[2]
        if rows <= have_rows and columns <= have_cols:
            return
        new_rows = have_rows if rows <= have_rows else rows + ROW_GROWTH - 1
        new_cols = have_cols if columns <= have_cols else max(columns, min(have_cols * 2, limit))
        used = self.rows
        for buffers in (self.keys, self.values):
            for index, old in enumerate(buffers):
                grown = old.new_zeros((new_rows, old.shape[1], new_cols, old.shape[3]))
                grown[:used, :, :have_cols] = old[:used]
                buffers[index] = grown

    def decode_cache(self, batch: int, limit: int) -> tuple[Cache, torch.Tensor, torch.Tensor]:
        """A Cache for one decode step over rows [0, batch): (cache, attention mask, position ids)."""
        lengths = self.lengths[:batch]
        longest = max(lengths)
        self.reserve(batch, longest + 1, max(limit, longest + 1))
        device = self.keys[0].device
        positions = torch.tensor(lengths, dtype=torch.long, device=device)
        mask = (torch.arange(longest + 1, device=device)[None, :] <= positions[:, None]).long()
        cache = Cache(layers=[_StepLayer(self, index, positions, batch, longest) for index in range(len(self.keys))])
        return cache, mask, positions[:, None]

    def advance(self, batch: int) -> None:
        for row in range(batch):
            self.lengths[row] += 1


class _StepLayer(DynamicLayer):
    """One layer's view for one decode step: update() writes row b's new token at column lengths[b]."""

    def __init__(self, owner: BatchKV, index: int, positions: torch.Tensor, batch: int, longest: int) -> None:
        super().__init__()
        self._owner, self._index, self._positions = owner, index, positions
        self._batch, self._longest = batch, longest
        self._rows = torch.arange(batch, device=positions.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self._owner.keys[self._index], self._owner.values[self._index]
        keys[self._rows, :, self._positions] = key_states[:, :, 0]
        values[self._rows, :, self._positions] = value_states[:, :, 0]
        end = self._longest + 1
        return keys[:self._batch, :, :end], values[:self._batch, :, :end]

    def get_seq_length(self) -> int:
        return self._longest

    def get_mask_sizes(self, query_length: Any) -> tuple[int, int]:
        return self._longest + 1, 0
