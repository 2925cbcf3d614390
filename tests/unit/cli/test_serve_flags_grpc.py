"""`naiad serve` gRPC limits: the per-connection stream cap and the incomplete-request timeout reach ServerConfig."""

from __future__ import annotations

import pytest

from naiad.cli.flags import config_from_args
from naiad.cli.main import build_parser
from naiad.config.server_config import ServerConfig


def _config(*flags: str) -> ServerConfig:
    return config_from_args(build_parser().parse_args(["serve", "--model-repository", "/models", *flags]))


def test_defaults_bound_streams_and_wait_30_seconds_for_a_request() -> None:
    config = _config()
    assert config.grpc_max_concurrent_streams == 1000
    assert config.grpc_incomplete_request_timeout_secs == 30.0


def test_flags_set_both() -> None:
    config = _config("--grpc-max-concurrent-streams=0", "--grpc-incomplete-request-timeout-secs", "2.5")
    assert config.grpc_max_concurrent_streams == 0  # no limit, as grpc-core
    assert config.grpc_incomplete_request_timeout_secs == 2.5


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan"])
def test_the_timeout_must_be_a_positive_number(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _config(f"--grpc-incomplete-request-timeout-secs={value}")
    assert "--grpc-incomplete-request-timeout-secs" in capsys.readouterr().err


def test_the_own_server_serves_grpc_by_default_and_grpcio_stays_selectable(capsys: pytest.CaptureFixture[str]) -> None:
    assert _config().grpc_server_impl == "naiad"
    assert _config("--grpc-server-impl", "grpcio").grpc_server_impl == "grpcio"
    # frontend worker processes serve gRPC with the own server too, unless grpcio is asked for; by default
    # there are none (0: every port in the server process)
    assert _config().frontend_processes == 0 and _config("--frontend-processes", "1").frontend_processes == 1
    assert _config("--frontend-processes", "2").grpc_server_impl == "naiad"
    assert _config("--frontend-processes", "2", "--grpc-server-impl", "grpcio").grpc_server_impl == "grpcio"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "Naiad's own HTTP/2 server (default;" in help_text
    assert "or grpcio's grpc.aio" in help_text
