"""Any other fsspec URL (here memory://) goes through the same listing, fingerprint and copy logic."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

fsspec = pytest.importorskip("fsspec")

from naiad.repository.remote import RemoteRepository  # noqa: E402


@pytest.fixture()
def url() -> Iterator[str]:
    root = f"memory://naiad-{uuid.uuid4().hex}/models"
    fs = fsspec.filesystem("memory")
    fs.pipe({
        f"{root}/add_sub/config.pbtxt": b"cfg",
        f"{root}/add_sub/1/model.onnx": b"weights",
        f"{root}/notes.txt": b"ignored",
    })
    fs.mkdir(f"{root}/ens/1")
    fs.pipe(f"{root}/ens/config.pbtxt", b"ens")
    yield root
    fs.rm(root.rsplit("/", 1)[0], recursive=True)


def test_memory_repository(url: str) -> None:
    repository = RemoteRepository(url, environ={})
    try:
        assert repository.model_names() == ["add_sub", "ens"]
        before = repository.fingerprint("add_sub")
        copy = repository.local_path("add_sub")
        assert (copy / "1" / "model.onnx").read_bytes() == b"weights"
        ens = repository.local_path("ens")
        assert (ens / "1").is_dir() and not any((ens / "1").iterdir())
        fsspec.filesystem("memory").pipe(f"{url}/add_sub/config.pbtxt", b"changed config")
        assert repository.fingerprint("add_sub") != before
        assert (repository.local_path("add_sub") / "config.pbtxt").read_bytes() == b"changed config"
    finally:
        repository.close()
