"""POSIX shared-memory blocks: a writer-owned pool of reusable blocks and a reader-side cache of mappings."""

from __future__ import annotations

import mmap
import os
import threading

try:  # CPython's private helper behind multiprocessing.shared_memory (no resource tracker involved)
    import _posixshmem  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - non-POSIX platforms
    _posixshmem = None

SHM_DIR = "/dev/shm"
# Defaults of `--backend-config python,shm-default-byte-size=` / `shm-growth-byte-size=`. Smaller than
# Triton's 1 MiB: blocks are per message, and many instances must fit Docker's default 64 MB /dev/shm.
DEFAULT_BYTE_SIZE = 64 * 1024
GROWTH_BYTE_SIZE = 64 * 1024
MAX_FREE_BLOCKS = 8
MAX_POOLED_BYTES = 64 * 1024 * 1024


def _open(name: str, flags: int) -> int:
    if _posixshmem is not None:
        fd: int = _posixshmem.shm_open("/" + name, flags, 0o600)
        return fd
    return os.open(os.path.join(SHM_DIR, name), flags, 0o600)


def shm_unlink(name: str) -> None:
    """Remove a segment name; already-removed names are fine."""
    try:
        if _posixshmem is not None:
            _posixshmem.shm_unlink("/" + name)
        else:
            os.unlink(os.path.join(SHM_DIR, name))
    except FileNotFoundError:
        pass


def shm_create(name: str, size: int) -> mmap.mmap:
    fd = _open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR)
    try:
        if hasattr(os, "posix_fallocate"):
            # Reserve the pages now: a full /dev/shm then fails here (ENOSPC), not later with SIGBUS.
            os.posix_fallocate(fd, 0, size)
        else:
            os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    except BaseException:
        shm_unlink(name)
        raise
    finally:
        os.close(fd)


def shm_attach(name: str) -> mmap.mmap:
    """Map a peer's segment and unlink its name (the mapping keeps the memory alive)."""
    fd = _open(name, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)
        shm_unlink(name)


def remove_prefixed(prefix: str) -> int:
    """Unlink every segment whose name starts with prefix (Linux: /dev/shm is listable)."""
    removed = 0
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    for name in names:
        if name.startswith(prefix):
            shm_unlink(name)
            removed += 1
    return removed


def _close_map(mapping: mmap.mmap) -> None:
    try:
        mapping.close()
    except BufferError:
        pass  # numpy views are still alive: the mapping goes away with the last of them


def block_size_for(nbytes: int, default_size: int = DEFAULT_BYTE_SIZE, growth: int = GROWTH_BYTE_SIZE) -> int:
    """The default size, or for more data the default grown by whole growth increments."""
    if nbytes <= default_size:
        return default_size
    return default_size + -(-(nbytes - default_size) // growth) * growth


class Block:
    """One writer-owned segment."""

    __slots__ = ("name", "size", "mapping")

    def __init__(self, name: str, size: int, mapping: mmap.mmap) -> None:
        self.name = name
        self.size = size
        self.mapping = mapping


class BlockPool:
    """Blocks this process writes into; the peer hands them back (release) when it has read them.

    A block is shared by exactly two processes, its creator and its peer; the peer unlinks the name
    as soon as it mapped it, so the kernel frees the memory once both unmapped it, however they end.
    Blocks are `default_size` bytes (Triton's shm-default-byte-size); data that does not fit gets a
    block grown by whole `growth` increments (shm-growth-byte-size).
    """

    def __init__(self, prefix: str, default_size: int = DEFAULT_BYTE_SIZE, growth: int = GROWTH_BYTE_SIZE) -> None:
        self.prefix = prefix
        self.default_size = default_size
        self.growth = growth
        self._counter = 0
        self._lock = threading.Lock()
        self._free: list[Block] = []
        self._used: dict[str, Block] = {}
        self._dropped: list[str] = []
        self._closed = False

    def acquire(self, nbytes: int) -> Block:
        with self._lock:
            if self._closed:
                raise RuntimeError("shared-memory pool is closed")
            best = None
            for block in self._free:
                if block.size >= nbytes and (best is None or block.size < best.size):
                    best = block
            if best is not None:
                self._free.remove(best)
                self._used[best.name] = best
                return best
            self._counter += 1
            name = f"{self.prefix}{self._counter}"
        size = block_size_for(nbytes, self.default_size, self.growth)
        block = Block(name, size, shm_create(name, size))
        with self._lock:
            self._used[name] = block
        return block

    def prewarm(self) -> str:
        """Create the first default-size block now (the first request need not pay for it); its name.

        The peer should map it right away (PeerBlocks.view), which also unlinks the name.
        """
        name = self.acquire(self.default_size).name
        self.release(name)
        return name

    def release(self, name: str) -> None:
        with self._lock:
            block = self._used.pop(name, None)
            if block is None:
                return
            if self._closed:
                self._destroy(block)
                return
            self._free.append(block)
            pooled = sum(b.size for b in self._free)
            while self._free and (len(self._free) > MAX_FREE_BLOCKS or pooled > MAX_POOLED_BYTES):
                victim = max(self._free, key=lambda b: b.size)
                self._free.remove(victim)
                pooled -= victim.size
                self._destroy(victim)

    def _destroy(self, block: Block) -> None:
        shm_unlink(block.name)
        _close_map(block.mapping)
        self._dropped.append(block.name)

    def take_dropped(self) -> list[str]:
        """Names destroyed since the last call: the peer should drop its mappings of them."""
        if not self._dropped:  # the common case, asked after every message: no lock, no new list
            return []
        with self._lock:
            dropped, self._dropped = self._dropped, []
            return dropped

    def in_use(self) -> int:
        with self._lock:
            return len(self._used)

    def close(self) -> None:
        """Unlink and unmap every block (used ones too: the peer is gone or finished)."""
        with self._lock:
            self._closed = True
            blocks = list(self._free) + list(self._used.values())
            self._free.clear()
            self._used.clear()
            for block in blocks:
                self._destroy(block)
            self._dropped.clear()


class PeerBlocks:
    """The peer's blocks this process reads from, mapped once and cached by name."""

    def __init__(self) -> None:
        self._maps: dict[str, mmap.mmap] = {}
        self._lock = threading.Lock()

    def view(self, name: str) -> mmap.mmap:
        mapping = self._maps.get(name)
        if mapping is None:
            with self._lock:
                mapping = self._maps.get(name)
                if mapping is None:
                    mapping = shm_attach(name)
                    self._maps[name] = mapping
        return mapping

    def drop(self, names: list[str]) -> None:
        with self._lock:
            for name in names:
                mapping = self._maps.pop(name, None)
                if mapping is not None:
                    _close_map(mapping)

    def close(self) -> None:
        with self._lock:
            mappings = list(self._maps.values())
            self._maps = {}
        for mapping in mappings:
            _close_map(mapping)
