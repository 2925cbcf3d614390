"""The short wait for a lone request's reply: delivery, the bound, the backoff after misses, end of file."""

from __future__ import annotations

import os
import threading
import time

import pytest

from naiad.runtime.process import reply_spin
from naiad.runtime.process.reply_spin import MAX_SKIP, SPIN_SECS, ReplySpin, cpus_beside_the_loop


@pytest.fixture
def pipe():
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)  # as the loop's read transport leaves it
    yield read_fd, write_fd
    for fd in (read_fd, write_fd):
        try:
            os.close(fd)
        except OSError:
            pass


def test_a_reply_already_there_is_delivered_at_once(pipe):
    read_fd, write_fd = pipe
    delivered: list[bytes] = []
    spin = ReplySpin(read_fd, delivered.append)
    os.write(write_fd, b"reply")
    assert spin.wait() is True
    assert delivered == [b"reply"]


def test_a_reply_written_during_the_wait_is_delivered(pipe, monkeypatch):
    read_fd, write_fd = pipe
    delivered: list[bytes] = []
    spin = ReplySpin(read_fd, delivered.append)
    # Written a little later by another thread; the wait is widened so a busy machine cannot miss it
    monkeypatch.setattr(reply_spin, "SPIN_SECS", 5.0)
    writer = threading.Timer(0.001, os.write, (write_fd, b"late"))
    writer.start()
    try:
        assert spin.wait() is True
    finally:
        writer.join()
    assert delivered == [b"late"]


def test_no_reply_ends_the_wait_after_its_bound_and_spaces_out_the_next_ones(pipe):
    read_fd, write_fd = pipe
    delivered: list[bytes] = []
    spin = ReplySpin(read_fd, delivered.append)
    started = time.perf_counter()
    assert spin.wait() is False
    assert time.perf_counter() - started >= SPIN_SECS
    # After misses in a row, 1, 2, 4, ... lone requests go by without a wait before the next one
    tried = []
    for _ in range(16):
        tried.append(spin._skip == 0)  # (timing each call would not tell a let-by from a preempted one)
        spin.wait()
    assert tried == [False, True, False, False, True, False, False, False, False, True] + [False] * 6
    assert delivered == []


def test_a_reply_in_time_ends_the_backoff(pipe):
    read_fd, write_fd = pipe
    delivered: list[bytes] = []
    spin = ReplySpin(read_fd, delivered.append)
    for _ in range(3):  # miss, let one by, miss again: two lone requests to let by now
        spin.wait()
    os.write(write_fd, b"x")
    assert [spin.wait(), spin.wait(), spin.wait()] == [False, False, True]  # let by twice, then waited
    os.write(write_fd, b"y")
    assert spin.wait() is True  # no backoff left after a reply in time
    assert delivered == [b"x", b"y"]


def test_the_backoff_is_capped(pipe):
    read_fd, _ = pipe
    spin = ReplySpin(read_fd, lambda data: None)
    for _ in range(12):  # 12 misses would double past the cap
        spin._skip = 0
        spin.wait()
    assert spin._skip == MAX_SKIP


def test_end_of_file_or_a_closed_pipe_is_left_to_the_transport(pipe):
    read_fd, write_fd = pipe
    delivered: list[bytes] = []
    spin = ReplySpin(read_fd, delivered.append)
    os.close(write_fd)
    assert spin.wait() is False
    os.close(read_fd)
    assert ReplySpin(read_fd, delivered.append).wait() is False
    assert delivered == []


def test_cpus_beside_the_loop_follows_the_affinity():
    usable = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(usable)})
        assert cpus_beside_the_loop() is False
    finally:
        os.sched_setaffinity(0, usable)
    assert cpus_beside_the_loop() is (len(usable) > 1)
