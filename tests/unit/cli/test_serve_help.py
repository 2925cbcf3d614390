"""`naiad serve --help` documents every flag: a description and its default."""

from __future__ import annotations

import argparse
import re

from naiad.cli.flags import ServeHelpFormatter
from naiad.cli.main import build_parser, subcommand
from naiad.cli.startup_report import changed_settings


def _serve() -> argparse.ArgumentParser:
    return subcommand(build_parser(), "serve")


def test_every_flag_has_a_description_and_a_default() -> None:
    formatter = ServeHelpFormatter("naiad serve")
    for action in _serve()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        text = formatter._get_help_string(action) or ""
        assert action.help and action.help.strip(), f"{action.option_strings[0]} has no description"
        if action.default is argparse.SUPPRESS:  # a tritonserver flag Naiad refuses, saying why
            assert text.startswith("refused: ")
            continue
        assert re.search(r"(?<![-\w])default(?![-\w])|\(required\)", text, re.IGNORECASE), (action.option_strings, text)


def test_changed_settings_lists_only_what_differs() -> None:
    serve = _serve()
    args = build_parser().parse_args(["serve", "--model-repository", "repo", "--exit-timeout-secs", "5",
                                      "--strict-readiness=false", "--http-port", "8000"])
    assert changed_settings(serve, args) == [
        ("--model-repository", "repo"), ("--strict-readiness", "false"), ("--exit-timeout-secs", "5")]


def test_a_refused_tritonserver_flag_says_why(capsys) -> None:
    import pytest

    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["serve", "--model-repository", "r", "--model-namespacing=true"])
    assert info.value.code == 2
    assert "--model-namespacing is not supported by Naiad: model names must be unique" in capsys.readouterr().err
    build_parser().parse_args(["serve", "--model-repository", "r", "--model-namespacing=false"])  # off: fine
