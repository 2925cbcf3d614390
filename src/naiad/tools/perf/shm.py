"""System shared-memory regions for perf's inputs and outputs: create, fill, register, and clean up."""

from __future__ import annotations

import os
from multiprocessing import shared_memory

from naiad.tools.perf.inputs import InputSet, tensor_bytes
from naiad.tools.perf.payloads import ShmLayout, ShmRef
from naiad.tools.v2client import ControlClient


class SystemShmRegions:
    """One input region holding every input set, one region per output; all unlinked on close()."""

    def __init__(self, control: ControlClient, prefix: str | None = None) -> None:
        self.control = control
        self.prefix = prefix or f"naiad_perf_{os.getpid()}"
        self._segments: list[shared_memory.SharedMemory] = []
        self._registered: list[str] = []

    def _create(self, name: str, size: int) -> shared_memory.SharedMemory:
        segment = shared_memory.SharedMemory(name=name, create=True, size=max(size, 1))
        self._segments.append(segment)
        return segment

    def _register(self, region: str, segment: shared_memory.SharedMemory, size: int) -> None:
        self.control.register_system_shm(region, "/" + segment.name, size)
        self._registered.append(region)

    def build(self, input_sets: list[InputSet], output_sizes: dict[str, int]) -> ShmLayout:
        layout = ShmLayout()
        blobs: list[list[tuple[str, bytes]]] = [[(t.name, tensor_bytes(t)) for t in s] for s in input_sets]
        total = sum(len(b) for s in blobs for _, b in s)
        region = f"{self.prefix}_input"
        segment = self._create(region, total)
        offset = 0
        for tensors in blobs:
            refs = {}
            for name, blob in tensors:
                segment.buf[offset:offset + len(blob)] = blob
                refs[name] = ShmRef(region, offset, len(blob))
                offset += len(blob)
            layout.inputs.append(refs)
        self._register(region, segment, max(total, 1))
        for index, (name, size) in enumerate(output_sizes.items()):
            out_region = f"{self.prefix}_output{index}"
            out_segment = self._create(out_region, size)
            self._register(out_region, out_segment, size)
            layout.outputs[name] = ShmRef(out_region, 0, size)
        return layout

    def close(self) -> None:
        for region in self._registered:
            try:
                self.control.unregister_system_shm(region)
            except Exception:
                pass
        self._registered.clear()
        for segment in self._segments:
            segment.close()
            try:
                segment.unlink()
            except FileNotFoundError:
                pass
        self._segments.clear()
