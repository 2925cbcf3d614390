"""What every worker-side host shares: the channel and its runtime, the ready message, the command loop.

A host runs one instance in a worker process; `python_host.PythonModelHost` runs a Triton Python model,
`backend_host.BackendHost` a tensor backend's instance. `worker.main()` starts the one the server names.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from naiad.runtime.process.framing import BlockingChannel
from naiad.runtime.process.worker_runtime import WorkerRuntime


class WorkerHost(ABC):
    """Batches ("x", "y") run one at a time on the main thread until the server asks to finalize ("f")."""

    def __init__(self, channel: BlockingChannel, init: dict[str, Any]) -> None:
        self.channel = channel
        self.init = init
        self.runtime = WorkerRuntime(channel, init["prefix"], init["decoupled"], init["model_name"],
                                     init["model_version"], init.get("log_verbose", 0), init.get("shm_sizes"))
        self.instance_name: str = init["args"]["model_instance_name"]

    @abstractmethod
    def start(self) -> bool:
        """Build the instance; send "ready" (True) or "init_error" (False, the load error)."""

    @abstractmethod
    def _run_batch(self, message: tuple[Any, ...]) -> None:
        """Execute one batch and send its "d" message (its responses, or the error of the whole batch)."""

    @abstractmethod
    def _finalize(self) -> None:
        """Release the instance, send "F" and end the process."""

    def announce_ready(self, info: dict[str, Any]) -> None:
        """Map the server's first block, make our own, and tell the server the instance is ready."""
        prewarmed = None
        try:
            if self.init.get("prewarmed"):
                self.runtime.peers.view(self.init["prewarmed"])
            prewarmed = self.runtime.pool.prewarm()
        except OSError:  # no room in /dev/shm now: blocks are created on demand (and fail there, per request)
            pass
        self.channel.send(("ready", {**info, "prewarmed": prewarmed}))

    def serve(self) -> None:
        self.runtime.inbox.start_helper()
        self._command_loop()

    def _command_loop(self) -> None:
        while True:
            message = self.runtime.inbox.next_command()
            kind = message[0]
            if kind == "x" or kind == "y":  # "y": a batch of one request in a flat message (Python models only)
                self._run_batch(message)
            elif kind == "f":
                self._finalize()
                return
            # Freed now, after the reply went out, rather than once the next message has arrived (then
            # on that request's path: ~0.3 us for a small batch's message and its input buffers).
            del message
