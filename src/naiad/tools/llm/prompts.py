"""Synthetic prompts whose lengths are counted in the tokenizer's tokens, and prompts from a file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from naiad.tools.llm.tokenizer import ApproximateTokenizer, Tokenizer

# A plain vocabulary the prompts are drawn from; they are then cut to the asked number of tokens.
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


@dataclass
class Prompt:
    text: str
    input_tokens: int
    max_tokens: int | None  # requested output length, None = the server's default


def _lengths(rng: np.random.Generator, mean: float, stddev: float, count: int) -> list[int]:
    values = rng.normal(mean, stddev, size=count) if stddev > 0 else np.full(count, mean)
    return [max(1, int(round(v))) for v in values]


def _words(rng: np.random.Generator, count: int) -> str:
    return " ".join(WORDS[i] for i in rng.choice(len(WORDS), size=count))


def synthetic_prompt(rng: np.random.Generator, tokens: int, tokenizer: Tokenizer) -> str:
    """Random words cut to exactly `tokens` tokens of `tokenizer` (a word is at least one token)."""
    text = _words(rng, tokens)
    while tokenizer.count(text) < tokens:  # only for tokenizers that merge words; bounded by doubling
        text += " " + _words(rng, tokens)
    return tokenizer.fit(text, tokens)


def synthetic_prompts(count: int, input_mean: float, input_stddev: float, output_mean: float, output_stddev: float,
                      seed: int, tokenizer: Tokenizer | None = None) -> list[Prompt]:
    """`count` prompts whose token lengths follow N(input_mean, input_stddev); output lengths likewise when asked."""
    tokenizer = tokenizer or ApproximateTokenizer()
    rng = np.random.default_rng(seed)
    inputs = _lengths(rng, input_mean, input_stddev, count)
    outputs: list[int | None] = _lengths(rng, output_mean, output_stddev, count) if output_mean > 0 else [None] * count
    prompts = []
    for n_in, n_out in zip(inputs, outputs):
        text = synthetic_prompt(rng, n_in, tokenizer)
        prompts.append(Prompt(text, tokenizer.count(text), n_out))
    return prompts


def file_prompts(path: Path, output_mean: float, output_stddev: float, seed: int,
                 tokenizer: Tokenizer | None = None) -> list[Prompt]:
    """JSON lines with a "text" (or "prompt") field, one prompt each."""
    tokenizer = tokenizer or ApproximateTokenizer()
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
    return [Prompt(t, tokenizer.count(t), n) for t, n in zip(texts, outputs)]
