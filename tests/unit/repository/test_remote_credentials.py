"""Credential selection: TRITON_CLOUD_CREDENTIAL_PATH with the longest matching prefix, else the environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from naiad.repository import remote
from naiad.repository.cloud_urls import parse_cloud_url
from naiad.repository.credentials import storage_options
from naiad.repository.remote import MissingFilesystemError, RemoteRepository

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "env-key",
    "AWS_SECRET_ACCESS_KEY": "env-secret",
    "AWS_SESSION_TOKEN": "env-token",
    "AWS_DEFAULT_REGION": "eu-west-3",
}


def _credential_file(tmp_path: Path, document: object) -> dict[str, str]:
    path = tmp_path / "credentials.json"
    path.write_text(json.dumps(document))
    return {"TRITON_CLOUD_CREDENTIAL_PATH": str(path)}


def _options(url: str, environ: dict[str, str]) -> dict:
    return storage_options(parse_cloud_url(url), environ)


def test_s3_from_environment() -> None:
    assert _options("s3://bucket/models", AWS_ENV) == {
        "key": "env-key", "secret": "env-secret", "token": "env-token", "client_kwargs": {"region_name": "eu-west-3"},
    }


def test_s3_without_credentials_leaves_the_default_chain_and_keeps_the_endpoint() -> None:
    assert _options("s3://bucket/models", {}) == {}
    assert _options("s3://127.0.0.1:9000/bucket", {"AWS_PROFILE": "dev"}) == {
        "profile": "dev", "endpoint_url": "http://127.0.0.1:9000",
    }


def test_longest_prefix_of_the_credential_file_wins(tmp_path: Path) -> None:
    environ = {**AWS_ENV, **_credential_file(tmp_path, {"s3": {
        "": {"key_id": "default-key", "secret_key": "default-secret"},
        "s3://bucket-a": {"key_id": "a-key", "secret_key": "a-secret", "region": "us-west-2"},
        "s3://bucket-a/special": {"key_id": "special-key", "secret_key": "special-secret", "session_token": "tok"},
    }})}
    assert _options("s3://bucket-a/special/models", environ) == {"key": "special-key", "secret": "special-secret", "token": "tok"}
    assert _options("s3://bucket-a/models", environ) == {
        "key": "a-key", "secret": "a-secret", "client_kwargs": {"region_name": "us-west-2"},
    }
    assert _options("s3://bucket-b/models", environ) == {"key": "default-key", "secret": "default-secret"}


def test_credential_file_keys_match_the_url_as_written(tmp_path: Path) -> None:
    environ = _credential_file(tmp_path, {"s3": {"s3://127.0.0.1:9000/bucket": {"key_id": "k", "secret_key": "s", "profile": "p"}}})
    assert _options("s3://127.0.0.1:9000/bucket/models", environ) == {
        "key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9000",
    }


def test_no_matching_entry_falls_back_to_the_environment(tmp_path: Path) -> None:
    environ = {**AWS_ENV, **_credential_file(tmp_path, {"s3": {"s3://other": {"key_id": "o", "secret_key": "o"}}})}
    assert _options("s3://bucket/models", environ)["key"] == "env-key"


def test_profile_from_the_credential_file(tmp_path: Path) -> None:
    environ = {**AWS_ENV, **_credential_file(tmp_path, {"s3": {"": {"profile": "ci", "region": "ap-south-1"}}})}
    assert _options("s3://bucket", environ) == {"profile": "ci", "client_kwargs": {"region_name": "ap-south-1"}}


def test_gcs_key_file_from_credential_file_or_environment(tmp_path: Path) -> None:
    environ = {"GOOGLE_APPLICATION_CREDENTIALS": "/env/key.json",
               **_credential_file(tmp_path, {"gs": {"": "/default/key.json", "gs://special": "/special/key.json"}})}
    assert _options("gs://special/models", environ) == {"token": "/special/key.json"}
    assert _options("gs://bucket/models", environ) == {"token": "/default/key.json"}
    assert _options("gs://bucket/models", {"GOOGLE_APPLICATION_CREDENTIALS": "/env/key.json"}) == {"token": "/env/key.json"}
    assert _options("gs://bucket/models", {}) == {}


def test_azure_account_from_url_and_key_from_environment() -> None:
    assert _options("as://acct/container/models", {"AZURE_STORAGE_ACCOUNT": "other", "AZURE_STORAGE_KEY": "k"}) == {
        "account_name": "acct", "account_key": "k",
    }
    assert _options("az://container/models", {"AZURE_STORAGE_ACCOUNT": "envacct", "AZURE_STORAGE_KEY": "k"}) == {
        "account_name": "envacct", "account_key": "k",
    }


def test_azure_from_credential_file(tmp_path: Path) -> None:
    environ = {"AZURE_STORAGE_KEY": "env", **_credential_file(tmp_path, {"as": {"": {"account_str": "fileacct", "account_key": "filekey"}}})}
    assert _options("az://container/models", environ) == {"account_name": "fileacct", "account_key": "filekey"}
    assert _options("as://urlacct/container/models", environ) == {"account_name": "urlacct", "account_key": "filekey"}


def test_azure_without_account_is_refused() -> None:
    with pytest.raises(ValueError, match="AZURE_STORAGE_ACCOUNT"):
        _options("az://container/models", {})


def test_azure_managed_identity() -> None:
    identity = pytest.importorskip("azure.identity.aio")
    options = _options("as://acct/c/m", {"AZURE_STORAGE_AUTH_TYPE": "managed_identity", "AZURE_STORAGE_CLIENT_ID": "cid"})
    assert options["account_name"] == "acct"
    assert isinstance(options["credential"], identity.ManagedIdentityCredential)


@pytest.mark.parametrize(("content", "message"), [(None, "cannot read"), ("{not json", "not valid JSON"), ("[1]", "JSON object")])
def test_unusable_credential_file(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "creds.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=message):
        _options("s3://bucket", {"TRITON_CLOUD_CREDENTIAL_PATH": str(path)})


def test_each_repository_gets_its_own_s3_filesystem() -> None:
    pytest.importorskip("s3fs")
    first = RemoteRepository("s3://127.0.0.1:9/bucket/models", environ=AWS_ENV)
    second = RemoteRepository("s3://127.0.0.1:9/bucket/models", environ={**AWS_ENV, "AWS_ACCESS_KEY_ID": "other"})
    assert first._fs is not second._fs
    assert (first._fs.key, first._fs.secret, first._fs.token) == ("env-key", "env-secret", "env-token")
    assert first._fs.endpoint_url == "http://127.0.0.1:9"
    assert second._fs.key == "other"
    assert first.root == "s3://127.0.0.1:9/bucket/models"


def test_azure_filesystem_for_the_url_account() -> None:
    pytest.importorskip("adlfs")
    repository = RemoteRepository("as://acct/container/models", environ={"AZURE_STORAGE_KEY": "a2V5"})
    assert repository._fs.account_name == "acct"
    assert repository._base == "container/models"


@pytest.mark.parametrize(("url", "package", "extra"), [
    ("s3://bucket/models", "s3fs", "s3"), ("gs://bucket/models", "gcsfs", "gcs"), ("as://a/c/models", "adlfs", "azure"),
])
def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch, url: str, package: str, extra: str) -> None:
    real_find_spec = remote.importlib.util.find_spec
    monkeypatch.setattr(remote.importlib.util, "find_spec", lambda name: None if name == package else real_find_spec(name))
    with pytest.raises(MissingFilesystemError, match=rf"pip install 'naiad\[{extra}\]'"):
        RemoteRepository(url, environ={})
