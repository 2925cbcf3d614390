"""Entry point of the `naiad` command."""

from __future__ import annotations

import argparse

from naiad import __version__
from naiad.cli.flags import add_serve_flags, config_from_args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="naiad", description="Naiad inference server (Triton-compatible)")
    parser.add_argument("--version", action="version", version=f"naiad {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model repository over HTTP and gRPC")
    add_serve_flags(serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from naiad.cli.serve import run_serve

        return run_serve(config_from_args(args))
    return 2
