"""RemovableQueue: FIFO order, removal from anywhere, the deque-like errors."""

import pytest

from naiad.runtime.removable_queue import RemovableQueue


class Entry:  # hashed by identity, as WorkItem and futures are
    def __init__(self, n: int) -> None:
        self.n = n


def test_fifo_with_removal_from_the_middle_and_the_front_again():
    entries = [Entry(n) for n in range(5)]
    queue: RemovableQueue[Entry] = RemovableQueue()
    for entry in entries:
        queue.append(entry)
    assert queue.discard(entries[2]) and not queue.discard(entries[2])
    assert entries[2] not in queue and entries[3] in queue and len(queue) == 4
    queue.appendleft(entries[2])
    assert queue.peek() is entries[2]
    assert [e.n for e in queue] == [2, 0, 1, 3, 4]
    assert [queue.popleft().n for _ in range(len(queue))] == [2, 0, 1, 3, 4]
    assert not queue


def test_empty_and_missing_entries_raise_like_a_deque():
    queue: RemovableQueue[Entry] = RemovableQueue()
    with pytest.raises(IndexError):
        queue.popleft()
    with pytest.raises(IndexError):
        queue.peek()
    with pytest.raises(ValueError):
        queue.remove(Entry(0))
