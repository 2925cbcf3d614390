"""The shared-memory interface: regions clients register so requests can name them for tensors."""

from __future__ import annotations

from typing import Any

from naiad.protocol.errors import invalid_arg, unsupported
from naiad.runtime.shared_memory import SystemSharedMemoryRegistry


class SharedMemoryService:
    """`SharedMemoryAPI` over the Server's registry of system regions; CUDA regions are refused (no GPU path)."""

    def __init__(self, registry: SystemSharedMemoryRegistry) -> None:
        self._registry = registry

    def status(self, name: str = "") -> list[dict[str, Any]]:
        return list(self._registry.status(name))

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._registry.register(name, key, offset, byte_size)

    def unregister(self, name: str = "") -> None:
        self._registry.unregister(name)

    def cuda_status(self, name: str = "") -> list[dict[str, Any]]:
        if name:
            raise invalid_arg(f"Unable to find cuda shared memory region: '{name}'")
        return []

    def cuda_register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        raise unsupported("CUDA shared memory is not supported: this server has no CUDA device")

    def cuda_unregister(self, name: str = "") -> None:
        return None
