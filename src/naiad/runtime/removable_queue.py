"""A FIFO whose entries can also leave from the middle in O(1): cancelled requests and waiters.

A deque costs O(n) to remove an entry from anywhere but its ends, so cancelling every request
of a long queue one by one costs O(n^2) (a flood of cancelled requests, e.g. HTTP/2 rapid reset,
then stalls the event loop). An OrderedDict keeps insertion order in a linked list and removes
by key in O(1); entries are keyed by identity (they must be hashable: WorkItem compares by
identity, futures and tuples of them hash).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class RemovableQueue(Generic[T]):
    """append/appendleft/popleft/peek at the ends, discard anywhere; all O(1). Each entry at most once."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: OrderedDict[T, None] = OrderedDict()

    def append(self, entry: T) -> None:
        self._entries[entry] = None

    def appendleft(self, entry: T) -> None:
        self._entries[entry] = None
        self._entries.move_to_end(entry, last=False)

    def popleft(self) -> T:
        """The oldest entry, removed; IndexError when empty."""
        try:
            return self._entries.popitem(last=False)[0]
        except KeyError:
            raise IndexError("pop from an empty queue") from None

    def peek(self) -> T:
        """The oldest entry, left in place; IndexError when empty."""
        for entry in self._entries:
            return entry
        raise IndexError("peek at an empty queue")

    def discard(self, entry: T) -> bool:
        """Remove the entry wherever it is; False when it was not queued."""
        return self._entries.pop(entry, _MISSING) is not _MISSING

    def remove(self, entry: T) -> None:
        """Remove the entry wherever it is; ValueError when it was not queued (as deque.remove)."""
        if not self.discard(entry):
            raise ValueError("entry not in queue")

    def clear(self) -> None:
        self._entries.clear()

    def __contains__(self, entry: object) -> bool:
        return entry in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __iter__(self) -> Iterator[T]:
        return iter(self._entries)


_MISSING = object()
