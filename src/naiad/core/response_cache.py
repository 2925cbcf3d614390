"""The local response cache: an LRU over response bytes shared by every model that enables it."""

from __future__ import annotations

import collections
import hashlib
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from naiad.protocol.tensor_codec import array_to_raw
from naiad.protocol.types import InferInput


@dataclass
class CachedResponse:
    outputs: dict[str, np.ndarray]
    parameters: dict[str, Any]
    byte_size: int


def cache_key(model_name: str, version: str, inputs: list[InferInput]) -> str:
    """Hash of model, version and every input's name, datatype, shape and bytes (sorted by name)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(model_name.encode())
    digest.update(b"\0" + version.encode())
    for tensor in sorted(inputs, key=lambda t: t.name):
        digest.update(f"\0{tensor.name}\0{tensor.datatype}\0{list(tensor.shape)}\0".encode())
        digest.update(array_to_raw(np.asarray(tensor.data), tensor.datatype))
    return digest.hexdigest()


class ResponseCache:
    """Thread-safe LRU bounded in bytes; an entry larger than the whole cache is not stored."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self._entries: collections.OrderedDict[str, CachedResponse] = collections.OrderedDict()
        self._used = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> CachedResponse | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: str, outputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> None:
        size = sum(int(a.nbytes) if a.dtype != np.object_ else sum(len(x) for x in a.ravel()) for a in outputs.values())
        if size > self.capacity:
            return
        entry = CachedResponse({n: np.array(a, copy=True) for n, a in outputs.items()}, dict(parameters), size)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._used -= old.byte_size
            while self._entries and self._used + size > self.capacity:
                _, evicted = self._entries.popitem(last=False)
                self._used -= evicted.byte_size
            self._entries[key] = entry
            self._used += size

    def usage(self) -> tuple[int, int]:
        with self._lock:
            return len(self._entries), self._used


def parse_cache_config(entries: list[str]) -> int | None:
    """`--cache-config local,size=N` -> N bytes (None when no local cache is configured)."""
    size = None
    for entry in entries:
        kind, _, setting = entry.partition(",")
        key, _, value = setting.partition("=")
        if kind != "local":
            raise ValueError(f"unsupported cache '{kind}' in --cache-config (only 'local' is available)")
        if key != "size" or not value.isdigit():
            raise ValueError(f"--cache-config expects local,size=<bytes>, got '{entry}'")
        size = int(value)
    return size
