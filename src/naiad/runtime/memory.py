"""Process memory: resident set sizes from /proc, and handing freed heap back to the OS."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of a process (this one by default); 0 when it cannot be read."""
    path = f"/proc/{pid or 'self'}/statm"
    try:
        with open(path, encoding="ascii") as f:
            resident_pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def release_free_memory() -> None:
    """glibc keeps freed arenas mapped; malloc_trim returns them so unloading really lowers RSS."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is not None:
        trim(0)


_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_buffers(mmap_threshold: int = 32 << 20, trim_threshold: int = 64 << 20) -> None:
    """Let glibc reuse freed tensor-sized buffers instead of returning them to the kernel at once.

    With the defaults, a 1 MB request body freed at the end of a request is unmapped (or trimmed off
    the heap top), so the next request page-faults a fresh 1 MB in again: ~1-2 ms per MB here, more
    than all the copies. Blocks up to `mmap_threshold` come from the heap, and up to `trim_threshold`
    of free heap stays mapped (release_free_memory still hands it all back, e.g. after an unload).
    """
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
        mallopt(_M_TRIM_THRESHOLD, trim_threshold)


def parse_size(text: str) -> int:
    """'2GB', '512MiB', '1048576' -> bytes (decimal and binary units)."""
    value = text.strip().upper().replace(" ", "")
    units = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40,
             "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "B": 1}
    for unit in sorted(units, key=len, reverse=True):
        if value.endswith(unit):
            number = value[: -len(unit)]
            try:
                return int(float(number) * units[unit])
            except ValueError:
                break
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"not a size: '{text}' (use e.g. 2GB, 512MiB or a byte count)") from None
