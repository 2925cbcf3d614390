"""`naiad serve` from an S3 repository (moto's server on 127.0.0.1): serving, ensembles, POLL mode, cleanup."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")
pytest.importorskip("boto3")

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.moto_s3 import DUMMY_AWS, Bucket, moto_endpoint
from tests.support.onnx_models import add_sub_model, add_sub_onnx, ensemble_model
from tests.support.servers import start_server
from tests.support.waiting import wait_until

FP = [("A", "FP32", [16]), ("B", "FP32", [16])]


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_endpoint() as address:
        yield address


@pytest.fixture()
def child_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The environment `naiad serve` inherits: dummy AWS credentials only, copies under a mount directory."""
    for name, value in DUMMY_AWS.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "TRITON_CLOUD_CREDENTIAL_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    mount = tmp_path / "mount"
    mount.mkdir()
    monkeypatch.setenv("TRITON_AWS_MOUNT_DIRECTORY", str(mount))
    return mount


def _add_sub_inputs(client_module: Any, names: tuple[str, str]) -> tuple[list, np.ndarray, np.ndarray]:
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.ones((2, 16), dtype=np.float32)
    inputs = [client_module.InferInput(names[0], [2, 16], "FP32"), client_module.InferInput(names[1], [2, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


def _ready(client: httpclient.InferenceServerClient, name: str, version: str = "") -> bool:
    try:
        return bool(client.is_model_ready(name, version))
    except Exception:  # any client error means "not ready yet"
        return False


def test_serves_models_and_ensembles_from_s3(endpoint: str, child_env: Path, tmp_path: Path) -> None:
    local = tmp_path / "repo"
    add_sub_model(local, "add_sub")
    ensemble_model(
        local, "ens",
        steps=[("add_sub", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "SUM", "OUTPUT1": "DIFF"})],
        inputs=FP, outputs=[("SUM", "FP32", [16]), ("DIFF", "FP32", [16])],
    )
    assert not any((local / "ens" / "1").iterdir())  # the ensemble's version directory is empty
    bucket = Bucket(endpoint)
    bucket.upload(local, "models")
    server = start_server(bucket.url())
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            inputs, a, b = _add_sub_inputs(httpclient, ("INPUT0", "INPUT1"))
            result = client.infer("add_sub", inputs)
            np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)
            index = {(e["name"], e.get("version"), e.get("state")) for e in client.get_model_repository_index()}
            assert index == {("add_sub", "1", "READY"), ("ens", "1", "READY")}
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            inputs, a, b = _add_sub_inputs(grpcclient, ("A", "B"))
            result = client.infer("ens", inputs)
            np.testing.assert_allclose(result.as_numpy("SUM"), a + b)
            np.testing.assert_allclose(result.as_numpy("DIFF"), a - b)
        copies = [p for p in child_env.rglob("model.onnx")]
        assert copies, "the model was downloaded under TRITON_AWS_MOUNT_DIRECTORY"
    finally:
        assert server.stop() == 0
    assert list(child_env.iterdir()) == [], "the local copies are deleted when the server exits"


def test_poll_mode_picks_up_new_versions_and_models(endpoint: str, child_env: Path, tmp_path: Path) -> None:
    local = tmp_path / "repo"
    add_sub_model(local, "add_sub")
    bucket = Bucket(endpoint)
    bucket.upload(local, "models")
    with (
        start_server(bucket.url(), "--model-control-mode=poll", "--repository-poll-secs=1") as server,
        httpclient.InferenceServerClient(server.http_url) as client,
    ):
        assert client.is_model_ready("add_sub", "1")
        # A new version: the default policy (latest 1) serves version 2 and retires version 1.
        version_2 = tmp_path / "v2" / "model.onnx"
        add_sub_onnx(version_2)
        bucket.client.upload_file(str(version_2), bucket.name, "models/add_sub/2/model.onnx")
        wait_until(lambda: _ready(client, "add_sub", "2"), "add_sub version 2 to be served", timeout=60, interval=0.2)
        wait_until(lambda: not _ready(client, "add_sub", "1"), "add_sub version 1 to be retired", timeout=60, interval=0.2)
        inputs, a, b = _add_sub_inputs(httpclient, ("INPUT0", "INPUT1"))
        result = client.infer("add_sub", inputs, model_version="2")
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
        # A new model directory in the bucket is loaded without a restart.
        add_sub_model(tmp_path / "more", "add_sub_new")
        bucket.upload(tmp_path / "more" / "add_sub_new", "models/add_sub_new")
        wait_until(lambda: _ready(client, "add_sub_new"), "the new model add_sub_new to be served", timeout=60, interval=0.2)
        result = client.infer("add_sub_new", inputs)
        np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)
        # A changed config.pbtxt reloads the model.
        config = (local / "add_sub" / "config.pbtxt").read_text().replace("max_batch_size: 8", "max_batch_size: 4")
        bucket.client.put_object(Bucket=bucket.name, Key="models/add_sub/config.pbtxt", Body=config.encode())
        wait_until(lambda: client.get_model_config("add_sub").get("max_batch_size") == 4, "the new config to be served", timeout=60, interval=0.2)
        # A model removed from the bucket is unloaded.
        for key in bucket.keys("models/add_sub_new/"):
            bucket.client.delete_object(Bucket=bucket.name, Key=key)
        wait_until(lambda: not _ready(client, "add_sub_new"), "add_sub_new to be unloaded", timeout=60, interval=0.2)
        assert client.is_model_ready("add_sub", "2")
