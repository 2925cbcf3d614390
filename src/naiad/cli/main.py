"""Entry point of the `naiad` command."""

from __future__ import annotations

import argparse

from naiad import __version__
from naiad.cli.flags import (
    ServeHelpFormatter,
    add_serve_flags,
    config_from_args,
    ignored_flag_warnings,
    missing_repository,
)
from naiad.cli.startup_report import changed_settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="naiad", description="Naiad inference server (Triton-compatible)")
    parser.add_argument("--version", action="version", version=f"naiad {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model repository over HTTP and gRPC",
                                usage="naiad serve --model-repository PATH [options]",
                                description="Serve a Triton model repository over HTTP/REST, gRPC and Prometheus "
                                "metrics. Flags keep tritonserver's names.",
                                formatter_class=ServeHelpFormatter)
    add_serve_flags(serve)
    add_tool_parsers(commands)
    return parser


def add_tool_parsers(commands: argparse._SubParsersAction) -> None:
    """The tools (naiad.tools): only their flag definitions load here; each tool loads when its command runs."""
    from naiad.tools.analyze.cli import add_parser as add_analyze
    from naiad.tools.llm.cli import add_parser as add_genai_perf
    from naiad.tools.navigate.cli import add_parser as add_navigate
    from naiad.tools.perf.cli import add_parser as add_perf
    from naiad.tools.repo_lint.cli import add_parser as add_repo

    add_perf(commands)
    add_genai_perf(commands)
    add_analyze(commands)
    add_navigate(commands)
    add_repo(commands)


def subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of `naiad <name>`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise KeyError(name)


def _tool_argv(argv: list[str]) -> list[str]:
    """`naiad perf --llm ...` is `naiad genai-perf ...`."""
    if argv[:1] == ["perf"] and "--llm" in argv:
        return ["genai-perf"] + [a for a in argv[1:] if a != "--llm"]
    return argv


def main(argv: list[str] | None = None) -> int:
    import sys

    parser = build_parser()
    args = parser.parse_args(_tool_argv(list(sys.argv[1:] if argv is None else argv)))
    if args.command == "serve":
        from naiad.cli.serve import run_serve

        serve = subcommand(parser, "serve")
        if missing_repository(args):
            serve.error("--model-repository is required: the directory that holds your model directories "
                        "(e.g. --model-repository examples/models)")
        return run_serve(config_from_args(args), changed_settings(serve, args), ignored_flag_warnings(args))
    if args.command == "perf":
        from naiad.tools.perf.cli import run as run_perf

        return run_perf(args)
    if args.command == "genai-perf":
        from naiad.tools.llm.cli import run as run_genai_perf

        return run_genai_perf(args)
    if args.command == "analyze":
        from naiad.tools.analyze.cli import run as run_analyze

        return run_analyze(args)
    if args.command == "navigate":
        from naiad.tools.navigate.cli import run as run_navigate

        return run_navigate(args)
    if args.command == "repo":
        from naiad.tools.repo_lint.cli import run as run_repo_lint

        return run_repo_lint(args)
    return 2
