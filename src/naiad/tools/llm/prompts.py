"""Synthetic prompts with a token-length distribution, and the token counter used for ISL/OSL."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# A plain vocabulary: one approximate token per word, so prompt lengths come out as asked.
WORDS = (
    "the of and to in is was for on are with as by at from that this be or an it not which have has had were "
    "model server request response token latency throughput batch queue memory compute input output tensor "
    "river lake stream water cloud rain stone tree forest mountain valley field garden city street house "
    "window door table chair paper book letter number answer question reason method result value system "
    "small large quick slow bright dark early late simple complex open close near far high low warm cold "
    "run walk read write build test measure compare report choose move turn send keep hold bring carry find "
    "time day night week year morning evening season moment hour minute second history future present "
    "red green blue yellow white black orange purple silver golden"
).split()

TOKEN_PATTERN = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def approximate_token_count(text: str) -> int:
    """Words and punctuation marks: close to what BPE tokenizers give for plain English text."""
    return len(TOKEN_PATTERN.findall(text))


def token_counter(tokenizer: str) -> Callable[[str], int]:
    """The approximate counter, or a Hugging Face tokenizer from a local directory when transformers is installed."""
    if not tokenizer:
        return approximate_token_count
    if not Path(tokenizer).is_dir():
        raise ValueError(f"--tokenizer must be a local tokenizer directory (no downloads): {tokenizer}")
    try:
        from transformers import AutoTokenizer  # optional
    except ImportError:
        raise ValueError("--tokenizer needs the 'transformers' package; without it tokens are approximated") from None
    loaded = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    return lambda text: len(loaded.encode(text, add_special_tokens=False))


@dataclass
class Prompt:
    text: str
    input_tokens: int
    max_tokens: int | None  # requested output length, None = the server's default


def _lengths(rng: np.random.Generator, mean: float, stddev: float, count: int) -> list[int]:
    values = rng.normal(mean, stddev, size=count) if stddev > 0 else np.full(count, mean)
    return [max(1, int(round(v))) for v in values]


def synthetic_prompts(count: int, input_mean: float, input_stddev: float, output_mean: float, output_stddev: float,
                      seed: int, counter: Callable[[str], int] = approximate_token_count) -> list[Prompt]:
    """`count` prompts whose lengths follow N(input_mean, input_stddev); output lengths likewise when asked."""
    rng = np.random.default_rng(seed)
    inputs = _lengths(rng, input_mean, input_stddev, count)
    outputs: list[int | None] = _lengths(rng, output_mean, output_stddev, count) if output_mean > 0 else [None] * count
    prompts = []
    for n_in, n_out in zip(inputs, outputs):
        words = rng.choice(len(WORDS), size=n_in)
        text = " ".join(WORDS[i] for i in words)
        prompts.append(Prompt(text, counter(text), n_out))
    return prompts


def file_prompts(path: Path, output_mean: float, output_stddev: float, seed: int,
                 counter: Callable[[str], int] = approximate_token_count) -> list[Prompt]:
    """JSON lines with a "text" (or "prompt") field, one prompt each."""
    rng = np.random.default_rng(seed)
    texts = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            raise ValueError(f"{path}:{number}: not a JSON object") from None
        text = doc.get("text", doc.get("prompt")) if isinstance(doc, dict) else None
        if not isinstance(text, str):
            raise ValueError(f"{path}:{number}: expected a \"text\" string")
        texts.append(text)
    if not texts:
        raise ValueError(f"{path}: no prompts")
    outputs: list[int | None] = (_lengths(rng, output_mean, output_stddev, len(texts)) if output_mean > 0
                                 else [None] * len(texts))
    return [Prompt(t, counter(t), n) for t, n in zip(texts, outputs)]
