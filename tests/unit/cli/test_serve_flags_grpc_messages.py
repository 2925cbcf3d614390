"""`naiad serve` gRPC message limits: --grpc-max-message-size and --grpc-max-decompressed-size reach ServerConfig
(and grpcio's channel options)."""

from __future__ import annotations

import pytest

from naiad.cli.flags import config_from_args
from naiad.cli.main import build_parser
from naiad.config.server_config import ServerConfig
from naiad.frontends.grpc.server import server_options


def _config(*flags: str) -> ServerConfig:
    return config_from_args(build_parser().parse_args(["serve", "--model-repository", "/models", *flags]))


def test_defaults_accept_what_triton_accepts_and_inflate_at_most_64_mib() -> None:
    config = _config()
    assert config.grpc_max_message_size == 2**31 - 1
    assert config.grpc_max_decompressed_size == 64 << 20


def test_flags_set_both_and_grpcio_receives_the_message_limit() -> None:
    config = _config("--grpc-max-message-size", "1048576", "--grpc-max-decompressed-size=4096")
    assert (config.grpc_max_message_size, config.grpc_max_decompressed_size) == (1 << 20, 4096)
    options = dict(server_options(0, config.grpc_max_message_size))
    assert options["grpc.max_receive_message_length"] == 1 << 20


@pytest.mark.parametrize("value", ["0", "-5", "big"])
def test_sizes_must_be_positive_byte_counts(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _config(f"--grpc-max-decompressed-size={value}")
    assert "--grpc-max-decompressed-size" in capsys.readouterr().err
