"""Repository URL forms: Triton's s3 endpoint forms, gs://, as://account/container, fsspec's az://."""

from __future__ import annotations

import pytest

from naiad.repository.cloud_urls import parse_cloud_url


@pytest.mark.parametrize(
    ("url", "path", "endpoint"),
    [
        ("s3://bucket/path/to/models", "bucket/path/to/models", None),
        ("s3://bucket", "bucket", None),
        ("s3://bucket/models/", "bucket/models", None),
        ("s3://127.0.0.1:9000/bucket/models", "bucket/models", "http://127.0.0.1:9000"),
        ("s3://minio.local:9000/bucket", "bucket", "http://minio.local:9000"),
        ("s3://http://127.0.0.1:9000/bucket/models", "bucket/models", "http://127.0.0.1:9000"),
        ("s3://https://s3.example.com:443/bucket/a/b", "bucket/a/b", "https://s3.example.com:443"),
        ("s3://https://s3.example.com/bucket/a", "bucket/a", "https://s3.example.com"),
    ],
)
def test_s3_forms(url: str, path: str, endpoint: str | None) -> None:
    location = parse_cloud_url(url)
    assert (location.scheme, location.protocol, location.path, location.endpoint_url) == ("s3", "s3", path, endpoint)
    assert location.bucket == path.split("/")[0]
    assert location.url == url


def test_gs_maps_to_gcsfs() -> None:
    location = parse_cloud_url("gs://my-bucket/repo/models")
    assert (location.scheme, location.protocol, location.path, location.account) == ("gs", "gcs", "my-bucket/repo/models", None)


def test_as_names_the_account_and_the_container() -> None:
    location = parse_cloud_url("as://myaccount/mycontainer/models")
    assert (location.protocol, location.account, location.path, location.bucket) == ("abfs", "myaccount", "mycontainer/models", "mycontainer")


def test_az_is_fsspec_form_without_account() -> None:
    location = parse_cloud_url("az://mycontainer/models")
    assert (location.scheme, location.protocol, location.account, location.path) == ("az", "abfs", None, "mycontainer/models")


def test_other_fsspec_protocols_pass_through() -> None:
    location = parse_cloud_url("memory://somewhere/models/")
    assert (location.protocol, location.path) == ("memory", "somewhere/models")


@pytest.mark.parametrize(
    "url",
    ["s3://", "s3:///models", "s3://bucket/../other", "s3://127.0.0.1:9000/", "gs://", "as://account", "as://account/", "az://", "nothing"],
)
def test_malformed_urls_name_the_expected_form(url: str) -> None:
    with pytest.raises(ValueError, match="expected"):
        parse_cloud_url(url)
