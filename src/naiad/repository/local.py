"""Local model repositories: finding model directories, version directories and config files."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelLocation:
    """One model directory found in a repository."""

    name: str
    path: Path


def scan_repositories(repositories: list[str]) -> tuple[dict[str, ModelLocation], dict[str, list[Path]]]:
    """Model name -> location; plus names found in more than one repository (both refused)."""
    found: dict[str, list[Path]] = {}
    for repo in repositories:
        root = Path(repo)
        try:
            entries = sorted(os.scandir(root), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir() and not entry.name.startswith("."):
                found.setdefault(entry.name, []).append(Path(entry.path))
    unique = {name: ModelLocation(name, dirs[0]) for name, dirs in found.items() if len(dirs) == 1}
    duplicates = {name: dirs for name, dirs in found.items() if len(dirs) > 1}
    return unique, duplicates


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
