"""Model repositories on object storage (s3://, gs://, as://, az:// and other fsspec URLs), mirrored to local copies."""

from __future__ import annotations

import importlib.util
import logging
import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from naiad.repository.cloud_urls import CloudLocation, parse_cloud_url
from naiad.repository.credentials import storage_options
from naiad.repository.local_copies import LocalCopies

log = logging.getLogger("naiad.repository")

# fsspec protocol -> (package that implements it, naiad extra that installs it)
_PACKAGES = {"s3": ("s3fs", "s3"), "gcs": ("gcsfs", "gcs"), "abfs": ("adlfs", "azure")}
# Where downloads go instead of a fresh temporary directory, per user scheme (Triton's variables).
_MOUNT_VARIABLES = {
    "s3": "TRITON_AWS_MOUNT_DIRECTORY",
    "gs": "TRITON_GCS_MOUNT_DIRECTORY",
    "gcs": "TRITON_GCS_MOUNT_DIRECTORY",
    "as": "TRITON_AZURE_MOUNT_DIRECTORY",
    "az": "TRITON_AZURE_MOUNT_DIRECTORY",
    "abfs": "TRITON_AZURE_MOUNT_DIRECTORY",
}
# Listing fields that change when an object is rewritten: a content/version tag, then a modification time.
_TAG_FIELDS = ("ETag", "etag", "generation", "md5Hash", "VersionId", "version_id")
_TIME_FIELDS = ("LastModified", "last_modified", "updated", "mtime", "created")


class MissingFilesystemError(ImportError):
    """The optional package for a URL scheme is not installed; the message says which extra to install."""


@dataclass(frozen=True)
class RemoteEntry:
    """One object (or directory) of a model, relative to the model's prefix."""

    relative: str
    is_dir: bool
    size: int = 0
    stamp: str = ""


def open_filesystem(location: CloudLocation, environ: Mapping[str, str]) -> Any:
    """A private fsspec filesystem for `location` (no shared instance, no listing cache)."""
    package, extra = _PACKAGES.get(location.protocol, (None, None))
    if importlib.util.find_spec("fsspec") is None:
        install = f"pip install 'naiad[{extra}]'" if extra else "pip install fsspec"
        raise MissingFilesystemError(f"{location.scheme}:// model repositories need fsspec: {install}")
    if package is not None and importlib.util.find_spec(package) is None:
        raise MissingFilesystemError(
            f"{location.scheme}:// model repositories need the '{package}' package: pip install 'naiad[{extra}]'"
        )
    import fsspec

    try:
        cls = fsspec.get_filesystem_class(location.protocol)
    except (ImportError, ValueError) as exc:
        raise MissingFilesystemError(f"no filesystem for {location.scheme}:// repositories: {exc}") from None
    options = storage_options(location, environ)
    return cls(skip_instance_cache=True, use_listings_cache=False, **options)


