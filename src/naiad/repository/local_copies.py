"""Local copies of remote models: each refresh fills a fresh directory that replaces the old one whole."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("naiad.repository")

# A refreshed model keeps its previous copy on disk while the old version drains; older ones are removed.
_KEPT_PREVIOUS = 1


@dataclass
class _Copies:
    """The copies of one model, newest last, with the fingerprint the newest was made from."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    fingerprint: tuple | None = None
    paths: list[Path] = field(default_factory=list)


class LocalCopies:
    """One repository's download area: a private temporary directory (or one made inside `parent`)."""

    def __init__(self, parent: Path | None = None, prefix: str = "naiad-repository-") -> None:
        self._parent = parent
        self._prefix = prefix
        self._root: Path | None = None
        self._models: dict[str, _Copies] = {}
        self._lock = threading.Lock()
        self._closed = False

    @property
    def root(self) -> Path | None:
        """The download area, once something was downloaded."""
        return self._root

    def get(self, name: str, fingerprint: tuple, fill: Callable[[Path], None]) -> Path:
        """The copy of `name` made from `fingerprint`; `fill(directory)` writes a new one when it changed."""
        copies = self._copies(name)
        with copies.lock:
            if copies.fingerprint == fingerprint and copies.paths and copies.paths[-1].is_dir():
                return copies.paths[-1]
            path = self._make(name, fill)
            copies.paths.append(path)
            copies.fingerprint = fingerprint
            stale, copies.paths = copies.paths[:-1 - _KEPT_PREVIOUS], copies.paths[-1 - _KEPT_PREVIOUS:]
        for old in stale:
            shutil.rmtree(old.parent, ignore_errors=True)
        return path

    def close(self) -> None:
        """Delete every copy (at server shutdown); later calls to get() fail."""
        with self._lock:
            self._closed = True
            root, self._root = self._root, None
            self._models.clear()
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    def _copies(self, name: str) -> _Copies:
        with self._lock:
            if self._closed:
                raise OSError("the repository was closed: its local copies are gone")
            return self._models.setdefault(name, _Copies())

    def _area(self) -> Path:
        with self._lock:
            if self._closed:
                raise OSError("the repository was closed: its local copies are gone")
            if self._root is None:
                if self._parent is not None:
                    self._parent.mkdir(parents=True, exist_ok=True)
                self._root = Path(tempfile.mkdtemp(prefix=self._prefix, dir=self._parent))
            return self._root

    def _make(self, name: str, fill: Callable[[Path], None]) -> Path:
        """Fill `<fresh dir>/.partial-<name>`, then rename it to `<fresh dir>/<name>` in one step."""
        holder = Path(tempfile.mkdtemp(prefix="copy-", dir=self._area()))
        partial = holder / f".partial-{name}"
        final = holder / name
        try:
            partial.mkdir()
            fill(partial)
            os.rename(partial, final)
        except BaseException:
            shutil.rmtree(holder, ignore_errors=True)
            raise
        log.debug("model '%s' copied to %s", name, final)
        return final
