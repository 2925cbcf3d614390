"""`naiad serve --frontend-core-connections K`: how many connections of each port the core keeps beside its workers."""

from __future__ import annotations

import pytest

from naiad.cli.flags import MAX_CORE_CONNECTIONS, config_from_args
from naiad.cli.main import build_parser
from naiad.config.server_config import ServerConfig


def _config(*flags: str) -> ServerConfig:
    return config_from_args(build_parser().parse_args(["serve", "--model-repository", "/models", *flags]))


def test_the_core_keeps_eight_connections_by_default_and_zero_hands_every_one_over() -> None:
    assert _config().frontend_core_connections == 8
    assert _config("--frontend-processes", "2", "--frontend-core-connections", "0").frontend_core_connections == 0
    assert _config(f"--frontend-core-connections={MAX_CORE_CONNECTIONS}").frontend_core_connections == MAX_CORE_CONNECTIONS


@pytest.mark.parametrize("value", ["-1", str(MAX_CORE_CONNECTIONS + 1), "few", "1.5"])
def test_a_bad_count_is_refused_with_the_flag_named(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _config(f"--frontend-core-connections={value}")
    assert "--frontend-core-connections" in capsys.readouterr().err
