"""Local model repositories: model directories, version directories and config files."""

from __future__ import annotations

import os
from pathlib import Path


class LocalRepository:
    """A repository directory on this machine; models are its subdirectories."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._path = Path(root)

    def model_names(self) -> list[str]:
        entries = sorted(os.scandir(self._path), key=lambda e: e.name)
        return [e.name for e in entries if e.is_dir() and not e.name.startswith(".")]

    def fingerprint(self, name: str) -> tuple:
        return directory_fingerprint(self._path / name)

    def local_path(self, name: str) -> Path:
        return self._path / name

    def close(self) -> None:
        """Nothing to release: the files are the user's."""


def version_directories(model_dir: Path) -> dict[int, Path]:
    """Numeric version subdirectories; names that are not digits or start with '0' are ignored."""
    versions: dict[int, Path] = {}
    try:
        entries = list(os.scandir(model_dir))
    except OSError:
        return versions
    for entry in entries:
        name = entry.name
        if entry.is_dir() and name.isdigit() and not name.startswith("0") and name.isascii():
            versions[int(name)] = Path(entry.path)
    return versions


def config_file(model_dir: Path, config_name: str = "") -> Path | None:
    """configs/<name>.pbtxt when asked for and present, else config.pbtxt, else None."""
    if config_name:
        alternate = model_dir / "configs" / f"{config_name}.pbtxt"
        if alternate.is_file():
            return alternate
    default = model_dir / "config.pbtxt"
    return default if default.is_file() else None


def directory_fingerprint(model_dir: Path) -> tuple:
    """(relative path, mtime_ns, size) of every file: a change means the model must be reloaded."""
    items = []
    for root, dirs, files in os.walk(model_dir):
        dirs.sort()
        for name in sorted(files):
            path = Path(root) / name
            try:
                st = path.stat()
            except OSError:
                continue
            items.append((str(path.relative_to(model_dir)), st.st_mtime_ns, st.st_size))
    return tuple(items)
