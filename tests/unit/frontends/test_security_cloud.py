"""Unit tests of the cloud frontends' pieces and of the deployment flags / platform environment parsing."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from naiad.cli.deploy_flags import (
    add_deploy_flags,
    default_repositories,
    deploy_settings,
    vertex_defaults,
)
from naiad.frontends.cloud_common import header_length_from_mime
from naiad.frontends.sagemaker import (
    BINARY_MIME,
    KEEP_FILE,
    out_of_memory,
    plan_archive,
    read_model_directory,
)
from naiad.frontends.vertex import redirect_method
from naiad.protocol.errors import NaiadError


def test_binary_mime_gives_the_json_header_size():
    assert header_length_from_mime(BINARY_MIME + "120", BINARY_MIME, 500) == 120
    assert header_length_from_mime(BINARY_MIME + "0", BINARY_MIME, 500) == 0
    assert header_length_from_mime("application/json", BINARY_MIME, 500) is None
    assert header_length_from_mime(None, BINARY_MIME, 500) is None


@pytest.mark.parametrize("mime,message", [
    ("text/plain;" + BINARY_MIME + "1", "expect MIME type for binary data starts with"),
    (BINARY_MIME + "501", "inference header size should be in range"),
    (BINARY_MIME + "abc", "inference header size should be in range"),
])
def test_bad_binary_mime(mime, message):
    with pytest.raises(NaiadError, match=message):
        header_length_from_mime(mime, BINARY_MIME, 500)


def test_out_of_memory_messages():
    assert out_of_memory("onnxruntime: Failed to allocate memory for requested buffer")
    assert not out_of_memory("unexpected shape for input 'INPUT0'")


@pytest.mark.parametrize("target,method", [
    ("v2/models/m/infer", "POST"), ("v2/models/m/versions/2/infer", "POST"), ("v2/models/m", "GET"),
    ("v2/models/m/ready", "GET"), ("v2/models/m/config", "GET"), ("v2/models/stats", "GET"),
    ("v2", "GET"), ("v2/health/ready", "GET"), ("v2/systemsharedmemory/status", "GET"),
    ("v2/systemsharedmemory/region/r/register", "POST"), ("v2/repository/index", "POST"),
    ("v2/repository/models/m/load", "POST"), ("v2/logging", None), ("v2/trace/setting", None),
    ("v2/models/m/generate", None), ("../etc/passwd", None),
])
def test_vertex_redirect_targets(target, method):
    assert redirect_method(target) == method


def _model_dir(path, config: str | None = 'backend: "onnxruntime"'):
    (path / "1").mkdir(parents=True)
    (path / "1" / "model.onnx").write_bytes(b"onnx")
    if config is not None:
        (path / "config.pbtxt").write_text(config)
    return path


def test_archive_with_config_at_the_root_is_the_model(tmp_path):
    _model_dir(tmp_path / "model")
    assert plan_archive(str(tmp_path / "model")) == (tmp_path / "model", [])


def test_archive_with_one_model_directory(tmp_path):
    _model_dir(tmp_path / "model" / "resnet")
    assert plan_archive(str(tmp_path / "model")) == (tmp_path / "model" / "resnet", [])


def test_archive_with_an_ensemble_loads_its_steps_first(tmp_path):
    root = tmp_path / "model"
    _model_dir(root / "pre")
    _model_dir(root / "net")
    (root / "ens" / "1").mkdir(parents=True)
    (root / "ens" / "config.pbtxt").write_text('platform:  "ensemble"\n')
    assert plan_archive(str(root)) == (root / "ens", [root / "net", root / "pre"])


def test_archive_with_several_models_and_no_ensemble_is_refused(tmp_path):
    _model_dir(tmp_path / "a")
    _model_dir(tmp_path / "b")
    with pytest.raises(NaiadError, match="expected exactly one ensemble"):
        plan_archive(str(tmp_path))


@pytest.mark.parametrize("url", ["/proc/self", "/sys", "/dev/shm/../shm", "/opt/../proc/1"])
def test_archive_urls_in_system_directories_are_refused(url):
    with pytest.raises(NaiadError, match="cannot start with /dev/, /proc/, or /sys/"):
        plan_archive(url)


def test_model_directory_becomes_config_and_file_overrides(tmp_path):
    model = _model_dir(tmp_path / "m", 'name: "old"\nbackend: "onnxruntime"\nmax_batch_size: 4')
    (model / "labels.txt").write_text("a\nb\n")
    config, files = read_model_directory(model, "target")
    assert json.loads(config) == {"name": "target", "backend": "onnxruntime", "maxBatchSize": 4}
    assert files == {"file:1/model.onnx": b"onnx", "file:labels.txt": b"a\nb\n"}


def test_empty_version_directory_is_kept_and_missing_config_is_generated(tmp_path):
    (tmp_path / "ens" / "1").mkdir(parents=True)
    (tmp_path / "ens" / "1" / "..keep").mkdir()  # a nested empty dir is not a version directory
    (tmp_path / "ens" / "2").mkdir()
    (tmp_path / "ens" / "2" / "model.onnx").write_bytes(b"x")
    config, files = read_model_directory(tmp_path / "ens", "e")
    assert json.loads(config) == {"name": "e"}
    assert files == {"file:2/model.onnx": b"x"}
    (tmp_path / "ens" / "3").mkdir()
    _, files = read_model_directory(tmp_path / "ens", "e")
    assert files[f"file:3/{KEEP_FILE}"] == b""


# ---------------------------------------------------------------- flags and the platforms' environment


def _parse(argv: list[str], env: dict[str, str]) -> dict:
    parser = argparse.ArgumentParser()
    add_deploy_flags(parser, env)
    return deploy_settings(parser.parse_args(argv), env)


def test_defaults_without_any_platform():
    settings = _parse([], {})
    assert settings["allow_sagemaker"] is False and settings["allow_vertex_ai"] is False
    assert settings["sagemaker_port"] == 8080 and settings["vertex_ai_port"] == 8080
    assert settings["sagemaker_ping_mode"] == "ready" and settings["sagemaker_inference_type"] == "infer"
    assert vertex_defaults({}) == {} and default_repositories({}) == []


def test_sagemaker_environment_is_read_at_the_edge():
    env = {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "resnet", "SAGEMAKER_BIND_TO_PORT": "9090",
           "SAGEMAKER_TRITON_PING_MODE": "live", "SAGEMAKER_TRITON_INFERENCE_TYPE": "generate"}
    settings = _parse(["--allow-sagemaker=true"], env)
    assert settings["allow_sagemaker"] is True and settings["sagemaker_port"] == 9090
    assert settings["sagemaker_default_model"] == "resnet"
    assert (settings["sagemaker_ping_mode"], settings["sagemaker_inference_type"]) == ("live", "generate")
    assert _parse(["--sagemaker-port=7000"], env)["sagemaker_port"] == 7000


def test_vertex_environment_turns_vertex_on_and_names_routes_port_and_storage():
    env = {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": "7080", "AIP_HEALTH_ROUTE": "health",
           "AIP_PREDICT_ROUTE": "/predict", "AIP_STORAGE_URI": "gs://bucket/models"}
    settings = _parse([], env)
    assert settings["allow_vertex_ai"] is True and settings["vertex_ai_port"] == 7080
    assert settings["vertex_ai_health_route"] == "/health" and settings["vertex_ai_predict_route"] == "/predict"
    assert vertex_defaults(env) == {"allow_http": False, "allow_grpc": False}
    assert default_repositories(env) == ["gs://bucket/models"]
    assert _parse(["--allow-vertex-ai=false"], env)["allow_vertex_ai"] is False


@pytest.mark.parametrize("argv,env,message", [
    (["--allow-vertex-ai"], {}, "AIP_PREDICT_ROUTE is not defined"),
    ([], {"SAGEMAKER_TRITON_PING_MODE": "sometimes"}, "SAGEMAKER_TRITON_PING_MODE must be"),
    ([], {"SAGEMAKER_TRITON_INFERENCE_TYPE": "train"}, "SAGEMAKER_TRITON_INFERENCE_TYPE must be"),
    (["--grpc-use-ssl-mutual=true", "--grpc-server-cert=c", "--grpc-server-key=k"], {}, "needs --grpc-root-cert"),
    (["--http-ssl-ca-certs=ca.pem"], {}, "need --http-ssl-certfile"),
    (["--http-header-forward-pattern=("], {}, "invalid header forward pattern"),
    (["--grpc-restricted-protocol=nope:k=v"], {}, "unknown restricted API 'nope'"),
])
def test_inconsistent_settings_stop_the_start(argv, env, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        _parse(argv, env)


def test_bad_platform_port_is_reported():
    with pytest.raises(SystemExit, match="AIP_HTTP_PORT='eighty' is not a port number"):
        _parse([], {"AIP_HTTP_PORT": "eighty"})


def test_mutual_tls_implies_tls():
    settings = _parse(["--grpc-use-ssl-mutual", "--grpc-server-cert=c", "--grpc-server-key=k", "--grpc-root-cert=r"], {})
    assert settings["grpc_use_ssl"] is True and settings["grpc_use_ssl_mutual"] is True

