"""A short busy-wait for a worker's reply to the server's only request in flight.

With one request in flight the event loop has nothing to do until the worker answers, and sleeping in
the kernel until then costs more than the wait: the worker's write has to wake the sleeping CPU (on a
virtual machine an inter-processor interrupt and an exit to the hypervisor), epoll returns, and the
server's caches have gone cold meanwhile. Reading the worker's pipe in a loop for a little while instead
answers a fast model sooner: see "Waiting for a lone request's reply" in benchmarks/README.md.

Only where the worker can run beside the loop (the server may use two or more CPUs), only for the
server's lone request, for at most SPIN_SECS. A wait that ends without the reply makes the next ones
rarer (1, 2, 4 ... up to MAX_SKIP lone requests are let by without one), so a slow model costs a spin
now and then, and one that got fast again is spun for within MAX_SKIP requests.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from naiad.config.cpu_placement import usable_cpu_count

SPIN_SECS = 200e-6
MAX_SKIP = 1024
READ_SIZE = 256 * 1024


def cpus_beside_the_loop() -> bool:
    """Whether this process may run on two or more CPUs (else a spin would only delay the worker)."""
    return usable_cpu_count() > 1


class ReplySpin:
    """Reads the worker's pipe (non-blocking, owned by the loop's read transport) until data arrives or
    SPIN_SECS pass; what it reads goes to `deliver`, the transport's protocol, as the loop would have."""

    def __init__(self, fd: int, deliver: Callable[[bytes], None]) -> None:
        self._fd = fd
        self._deliver = deliver
        self._backoff = 0  # how many lone requests the last miss lets by
        self._skip = 0  # lone requests still to let by

    def wait(self) -> bool:
        """Wait for the reply; True when it came (and was delivered) within SPIN_SECS."""
        if self._skip:
            self._skip -= 1
            return False
        fd, clock = self._fd, time.perf_counter
        deadline = clock() + SPIN_SECS
        while True:
            try:
                data = os.read(fd, READ_SIZE)
            except BlockingIOError:
                if clock() < deadline:
                    continue
                self._backoff = min(max(1, 2 * self._backoff), MAX_SKIP)
                self._skip = self._backoff
                return False
            except OSError:  # closed: the transport reports the worker lost
                return False
            if not data:  # end of file: left to the transport as well
                return False
            self._backoff = 0
            self._deliver(data)
            return True
