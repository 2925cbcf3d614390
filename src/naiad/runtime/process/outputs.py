"""Server side: outputs read from worker blocks; large ones are zero-copy views that hand their block back when freed."""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from naiad.runtime.process.shm import PeerBlocks
from naiad.runtime.process.tensors import NUMPY_OF, unpack_one

ZERO_COPY_MIN = 64 * 1024  # smaller outputs are copied (cheaper than tracking a view)


class OutputReader:
    """Arrays of a worker's response; a block is released once read (copies) or once its last view is gone."""

    def __init__(self, peers: PeerBlocks, release: Callable[[str], None], loop: asyncio.AbstractEventLoop) -> None:
        self._peers = peers
        self._release = release
        self._loop = loop
        self._thread = threading.get_ident()
        self._holds: dict[str, int] = {}
        self.closed = False

    def read(self, block: str | None, metas: list[Any]) -> dict[str, np.ndarray]:
        outputs: dict[str, np.ndarray] = {}
        if not block:  # every output inline in the message: its arrays own their data
            for meta in metas:
                name, datatype, shape, data, nbytes = meta
                if nbytes and datatype != "BYTES":  # what unpack_one does for it, without the call
                    outputs[name] = np.ndarray(shape, NUMPY_OF[datatype], data)
                else:
                    outputs[name] = unpack_one(None, meta, True)
            return outputs
        mapping = self._peers.view(block)
        views = 0
        for meta in metas:
            if meta[4] >= ZERO_COPY_MIN and meta[1] != "BYTES":
                array = unpack_one(mapping, meta, copy=False)
                weakref.finalize(array, self._view_gone, block)
                views += 1
            else:
                array = unpack_one(mapping, meta, copy=True)
            outputs[meta[0]] = array
        if views:
            self._holds[block] = self._holds.get(block, 0) + views
        return outputs

    def done_with(self, block: str | None) -> None:
        """The message that named `block` is handled: release it now unless views still use it."""
        if block and block not in self._holds:
            self._release(block)

    def _view_gone(self, block: str) -> None:
        if threading.get_ident() == self._thread:
            self._drop_hold(block)
        elif not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._drop_hold, block)
            except RuntimeError:  # the loop is shutting down
                pass

    def _drop_hold(self, block: str) -> None:
        count = self._holds.get(block, 0) - 1
        if count > 0:
            self._holds[block] = count
            return
        self._holds.pop(block, None)
        if not self.closed:
            self._release(block)
