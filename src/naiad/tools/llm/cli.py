"""`naiad genai-perf` / `naiad perf --llm` on the command line (flags only; the run loads on use)."""

from __future__ import annotations

import argparse

from naiad.tools.llm.options import add_llm_flags


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "genai-perf", help="benchmark an LLM endpoint: TTFT, inter-token latency, token throughput",
        description="GenAI-Perf for v2 generate_stream and OpenAI-style endpoints (also `naiad perf --llm`).")
    add_llm_flags(parser)


def run(args: argparse.Namespace) -> int:
    from naiad.tools.llm.profile import run as run_profile_command

    return run_profile_command(args)
