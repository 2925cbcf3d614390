"""`naiad serve --idle-spin-us US`: how long the server polls for the next request once it is idle."""

from __future__ import annotations

import pytest

from naiad.cli.flags import MAX_IDLE_SPIN_US, config_from_args
from naiad.cli.main import build_parser
from naiad.config.server_config import ServerConfig
from naiad.core.idle_spin import SERVE_WINDOW_US


def _config(*flags: str) -> ServerConfig:
    return config_from_args(build_parser().parse_args(["serve", "--model-repository", "/models", *flags]))


def test_naiad_serve_polls_500_us_by_default_and_zero_turns_it_off() -> None:
    assert _config().idle_spin_us == 500 == SERVE_WINDOW_US
    assert ServerConfig().idle_spin_us == 0  # a server made in code does not poll unless told to
    assert _config("--idle-spin-us", "0").idle_spin_us == 0
    assert _config(f"--idle-spin-us={MAX_IDLE_SPIN_US}").idle_spin_us == MAX_IDLE_SPIN_US


@pytest.mark.parametrize("value", ["-1", str(MAX_IDLE_SPIN_US + 1), "soon", "1.5"])
def test_a_bad_duration_is_refused_with_the_flag_named(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _config(f"--idle-spin-us={value}")
    assert "--idle-spin-us" in capsys.readouterr().err
