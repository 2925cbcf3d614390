"""The server's view of all its repositories: which models exist where, their fingerprints, local copies."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from naiad.repository.local import LocalRepository


class Repository(Protocol):
    """One model repository (a local directory, or object storage mirrored to a local cache)."""

    root: str

    def model_names(self) -> list[str]: ...

    def fingerprint(self, name: str) -> tuple:
        """Changes whenever any file of the model changes (drives reloads and POLL mode)."""
        ...

    def local_path(self, name: str) -> Path:
        """A local directory holding the model's current files (downloaded first if remote)."""
        ...

    def close(self) -> None:
        """Release local copies (remote repositories delete their download area)."""
        ...


@dataclass(frozen=True)
class ModelLocation:
    name: str
    repository: Repository


def open_repository(url: str) -> Repository:
    """A local path (or file:// URL), or an fsspec URL such as s3://, gs://, az:// (remote extra)."""
    if url.startswith("file://"):
        return LocalRepository(url[len("file://"):])
    if "://" in url:
        from naiad.repository.remote import (
            RemoteRepository,  # optional: needs fsspec and a filesystem
        )

        return RemoteRepository(url)
    return LocalRepository(url)


class RepositoryCatalog:
    """All repositories of a server; a model name found in two repositories is refused."""

    def __init__(self, urls: list[str]) -> None:
        self.repositories = [open_repository(url) for url in urls]

    def check(self) -> None:
        """Every repository must be listable at start-up (Triton refuses to start otherwise)."""
        for repository in self.repositories:
            try:
                repository.model_names()
            except OSError as exc:
                raise OSError(f"unable to read model repository '{repository.root}': {exc}") from None

    def scan(self) -> tuple[dict[str, ModelLocation], dict[str, list[str]]]:
        found: dict[str, list[Repository]] = {}
        for repository in self.repositories:
            try:
                names = repository.model_names()
            except OSError:
                continue
            for name in names:
                found.setdefault(name, []).append(repository)
        unique = {name: ModelLocation(name, repos[0]) for name, repos in found.items() if len(repos) == 1}
        duplicates = {name: [r.root for r in repos] for name, repos in found.items() if len(repos) > 1}
        return unique, duplicates

    def close(self) -> None:
        for repository in self.repositories:
            repository.close()
