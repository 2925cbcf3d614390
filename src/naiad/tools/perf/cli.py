"""`naiad perf` on the command line: flags -> PerfOptions -> run, exit status 0/1."""

from __future__ import annotations

import argparse
import sys

from naiad.tools.perf.options import add_perf_flags, options_from_args


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "perf", help="measure throughput and latency of a model (perf_analyzer's flags; --llm for GenAI-Perf)",
        description="Load a model on any KServe v2 server and report throughput and latency per load level. "
                    "With --llm the GenAI-Perf flags apply (see `naiad genai-perf --help`).")
    add_perf_flags(parser)


def run(args: argparse.Namespace) -> int:
    from naiad.tools.perf.profiler import PerfError, run_perf

    try:
        run_perf(options_from_args(args))
    except PerfError as exc:
        print(f"naiad perf: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("naiad perf: interrupted", file=sys.stderr)
        return 130
    return 0
