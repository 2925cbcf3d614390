"""Client-registered system shared-memory regions (POSIX shm under /dev/shm), read and written in place."""

from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass

import numpy as np

from naiad.protocol.errors import ErrorCode, NaiadError, invalid_arg, unsupported
from naiad.protocol.tensor_codec import array_from_raw
from naiad.protocol.types import SharedMemoryRef

_SHM_DIR = "/dev/shm"
DISABLED_MESSAGE = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."


@dataclass
class _Region:
    name: str
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap

    def status(self) -> dict[str, str | int]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


def _shm_path(key: str) -> str:
    name = key[1:] if key.startswith("/") else key
    if not name or "/" in name or name in (".", ".."):
        raise invalid_arg(f"Unable to open shared memory region: invalid key '{key}'")
    return os.path.join(_SHM_DIR, name)


class SystemSharedMemoryRegistry:
    """Regions by name. Mappings are kept open until unregistered; tensors are views into them."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._regions: dict[str, _Region] = {}
        self._lock = threading.Lock()

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise unsupported(DISABLED_MESSAGE)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._check_enabled()
        if not name:
            raise invalid_arg("shared memory region name must not be empty")
        if offset < 0 or byte_size <= 0:
            raise invalid_arg(f"invalid offset {offset} or byte_size {byte_size} for shared memory region '{name}'")
        with self._lock:
            if name in self._regions:
                raise NaiadError(ErrorCode.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")
            path = _shm_path(key)
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError as exc:
                raise invalid_arg(f"Unable to open shared memory region: '{key}': {exc.strerror}") from None
            try:
                size = os.fstat(fd).st_size
                if offset + byte_size > size:
                    raise invalid_arg(
                        f"failed to register shared memory region '{name}': offset {offset} + byte_size {byte_size} "
                        f"exceeds the {size} bytes of '{key}'"
                    )
                mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
            self._regions[name] = _Region(name, key, offset, byte_size, mapping)

    def unregister(self, name: str = "") -> None:
        self._check_enabled()
        with self._lock:
            names = [name] if name else list(self._regions)
            for region_name in names:
                region = self._regions.pop(region_name, None)
                if region is not None:
                    try:
                        region.mapping.close()
                    except BufferError:
                        # A numpy view still points into it; the mapping closes when that view dies.
                        pass

    def status(self, name: str = "") -> list[dict[str, str | int]]:
        with self._lock:
            if name:
                region = self._regions.get(name)
                if region is None:
                    raise invalid_arg(f"Unable to find system shared memory region: '{name}'")
                return [region.status()]
            return [r.status() for r in self._regions.values()]

    def _window(self, ref: SharedMemoryRef, what: str) -> memoryview:
        self._check_enabled()
        region = self._regions.get(ref.region)
        if region is None:
            raise invalid_arg(f"Unable to find shared memory region: '{ref.region}'")
        if ref.offset < 0 or ref.byte_size < 0 or ref.offset + ref.byte_size > region.byte_size:
            raise invalid_arg(
                f"{what}: shared memory offset {ref.offset} + byte size {ref.byte_size} exceeds the "
                f"{region.byte_size} bytes of region '{ref.region}'"
            )
        start = region.offset + ref.offset
        return memoryview(region.mapping)[start : start + ref.byte_size]

    def read_tensor(self, ref: SharedMemoryRef, datatype: str, shape: tuple[int, ...], input_name: str) -> np.ndarray:
        """A view of an input tensor inside a region (sizes checked against the declared shape)."""
        window = self._window(ref, f"input '{input_name}'")
        return array_from_raw(datatype, shape, window, input_name)

    def write(self, ref: SharedMemoryRef, data: bytes | memoryview, output_name: str) -> None:
        """Copy an output's raw bytes into a region; the region must be large enough."""
        window = self._window(ref, f"output '{output_name}'")
        if len(data) > len(window):
            raise invalid_arg(
                f"shared memory region '{ref.region}' of {ref.byte_size} bytes is too small for output "
                f"'{output_name}' of {len(data)} bytes"
            )
        window[: len(data)] = data

    def close(self) -> None:
        if self.enabled:
            self.unregister("")