class RemoteRepository:
    """A repository on object storage; models are downloaded to local copies when they are (re)loaded."""

    def __init__(self, url: str, environ: Mapping[str, str] | None = None, cache_dir: str | Path | None = None) -> None:
        environ = os.environ if environ is None else environ
        self.root = url
        self.location = parse_cloud_url(url)
        self._fs = open_filesystem(self.location, environ)
        self._base = self._fs._strip_protocol(f"{self.location.protocol}://{self.location.path}").rstrip("/")
        mount = cache_dir or environ.get(_MOUNT_VARIABLES.get(self.location.scheme, ""), "")
        self._copies = LocalCopies(Path(mount) if mount else None)
        self._finalizer = weakref.finalize(self, self._copies.close)

    def model_names(self) -> list[str]:
        """The top-level prefixes (directories) of the repository; objects at the top level are ignored."""
        try:
            entries = self._call(self._fs.ls, self._base, detail=True)
        except OSError as exc:
            log.error("cannot list model repository %s: %s", self.root, exc)
            raise
        names = set()
        for info in entries:
            path = str(info.get("name", "")).rstrip("/")
            name = path.rsplit("/", 1)[-1]
            if info.get("type") != "directory" or path == self._base or not _safe_name(name) or name.startswith("."):
                continue
            names.add(name)
        return sorted(names)

    def fingerprint(self, name: str) -> tuple:
        """(path, size, tag and time) of every object and the directories: no download needed."""
        return _fingerprint(self.entries(name))

    def local_path(self, name: str) -> Path:
        """A local directory with the model's current files, downloaded again only when they changed."""
        if not _safe_name(name):
            raise OSError(f"invalid model name '{name}'")
        entries = self.entries(name)
        if not entries:
            raise FileNotFoundError(f"model '{name}' is not in the model repository {self.root}")
        return self._copies.get(name, _fingerprint(entries), lambda target: self._download(name, entries, target))

    def close(self) -> None:
        """Delete the local copies (call at server shutdown, after the models were unloaded)."""
        self._finalizer()

    @property
    def cache_root(self) -> Path | None:
        """The local download area, once a model was downloaded."""
        return self._copies.root

    def entries(self, name: str) -> list[RemoteEntry]:
        """Everything under the model's prefix: files with size and stamp, directories (markers or implied)."""
        base = f"{self._base}/{name}"
        try:
            found = self._call(self._fs.find, base, withdirs=True, detail=True)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise OSError(f"cannot list model '{name}' in {self.root}: {exc}") from exc
        files: dict[str, RemoteEntry] = {}
        dirs: set[str] = set()
        for path, info in found.items():
            if not path.startswith(base + "/"):
                continue  # the model prefix itself (or its "name/" marker)
            relative = path[len(base) + 1:]
            is_dir = info.get("type") == "directory" or relative.endswith("/")
            relative = relative.strip("/")
            if not relative:
                continue
            if not all(_safe_name(part) for part in relative.split("/")):
                log.warning("skipping object '%s' of model '%s': unusable path", relative, name)
                continue
            parents = relative.split("/")[:-1]
            dirs.update("/".join(parents[:i + 1]) for i in range(len(parents)))
            if is_dir:
                dirs.add(relative)
            else:
                files[relative] = RemoteEntry(relative, False, int(info.get("size") or 0), _stamp(info))
        for clash in sorted(dirs & files.keys()):
            log.warning("skipping object '%s' of model '%s': a directory has the same name", clash, name)
            del files[clash]
        return sorted([RemoteEntry(d, True) for d in dirs] + list(files.values()), key=lambda e: e.relative)

    def _download(self, name: str, entries: list[RemoteEntry], target: Path) -> None:
        """Directories first (parents of every file are among them), then all files in one concurrent get."""
        for entry in entries:
            if entry.is_dir:
                (target / entry.relative).mkdir(parents=True, exist_ok=True)
        files = [e for e in entries if not e.is_dir]
        if not files:
            return
        remote = [f"{self._base}/{name}/{e.relative}" for e in files]
        local = [str(target / e.relative) for e in files]
        try:
            self._call(self._fs.get, remote, local)
        except OSError as exc:
            raise OSError(f"cannot download model '{name}' from {self.root}: {exc}") from exc

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a filesystem call; SDK errors (botocore, google, azure) become OSError like the rest."""
        try:
            return method(*args, **kwargs)
        except OSError:
            raise
        except Exception as exc:
            raise OSError(f"{type(exc).__name__}: {exc}") from exc


def _fingerprint(entries: list[RemoteEntry]) -> tuple:
    return tuple((e.relative, "dir") if e.is_dir else (e.relative, e.size, e.stamp) for e in entries)


def _stamp(info: Mapping[str, Any]) -> str:
    """The object's tag and modification time as listed (either changes when the object is rewritten)."""
    tag = next((str(info[k]) for k in _TAG_FIELDS if info.get(k)), "")
    when = next((str(info[k]) for k in _TIME_FIELDS if info.get(k)), "")
    return f"{tag}@{when}"


def _safe_name(part: str) -> bool:
    """A path component that stays inside the local copy (no '', '.', '..', separators or NULs)."""
    return part not in ("", ".", "..") and "/" not in part and "\\" not in part and "\0" not in part
