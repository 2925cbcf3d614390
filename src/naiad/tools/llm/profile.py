"""`naiad genai-perf` (also `naiad perf --llm`): the benchmark run and its exit status."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TextIO

from naiad.tools.llm.client import LlmClient, run_load
from naiad.tools.llm.endpoints import EndpointSpec
from naiad.tools.llm.metrics import LlmMetrics, compute_metrics
from naiad.tools.llm.options import LlmOptions, options_from_args
from naiad.tools.llm.prompts import file_prompts, synthetic_prompts, token_counter
from naiad.tools.llm.report import export, print_table
from naiad.tools.v2client import split_url


async def _benchmark(options: LlmOptions, client: LlmClient) -> list:
    try:
        if options.warmup_request_count > 0:
            await run_load(client, options.concurrency, 0.0, options.warmup_request_count, 600.0)
        return await run_load(client, options.concurrency, options.request_rate, options.request_count,
                              options.measurement_interval_ms / 1000.0, options.random_seed,
                              options.request_distribution == "poisson")
    finally:
        client.close()


def run_profile(options: LlmOptions, out: TextIO | None = None) -> LlmMetrics:
    out = out or sys.stdout
    count = token_counter(options.tokenizer)
    if options.input_file:
        prompts = file_prompts(Path(options.input_file), options.output_tokens_mean, options.output_tokens_stddev,
                               options.random_seed, count)
    else:
        prompts = synthetic_prompts(max(1, options.num_dataset_entries), options.input_tokens_mean,
                                    options.input_tokens_stddev, options.output_tokens_mean,
                                    options.output_tokens_stddev, options.random_seed, count)
    endpoint = EndpointSpec(options.endpoint_type, options.model, options.streaming, options.input_name,
                            options.output_name, options.extra_inputs)
    host, port = split_url(options.url, 8000)
    client = LlmClient(host, port, endpoint, prompts, options.headers)
    records = asyncio.run(_benchmark(options, client))
    metrics = compute_metrics(records, prompts, options.streaming, count)
    load = (f"request rate {options.request_rate:g}/s" if options.request_rate > 0
            else f"concurrency {options.concurrency}")
    print_table(metrics, f"NAIAD GenAI-Perf results: {options.model} ({endpoint.path()}, {load})", out)
    settings = {k: v for k, v in vars(options).items() if k != "headers"}
    paths = export(options.resolved_artifact_dir(), metrics, prompts, records, settings)
    print(f"Results written to {paths['json']} and {paths['csv']}", file=out)
    return metrics


def run(args: argparse.Namespace) -> int:
    try:
        metrics = run_profile(options_from_args(args))
    except (ValueError, OSError) as exc:
        print(f"naiad genai-perf: error: {exc}", file=sys.stderr)
        return 1
    if metrics.request_count == 0:
        print(f"naiad genai-perf: error: no request succeeded ({metrics.first_error or 'none sent'})", file=sys.stderr)
        return 1
    return 0
