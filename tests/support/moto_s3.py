"""A real S3 endpoint on loopback for tests: moto's server, and buckets with upload helpers."""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DUMMY_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@contextlib.contextmanager
def moto_endpoint() -> Iterator[str]:
    """`host:port` of a moto S3 server on 127.0.0.1, stopped on exit."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"{host}:{port}"
    finally:
        server.stop()


class Bucket:
    """A fresh bucket on the moto endpoint: single objects, or local trees uploaded like `aws s3 sync`."""

    def __init__(self, endpoint: str) -> None:
        import boto3

        self.endpoint = endpoint
        self.name = f"naiad-{uuid.uuid4().hex[:12]}"
        self.client: Any = boto3.client(
            "s3", endpoint_url=f"http://{endpoint}", aws_access_key_id="testing",
            aws_secret_access_key="testing", region_name="us-east-1",
        )
        self.client.create_bucket(Bucket=self.name)

    def url(self, prefix: str = "models") -> str:
        return f"s3://{self.endpoint}/{self.name}/{prefix}"

    def put(self, key: str, body: bytes = b"") -> None:
        self.client.put_object(Bucket=self.name, Key=key, Body=body)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.name, Key=key)

    def keys(self, prefix: str) -> list[str]:
        listing = self.client.list_objects_v2(Bucket=self.name, Prefix=prefix)
        return [item["Key"] for item in listing.get("Contents", [])]

    def upload(self, local: Path, prefix: str) -> None:
        """Every file under `local`, plus a zero-byte marker for each empty folder."""
        for root, dirs, files in os.walk(local):
            relative = Path(root).relative_to(local).as_posix()
            key_prefix = prefix if relative == "." else f"{prefix}/{relative}"
            if not dirs and not files:
                self.put(f"{key_prefix}/")
            for name in files:
                self.client.upload_file(str(Path(root) / name), self.name, f"{key_prefix}/{name}")
