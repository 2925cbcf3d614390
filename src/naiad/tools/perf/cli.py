"""`naiad perf` on the command line: flags -> PerfOptions -> run; exit status 0, or 2 with one error line."""

from __future__ import annotations

import argparse

from naiad.tools.perf.options import add_perf_flags, options_from_args


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "perf", help="measure throughput and latency of a model (perf_analyzer's flags; --llm for GenAI-Perf)",
        description="Load a model on any KServe v2 server and report throughput and latency per load level. "
                    "With --llm the GenAI-Perf flags apply (see `naiad genai-perf --help`).")
    add_perf_flags(parser)


def run(args: argparse.Namespace) -> int:
    from naiad.tools.errors import run_tool

    def body() -> int:
        from naiad.tools.perf.profiler import run_perf

        run_perf(options_from_args(args))
        return 0

    return run_tool("perf", body)
