"""RemoteRepository against a real S3 endpoint (moto's server on 127.0.0.1): listing, fingerprints, local copies."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")
pytest.importorskip("boto3")

from naiad.repository.catalog import RepositoryCatalog, open_repository
from naiad.repository.remote import RemoteRepository
from tests.support.moto_s3 import DUMMY_AWS, Bucket, moto_endpoint


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_endpoint() as address:
        yield address


@pytest.fixture()
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """Dummy credentials only: no profile, config file or instance metadata lookups."""
    for name, value in DUMMY_AWS.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "TRITON_CLOUD_CREDENTIAL_PATH", "TRITON_AWS_MOUNT_DIRECTORY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    return dict(DUMMY_AWS)


@pytest.fixture()
def bucket(endpoint: str, aws_env: dict[str, str]) -> Bucket:
    return Bucket(endpoint)


@pytest.fixture()
def repository(bucket: Bucket) -> Iterator[RemoteRepository]:
    repo = RemoteRepository(bucket.url())
    yield repo
    repo.close()


def _files(directory: Path) -> dict[str, bytes | None]:
    """Relative path -> content (None for directories)."""
    return {str(p.relative_to(directory)): (p.read_bytes() if p.is_file() else None) for p in directory.rglob("*")}


def test_model_names_are_top_level_prefixes(bucket: Bucket, repository: RemoteRepository) -> None:
    bucket.put("models/add_sub/config.pbtxt", b"cfg")
    bucket.put("models/add_sub/1/model.onnx", b"onnx")
    bucket.put("models/ensemble/1/")
    bucket.put("models/marker_only/")
    bucket.put("models/.hidden/config.pbtxt", b"x")
    bucket.put("models/README.md", b"not a model")
    bucket.put("elsewhere/other/config.pbtxt", b"x")
    assert repository.model_names() == ["add_sub", "ensemble", "marker_only"]
    assert repository.cache_root is None  # listing downloads nothing


def test_missing_prefix_or_bucket_is_an_os_error(bucket: Bucket, aws_env: dict[str, str]) -> None:
    with pytest.raises(FileNotFoundError):
        RemoteRepository(bucket.url("no/such/prefix")).model_names()
    with pytest.raises(OSError):
        RemoteRepository(f"s3://{bucket.endpoint}/naiad-no-such-bucket/models").model_names()


def test_catalog_scans_a_remote_repository_next_to_a_local_one(bucket: Bucket, tmp_path: Path) -> None:
    bucket.put("models/remote_model/1/model.onnx", b"x")
    (tmp_path / "local_model" / "1").mkdir(parents=True)
    catalog = RepositoryCatalog([bucket.url(), str(tmp_path)])
    assert isinstance(catalog.repositories[0], RemoteRepository)
    locations, duplicates = catalog.scan()
    assert sorted(locations) == ["local_model", "remote_model"] and duplicates == {}
    assert isinstance(open_repository(bucket.url()), RemoteRepository)


def test_local_path_downloads_files_and_keeps_empty_directories(bucket: Bucket, repository: RemoteRepository) -> None:
    bucket.put("models/ens/config.pbtxt", b'platform: "ensemble"')
    bucket.put("models/ens/1/")  # an empty version directory, as a zero-byte marker
    bucket.put("models/ens/")  # a marker for the model itself
    bucket.put("models/m/config.pbtxt", b"cfg")
    bucket.put("models/m/2/model.onnx", b"v2")  # version directory implied by the prefix only
    bucket.put("models/m/3/sub/deep.bin", b"deep")
    bucket.put("models/m/empty_file", b"")
    ens = repository.local_path("ens")
    assert ens.name == "ens" and ens.is_dir()
    assert _files(ens) == {"config.pbtxt": b'platform: "ensemble"', "1": None}
    model = repository.local_path("m")
    assert model.name == "m"
    assert _files(model) == {
        "config.pbtxt": b"cfg", "2": None, "2/model.onnx": b"v2", "3": None, "3/sub": None,
        "3/sub/deep.bin": b"deep", "empty_file": b"",
    }
    assert repository.cache_root is not None and model.is_relative_to(repository.cache_root)


def test_fingerprint_follows_every_change_without_downloading(bucket: Bucket, repository: RemoteRepository) -> None:
    bucket.put("models/m/config.pbtxt", b"cfg")
    bucket.put("models/m/1/model.onnx", b"v1")
    first = repository.fingerprint("m")
    assert first == repository.fingerprint("m")
    assert repository.cache_root is None
    seen = {first}
    for change in (
        lambda: bucket.put("models/m/config.pbtxt", b"cfg changed"),  # rewritten object
        lambda: bucket.put("models/m/2/"),  # a new empty version directory
        lambda: bucket.put("models/m/3/model.onnx", b"v3"),  # a new version
        lambda: bucket.delete("models/m/1/model.onnx"),  # a removed version
    ):
        change()
        current = repository.fingerprint("m")
        assert current not in seen
        seen.add(current)
    assert repository.fingerprint("absent") == ()


def test_unchanged_model_reuses_its_copy_and_a_change_gets_a_fresh_one(bucket: Bucket, repository: RemoteRepository) -> None:
    bucket.put("models/m/config.pbtxt", b"one")
    bucket.put("models/m/1/model.onnx", b"weights-1")
    first = repository.local_path("m")
    assert repository.local_path("m") == first
    bucket.put("models/m/config.pbtxt", b"two")
    bucket.put("models/m/2/model.onnx", b"weights-2")
    second = repository.local_path("m")
    assert second != first and second.name == "m"
    assert _files(second)["config.pbtxt"] == b"two" and "2/model.onnx" in _files(second)
    # The copy a served version may still read was not touched.
    assert _files(first) == {"config.pbtxt": b"one", "1": None, "1/model.onnx": b"weights-1"}
    bucket.put("models/m/config.pbtxt", b"three")
    third = repository.local_path("m")
    assert (third / "config.pbtxt").read_bytes() == b"three"
    assert second.exists() and not first.exists()  # the previous copy stays, older ones are removed
    assert not first.parent.exists()


def test_missing_model_is_file_not_found(repository: RemoteRepository) -> None:
    with pytest.raises(FileNotFoundError, match="absent"):
        repository.local_path("absent")
    with pytest.raises(OSError, match="invalid model name"):
        repository.local_path("..")


def test_keys_that_would_leave_the_copy_are_skipped(bucket: Bucket, repository: RemoteRepository) -> None:
    bucket.put("models/m/config.pbtxt", b"cfg")
    bucket.put("models/m/1/../../../escaped.txt", b"evil")
    bucket.put("models/m/1/./dot.txt", b"evil")
    copy = repository.local_path("m")
    assert _files(copy) == {"config.pbtxt": b"cfg", "1": None}  # the prefix "1/" exists; its odd keys do not
    assert not any(p.name in ("escaped.txt", "dot.txt") for p in copy.parents[1].rglob("*"))


def test_close_deletes_the_copies(bucket: Bucket) -> None:
    bucket.put("models/m/config.pbtxt", b"cfg")
    repository = RemoteRepository(bucket.url())
    copy = repository.local_path("m")
    root = repository.cache_root
    assert root is not None and copy.exists()
    repository.close()
    assert not root.exists()
    repository.close()  # idempotent
    with pytest.raises(OSError, match="closed"):
        repository.local_path("m")


def test_mount_directory_variable_places_the_copies(bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mount = tmp_path / "mount"
    monkeypatch.setenv("TRITON_AWS_MOUNT_DIRECTORY", str(mount))
    bucket.put("models/m/config.pbtxt", b"cfg")
    first, second = RemoteRepository(bucket.url()), RemoteRepository(bucket.url())
    copy = first.local_path("m")
    other = second.local_path("m")
    assert copy.is_relative_to(mount) and other.is_relative_to(mount)
    assert first.cache_root != second.cache_root  # two repositories never share a download area
    first.close()
    second.close()
    assert mount.is_dir() and list(mount.iterdir()) == []


def test_parallel_loads_of_different_models(bucket: Bucket, repository: RemoteRepository) -> None:
    names = [f"model_{i}" for i in range(6)]
    for name in names:
        bucket.put(f"models/{name}/config.pbtxt", name.encode())
        bucket.put(f"models/{name}/1/model.onnx", b"w" * 1000)
    barrier = threading.Barrier(len(names))

    def load(name: str) -> Path:
        barrier.wait()
        return repository.local_path(name)

    with ThreadPoolExecutor(len(names)) as pool:
        copies = list(pool.map(load, names))
    for name, copy in zip(names, copies):
        assert (copy / "config.pbtxt").read_bytes() == name.encode()
        assert (copy / "1" / "model.onnx").stat().st_size == 1000
