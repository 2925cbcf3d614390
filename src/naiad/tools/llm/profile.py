"""`naiad genai-perf` (also `naiad perf --llm`): the benchmark run and its exit status."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TextIO

from naiad.tools.errors import ToolError, run_tool
from naiad.tools.llm.client import LlmClient, RequestRecord, decode_records, run_load
from naiad.tools.llm.endpoints import EndpointSpec
from naiad.tools.llm.metrics import LlmMetrics, compute_metrics
from naiad.tools.llm.options import LlmOptions, options_from_args
from naiad.tools.llm.prompts import Prompt, file_prompts, synthetic_prompts
from naiad.tools.llm.report import export, print_table
from naiad.tools.llm.tokenizer import Tokenizer, load_tokenizer
from naiad.tools.v2client import HttpControl, ServerError, split_url


class AllRequestsFailed(ToolError):
    """Every request of the run failed: there is nothing to measure."""


async def _benchmark(options: LlmOptions, client: LlmClient) -> list[RequestRecord]:
    try:
        if options.warmup_request_count > 0:
            await run_load(client, options.concurrency, 0.0, options.warmup_request_count, 600.0)
        return await run_load(client, options.concurrency, options.request_rate, options.request_count,
                              options.measurement_interval_ms / 1000.0, options.random_seed,
                              options.request_distribution == "poisson")
    finally:
        client.close()


def _run_loop(main: Coroutine[Any, Any, list[RequestRecord]]) -> list[RequestRecord]:
    """uvloop when installed: less client time per streamed event, so arrivals are timestamped sooner."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def _generate_endpoint(options: LlmOptions) -> EndpointSpec:
    """The generate endpoint for this model, refusing `--streaming` where it would measure a single response."""
    control = HttpControl(options.url, timeout=10.0)
    try:
        config = control.config(options.model)
    except (ServerError, OSError):
        config = None  # not a Triton-style server (or the config is hidden): the run itself reports errors
    finally:
        control.close()
    inputs = {entry.get("name") for entry in (config or {}).get("input", [])}
    if options.streaming and config is not None:
        decoupled = bool((config.get("model_transaction_policy") or {}).get("decoupled", False))
        if not decoupled:
            raise ToolError(
                f"--streaming: model '{options.model}' is not decoupled, so it answers each request with one "
                "response: time to first token would equal the request latency and inter-token latency would be 0. "
                "Measure it without --streaming (request latency and throughput only)")
    return EndpointSpec("generate", options.model, options.streaming, options.input_name, options.output_name,
                        options.extra_inputs, exclude_input="exclude_input_in_output" in inputs
                        and "exclude_input_in_output" not in options.extra_inputs)


def _prompts(options: LlmOptions, tokenizer: Tokenizer) -> list[Prompt]:
    if options.input_file:
        return file_prompts(Path(options.input_file), options.output_tokens_mean, options.output_tokens_stddev,
                            options.random_seed, tokenizer)
    return synthetic_prompts(max(1, options.num_dataset_entries), options.input_tokens_mean,
                             options.input_tokens_stddev, options.output_tokens_mean, options.output_tokens_stddev,
                             options.random_seed, tokenizer)


def _not_streamed(records: list[RequestRecord], tokenizer: Tokenizer) -> bool:
    """Streaming was asked, yet every successful answer arrived as one event of several tokens."""
    good = [r for r in records if not r.error]
    return bool(good) and all(len(r.texts) == 1 and tokenizer.count(r.text) > 1 for r in good)


def run_profile(options: LlmOptions, out: TextIO | None = None, err: TextIO | None = None) -> LlmMetrics:
    out, err = out or sys.stdout, err or sys.stderr
    if options.streaming and options.endpoint_type not in ("generate", "completions", "chat"):
        raise ToolError(f"--streaming is not available for --endpoint-type {options.endpoint_type}")
    tokenizer, notice = load_tokenizer(options.tokenizer)
    if notice:
        print(f"naiad genai-perf: note: {notice}", file=err)
    prompts = _prompts(options, tokenizer)
    if options.endpoint_type == "generate":
        endpoint = _generate_endpoint(options)
    else:
        endpoint = EndpointSpec(options.endpoint_type, options.model, options.streaming, extra_inputs=options.extra_inputs)
    host, port = split_url(options.url, 8000)
    client = LlmClient(host, port, endpoint, prompts, options.headers)
    records = _run_loop(_benchmark(options, client))
    decode_records(records, endpoint)
    metrics = compute_metrics(records, prompts, options.streaming, tokenizer.count)
    if metrics.request_count == 0:
        raise AllRequestsFailed(f"all {metrics.error_count} requests failed, nothing was measured; "
                                f"first error: {metrics.first_error or 'no request was sent'}")
    load = (f"request rate {options.request_rate:g}/s" if options.request_rate > 0
            else f"concurrency {options.concurrency}")
    print_table(metrics, f"NAIAD GenAI-Perf results: {options.model} ({endpoint.path()}, {load})", out)
    if options.streaming and _not_streamed(records, tokenizer):
        print("naiad genai-perf: warning: the server sent each answer as one event although --streaming was given: "
              "time to first token equals request latency", file=err)
    settings = {k: v for k, v in vars(options).items() if k != "headers"}
    settings["tokenizer_used"] = tokenizer.name
    paths = export(options.resolved_artifact_dir(), metrics, prompts, records, settings)
    print(f"Results written to {paths['json']} and {paths['csv']}", file=out)
    return metrics


def _run(args: argparse.Namespace) -> int:
    metrics = run_profile(options_from_args(args))
    if metrics.error_count:
        print(f"naiad genai-perf: warning: {metrics.error_count} of {metrics.error_count + metrics.request_count} "
              f"requests failed and are not in the statistics; first error: {metrics.first_error}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    return run_tool("genai-perf", lambda: _run(args))
