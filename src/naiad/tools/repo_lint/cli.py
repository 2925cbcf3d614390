"""`naiad repo lint PATH...` on the command line: one line per problem, exit status for CI."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_parser(commands: argparse._SubParsersAction) -> None:
    repo = commands.add_parser("repo", help="model repository tools (lint)")
    actions = repo.add_subparsers(dest="repo_command", required=True)
    lint = actions.add_parser(
        "lint", help="check a model repository and print every problem with file, line and field",
        description="Checks every model directory the way the server loads it (config.pbtxt syntax and fields, "
                    "names, backends, version directories and model files, labels, warm-up files, ensemble "
                    "steps) without starting a server. Exit status: 0 clean, 1 errors (or warnings with "
                    "--strict), 2 usage.")
    lint.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="model repository directory")
    lint.add_argument("--format", choices=["text", "json"], default="text")
    lint.add_argument("--strict", action="store_true", help="warnings fail too")
    lint.add_argument("--gpus", type=int, default=None,
                      help="GPUs the server will see (default: those visible here, via nvidia-smi)")


def _visible_gpus() -> int:
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU "))


def run(args: argparse.Namespace) -> int:
    from naiad.tools.repo_lint.checks import lint_repository

    gpus = _visible_gpus() if args.gpus is None else args.gpus
    problems = [p for path in args.paths for p in lint_repository(path, gpus)]
    errors = sum(p.severity == "error" for p in problems)
    warnings = len(problems) - errors
    if args.format == "json":
        json.dump({"problems": [p.to_json() for p in problems], "errors": errors, "warnings": warnings},
                  sys.stdout, indent=2)
        print()
    else:
        for problem in problems:
            print(problem.text())
        models = len({(p.path.split("/")[0], p.model) for p in problems if p.model})
        summary = (f"{errors} error(s), {warnings} warning(s) in {models} model(s)" if problems
                   else "no problems found")
        print(summary, file=sys.stderr)
    return 1 if errors or (args.strict and warnings) else 0
