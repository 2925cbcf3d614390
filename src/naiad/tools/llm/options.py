"""GenAI-Perf's flags and the options object `naiad genai-perf` runs from."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class LlmOptions:
    model: str
    endpoint_type: str = "generate"
    url: str = "127.0.0.1:8000"
    streaming: bool = False
    concurrency: int = 1
    request_rate: float = 0.0
    request_distribution: str = "constant"
    request_count: int = 0
    warmup_request_count: int = 0
    measurement_interval_ms: float = 10000.0
    input_tokens_mean: float = 550.0
    input_tokens_stddev: float = 0.0
    output_tokens_mean: float = -1.0
    output_tokens_stddev: float = 0.0
    num_dataset_entries: int = 100
    input_file: str = ""
    extra_inputs: dict[str, Any] = field(default_factory=dict)
    input_name: str = "text_input"
    output_name: str = "text_output"
    headers: dict[str, str] = field(default_factory=dict)
    tokenizer: str = ""
    artifact_dir: str = ""
    random_seed: int = 0

    def resolved_artifact_dir(self) -> Path:
        if self.artifact_dir:
            return Path(self.artifact_dir)
        load = f"request_rate{self.request_rate:g}" if self.request_rate > 0 else f"concurrency{self.concurrency}"
        return Path("artifacts") / f"{self.model}-triton-{self.endpoint_type}-{load}"


def _extra_input(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"--extra-inputs expects name:value, got '{text}'")
    for cast in (int, float):
        try:
            return name, cast(value)
        except ValueError:
            pass
    if value.lower() in ("true", "false"):
        return name, value.lower() == "true"
    return name, value


def add_llm_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("mode", nargs="?", choices=["profile"], default="profile", help="only 'profile'")
    add("-m", "--model", required=True)
    add("--endpoint-type", choices=["generate", "completions", "chat"], default="generate",
        help="generate: /v2/models/<m>/generate[_stream]; completions/chat: the OpenAI endpoints")
    add("--service-kind", choices=["triton", "openai"], default="triton",
        help="accepted for compatibility; the endpoint type decides the path")
    add("--backend", default="", help="accepted for compatibility (tensorrtllm, vllm)")
    add("-u", "--url", default="127.0.0.1:8000")
    add("--streaming", action="store_true", help="stream tokens (needed for time to first token / inter-token latency)")
    add("--concurrency", type=int, default=1)
    add("--request-rate", type=float, default=0.0)
    add("--request-distribution", choices=["constant", "poisson"], default="constant")
    add("--request-count", type=int, default=0, help="requests to send (default: run for --measurement-interval)")
    add("--warmup-request-count", type=int, default=0)
    add("-p", "--measurement-interval", type=float, default=10000.0, metavar="MS")
    add("-s", "--stability-percentage", type=float, default=999.0, help="accepted for compatibility")
    add("--synthetic-input-tokens-mean", "--isl", type=float, default=550.0)
    add("--synthetic-input-tokens-stddev", type=float, default=0.0)
    add("--output-tokens-mean", "--osl", type=float, default=-1.0)
    add("--output-tokens-stddev", type=float, default=0.0)
    add("--output-tokens-mean-deterministic", action="store_true", help="accepted (max_tokens is always sent)")
    add("--num-dataset-entries", "--num-prompts", type=int, default=100)
    add("--input-file", default="", help="JSON lines with a \"text\" field")
    add("--extra-inputs", action="append", type=_extra_input, default=[], metavar="NAME:VALUE")
    add("--input-name", default="text_input", help="(generate) the input the prompt goes to")
    add("--output-name", default="text_output", help="(generate) the output holding generated text")
    add("-H", "--header", dest="headers", action="append", default=[], metavar="'Name: value'")
    add("--tokenizer", default="",
        help="Hugging Face tokenizer (local directory or model id; needs transformers) that sizes prompts and "
             "counts tokens; default: hf-internal-testing/llama-tokenizer when cached, else an approximation")
    add("--artifact-dir", default="")
    add("--random-seed", type=int, default=0)


def options_from_args(args: argparse.Namespace) -> LlmOptions:
    headers = {}
    for item in args.headers:
        name, _, value = item.partition(":")
        headers[name.strip()] = value.strip()
    return LlmOptions(
        model=args.model, endpoint_type=args.endpoint_type, url=args.url, streaming=args.streaming,
        concurrency=args.concurrency, request_rate=args.request_rate, request_distribution=args.request_distribution,
        request_count=args.request_count, warmup_request_count=args.warmup_request_count,
        measurement_interval_ms=args.measurement_interval, input_tokens_mean=args.synthetic_input_tokens_mean,
        input_tokens_stddev=args.synthetic_input_tokens_stddev, output_tokens_mean=args.output_tokens_mean,
        output_tokens_stddev=args.output_tokens_stddev, num_dataset_entries=args.num_dataset_entries,
        input_file=args.input_file, extra_inputs=dict(args.extra_inputs), input_name=args.input_name,
        output_name=args.output_name, headers=headers, tokenizer=args.tokenizer, artifact_dir=args.artifact_dir,
        random_seed=args.random_seed,
    )
