"""Sequence models: correlation ids, sequence lengths and the per-request start/end flags perf_analyzer sends.

Each load process owns every `process_count`-th id of `--sequence-id-range`, so processes never share an id;
an id goes back to the pool only after its sequence sent its END request.
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class SequenceSpec:
    streams: list[list[int]]  # payload indexes of each data stream (a sequence plays one stream)
    length: int = 0  # --sequence-length; 0 = each stream's own length
    variation: float = 20.0  # --sequence-length-variation, percent
    id_start: int = 1
    id_end: int = 0  # exclusive; 0 = unbounded
    num_sequences: int = 4  # live sequences in request-rate mode
    serial: bool = False  # --serial-sequences: one live request per sequence
    string_ids: bool = False  # the model's CORRID control is TYPE_STRING

    def id_capacity(self) -> int:
        return self.id_end - self.id_start if self.id_end else 1 << 62


class SequenceIds:
    """This process's share of the id range: ids start+index, start+index+count, ... below the end."""

    def __init__(self, spec: SequenceSpec, index: int, count: int) -> None:
        self.string_ids = spec.string_ids
        if spec.id_end:
            self.free: collections.deque[int] | None = collections.deque(range(spec.id_start + index, spec.id_end, count))
            self.counter = None
        else:
            self.free = None
            self.counter = itertools.count(spec.id_start + index, count)

    def take(self) -> int | str:
        if self.free is None:
            value = next(self.counter)  # type: ignore[arg-type]
        elif self.free:
            value = self.free.popleft()
        else:
            raise RuntimeError("more live sequences than ids in --sequence-id-range")
        return str(value) if self.string_ids else value

    def give_back(self, value: int | str) -> None:
        if self.free is not None:
            self.free.append(int(value))


@dataclass
class Sequence:
    """One live sequence: its id and the payload index of every remaining step."""

    id: int | str
    steps: list[int]
    sent: int = 0
    lock: Any = None  # asyncio.Lock when sequences are serial
    inflight: set[Any] = field(default_factory=set)

    @property
    def done(self) -> bool:
        return self.sent >= len(self.steps)

    def next_step(self) -> tuple[int, dict[str, object]]:
        """The payload index and the request parameters of the next request."""
        index = self.steps[self.sent]
        params: dict[str, object] = {"sequence_id": self.id, "sequence_start": self.sent == 0,
                                     "sequence_end": self.sent == len(self.steps) - 1}
        self.sent += 1
        return index, params

    def end_now(self) -> tuple[int, dict[str, object]]:
        """A request that closes the sequence early (the load level is stopping)."""
        index = self.steps[min(self.sent, len(self.steps) - 1)]
        params: dict[str, object] = {"sequence_id": self.id, "sequence_start": self.sent == 0, "sequence_end": True}
        self.sent = len(self.steps)
        return index, params


class SequencePlanner:
    """Makes new sequences: streams in round-robin order, lengths base +/- variation%."""

    def __init__(self, spec: SequenceSpec, index: int, count: int, seed: int) -> None:
        self.spec = spec
        self.ids = SequenceIds(spec, index, count)
        self.rng = np.random.default_rng(seed)
        self.stream_turn = itertools.count(index)

    def length_for(self, stream: list[int]) -> int:
        if not self.spec.length:
            return len(stream)
        spread = self.spec.variation / 100.0
        factor = self.rng.uniform(1.0 - spread, 1.0 + spread) if spread > 0 else 1.0
        return max(1, int(round(self.spec.length * factor)))

    def new(self) -> Sequence:
        stream = self.spec.streams[next(self.stream_turn) % len(self.spec.streams)]
        length = self.length_for(stream)
        steps = [stream[i % len(stream)] for i in range(length)]
        return Sequence(self.ids.take(), steps)

    def finished(self, sequence: Sequence) -> None:
        self.ids.give_back(sequence.id)
