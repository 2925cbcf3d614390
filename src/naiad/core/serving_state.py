"""Whether the server takes requests, and how many it is answering (what draining waits for)."""

from __future__ import annotations

import asyncio

from naiad.protocol.errors import unavailable


class ServingState:
    """Owned by the Server (which starts and stops it); read by the inference and control services."""

    def __init__(self) -> None:
        self.live = False  # startup finished, shutdown not finished
        self.exiting = False  # shutdown began: new requests are refused
        self.inflight = 0
        self.idle = asyncio.Event()  # set while inflight == 0

    def check_serving(self) -> None:
        if self.exiting or not self.live:
            raise unavailable("Server not ready")
