"""Where and when a request executes: the inline policy and the zero-delay policy every scheduler follows.

Inline execution. A tensor instance (`TensorInstance`: a ThreadInstance) normally executes on its own thread, so a
framework call never blocks the event loop. Handing a batch to that thread and back costs the loop
tens of microseconds (31-37 us per round trip measured on a 2-core x86 host, more on a busy loop),
which for a small model is more than the execution itself. So a model version whose executions
average less than `inline_threshold_us` (default 100 us; the average is an exponential moving
average of each execution's CPU time on the instance thread, or wall time when inline) executes
on the event loop instead, within the caller's step. Once inline, it stays there until its average
passes 1.5x the threshold, so that a model averaging about the threshold does not flap between the
loop and its threads with every noisy execution.

The hard cap. An execution cannot be interrupted once started, so the cap bounds how often, not
whether, a slow execution can hold the loop: an inline execution that held the loop longer than
`inline_cap_us` (default 5 ms) turns inline execution off for its model version for a suspension
of 1 s, doubling each further time up to 64 s; meanwhile its executions go to the instance
threads. One slow request therefore holds the loop once, and a model whose executions are
cheap on average but sometimes slow does so at most once per suspension. "Held the loop" is the
loop thread's CPU time in the execution (to within a millisecond: see _CPU_REFRESH_NS), looked at
only when its wall time is over the cap: a server the OS paused (a busy host, a container's CPU
quota) took no longer to execute anything and is not suspended for it (measured on a busy 2-core
host: pauses of 10 ms in 50 us executions, every few seconds). A model whose work waits on threads of its own is slow inline in wall time,
which enters the average: its next executions go back to the instance threads.

Zero-delay batching. A dynamic batcher with `max_queue_delay_microseconds: 0` (and without
`preserve_ordering`) never waits to fill a batch: a request that finds the queue empty and an
instance idle runs at once, alone, on that instance, exactly as the default scheduler runs every
request (`DirectScheduler.run_on()`): no hop through the batching loop, which would form a batch
of one anyway. Otherwise it is queued, and the next instance to free up takes all queued requests
that fit in one batch.

Both inline settings are model config parameters, read and checked by naiad/config/inline_settings.py, e.g.
`parameters { key: "inline_threshold_us" value { string_value: "0" } }` (0: never inline).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from tritonclient.grpc import model_config_pb2 as mc

from naiad.config.inline_settings import CAP_PARAMETER, InlineSettings

log = logging.getLogger(__name__)

FIRST_SUSPENSION_NS = 1_000_000_000
LONGEST_SUSPENSION_NS = 64_000_000_000
_WEIGHT = 0.2  # of the newest execution in the moving average
# The loop thread's CPU clock (a system call, ~0.5 us) is read at most once a millisecond at the start
# of inline executions: the CPU time charged to a slow one includes at most 1 ms of the loop's earlier work.
_CPU_REFRESH_NS = 1_000_000
A = TypeVar("A")
R = TypeVar("R")


class InlinePolicy:
    """Decides, for each execution of one model version, whether it runs inline on the event loop.

    Used on the event-loop thread only.
    """

    def __init__(self, settings: InlineSettings | None = None, name: str = "",
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.settings = settings or InlineSettings()
        self._name = name
        self._clock = clock
        # Start on the thread until measured: an unknown model is not trusted with the loop.
        self._average_ns = float(self.settings.threshold_ns * 10)
        self._suspended_until = 0
        self._was_inline = False  # the last execution ran inline (the hysteresis in inline())
        self.suspensions = 0  # how many times the cap turned inline execution off
        self._cpu_read_at = -_CPU_REFRESH_NS - 1  # (perf_counter_ns, thread_time_ns) of the loop thread
        self._cpu_at = 0

    def inline(self) -> bool:
        """Whether the next execution runs on the event loop."""
        threshold = self.settings.threshold_ns
        # Hysteresis: a model executing inline goes back to its threads only once its average passes
        # 1.5x the threshold. Without it a model averaging about the threshold flapped between the two
        # with every noisy execution (a 100-tree XGBoost forest at c=1, average 83-106 us: whole seconds
        # on its threads at 3.4k requests/s instead of ~4.9k inline).
        if self._average_ns >= (threshold + threshold // 2 if self._was_inline else threshold):
            self._was_inline = False
            return False
        if self._suspended_until:
            if self._clock() < self._suspended_until:
                return False
            self._suspended_until = 0
        self._was_inline = True
        return True

    def run_inline(self, execute: Callable[[A], R], argument: A) -> R:
        """`execute(argument)` on this thread (the event loop), measured for the average and the cap."""
        start = time.perf_counter_ns()
        if start - self._cpu_read_at > _CPU_REFRESH_NS:
            self._cpu_read_at, self._cpu_at = start, time.thread_time_ns()
        cpu_start = self._cpu_at
        try:
            return execute(argument)
        finally:
            wall = time.perf_counter_ns() - start
            self.observe_inline(wall, time.thread_time_ns() - cpu_start if wall > self.settings.cap_ns else 0)

    def observe_thread(self, cpu_ns: int) -> None:
        """An execution on an instance thread took `cpu_ns` of that thread's CPU time."""
        self._average_ns += (cpu_ns - self._average_ns) * _WEIGHT

    def observe_inline(self, wall_ns: int, cpu_ns: int) -> None:
        """An inline execution took `wall_ns`, of which `cpu_ns` on the loop thread's CPU (measured only when
        `wall_ns` is over the cap); more than the cap of CPU time suspends inline execution."""
        self._average_ns += (wall_ns - self._average_ns) * _WEIGHT
        if cpu_ns <= self.settings.cap_ns:
            return
        suspension = min(FIRST_SUSPENSION_NS << min(self.suspensions, 6), LONGEST_SUSPENSION_NS)
        self.suspensions += 1
        self._suspended_until = self._clock() + suspension
        log.warning("model '%s': an execution on the event loop used %.1f ms of its CPU, over the %.1f ms cap "
                    "(parameter %s); it executes on its instance threads for the next %d s",
                    self._name, cpu_ns / 1e6, self.settings.cap_ns / 1e6, CAP_PARAMETER, suspension // 1_000_000_000)


def runs_at_once(batching: mc.ModelDynamicBatching) -> bool:
    """The zero-delay policy applies to this dynamic batcher (see the module docstring)."""
    return batching.max_queue_delay_microseconds == 0 and not batching.preserve_ordering
