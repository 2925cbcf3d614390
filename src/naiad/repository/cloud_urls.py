"""Repository URLs on object storage: Triton's s3:// gs:// as:// forms (and fsspec's az://) parsed into a location."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Triton's endpoint form: s3://[http://|https://]host:port/bucket/path (the scheme is optional, then http).
_S3_ENDPOINT = re.compile(r"^s3://(?:(?P<scheme>https?)://)?(?P<host>[0-9A-Za-z.\-]+):(?P<port>[0-9]+)/(?P<rest>.*)$")
# With an explicit scheme the port may be left out: s3://https://minio.example.com/bucket/path.
_S3_SCHEME_ONLY = re.compile(r"^s3://(?P<scheme>https?)://(?P<host>[0-9A-Za-z.\-]+)/(?P<rest>.*)$")


@dataclass(frozen=True)
class CloudLocation:
    """Where a repository lives: the fsspec protocol, the path inside it, and connection details from the URL."""

    url: str  # as the user wrote it (used in messages and for credential-file prefix matching)
    scheme: str  # the user's scheme: s3, gs, as, az, or another fsspec protocol
    protocol: str  # the fsspec protocol to open: s3, gcs, abfs, or the scheme itself
    path: str  # "bucket/prefix" (for Azure "container/prefix"), no slashes at either end
    endpoint_url: str | None = None  # S3 endpoint override from the URL
    account: str | None = None  # Azure storage account from an as:// URL

    @property
    def bucket(self) -> str:
        return self.path.split("/", 1)[0]


def parse_cloud_url(url: str) -> CloudLocation:
    """Split a repository URL; raises ValueError naming the expected form when it does not fit."""
    scheme, sep, rest = url.partition("://")
    if not sep or not scheme:
        raise ValueError(f"'{url}' is not a URL (expected scheme://...)")
    scheme = scheme.lower()
    if scheme == "s3":
        return _parse_s3(url)
    if scheme in ("gs", "gcs"):
        return CloudLocation(url, scheme, "gcs", _bucket_path(url, rest, "gs://bucket/path"))
    if scheme == "as":
        account, _, inner = rest.rstrip("/").partition("/")
        if not account or not inner:
            raise ValueError(f"invalid Azure repository '{url}' (expected as://account/container/path)")
        return CloudLocation(url, scheme, "abfs", _bucket_path(url, inner, "as://account/container/path"), account=account)
    if scheme in ("az", "abfs"):
        return CloudLocation(url, scheme, "abfs", _bucket_path(url, rest, f"{scheme}://container/path"))
    return CloudLocation(url, scheme, scheme, rest.rstrip("/"))


def _parse_s3(url: str) -> CloudLocation:
    match = _S3_ENDPOINT.match(url) or _S3_SCHEME_ONLY.match(url)
    if match is None:
        return CloudLocation(url, "s3", "s3", _bucket_path(url, url[len("s3://"):], "s3://bucket/path"))
    parts = match.groupdict()
    http = parts.get("scheme") or "http"
    host = parts["host"] + (f":{parts['port']}" if parts.get("port") else "")
    path = _bucket_path(url, parts["rest"], "s3://host:port/bucket/path")
    return CloudLocation(url, "s3", "s3", path, endpoint_url=f"{http}://{host}")


def _bucket_path(url: str, rest: str, form: str) -> str:
    path = rest.rstrip("/")
    parts = path.split("/")
    if not path or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid model repository '{url}' (expected {form})")
    return path
