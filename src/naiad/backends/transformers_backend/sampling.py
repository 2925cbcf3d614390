"""Sampling parameters (vLLM's names) parsed from a request, and the per-sequence token choice."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

DEFAULT_MAX_TOKENS = 16  # vLLM's SamplingParams default

# Fields vLLM accepts that this engine does not implement: refused with a clear message.
UNSUPPORTED = {
    "best_of", "use_beam_search", "length_penalty", "early_stopping", "logprobs", "prompt_logprobs",
    "lora_name", "guided_decoding", "structured_outputs", "logits_processors", "bad_words", "min_p",
    "truncate_prompt_tokens", "allowed_token_ids", "guided_json", "guided_regex", "guided_choice",
}


class SamplingError(ValueError):
    """A sampling parameter has a wrong type or value; the message names it."""


@dataclass
class SamplingParams:
    max_tokens: int | None = DEFAULT_MAX_TOKENS  # None: until EOS or the context limit (vLLM's meaning)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    n: int = 1

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


def _number(key: str, value: Any, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, str):
            try:
                return kind(float(value)) if kind is float else kind(value)
            except ValueError:
                pass
        raise SamplingError(f"sampling parameter '{key}' must be a number, got {value!r}")
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise SamplingError(f"sampling parameter '{key}' must be an integer, got {value!r}")
    return kind(value)


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise SamplingError(f"sampling parameter '{key}' must be a boolean, got {value!r}")


def parse_sampling(values: dict[str, Any], strict: bool) -> SamplingParams:
    """Build SamplingParams; unknown keys are refused when `strict` (the sampling_parameters input)
    and ignored otherwise (request parameters also carry unrelated keys)."""
    params = SamplingParams()
    for key, value in values.items():
        if key in UNSUPPORTED:
            if value in (None, False, 0, "", [], {}):
                continue
            raise SamplingError(f"sampling parameter '{key}' is not supported by the transformers backend")
        if value is None:
            if key == "max_tokens":  # an explicit null: no limit but the context (vLLM's SamplingParams)
                params.max_tokens = None
            continue
        if key in ("max_tokens", "top_k", "min_tokens", "n"):
            setattr(params, key, _number(key, value, int))
        elif key in ("temperature", "top_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
            setattr(params, key, _number(key, value, float))
        elif key == "seed":
            params.seed = _number(key, value, int)
        elif key in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            setattr(params, key, _flag(key, value))
        elif key == "stop":
            stops = [value] if isinstance(value, str) else value
            if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
                raise SamplingError("sampling parameter 'stop' must be a string or a list of strings")
            params.stop = [s for s in stops if s]
        elif key == "stop_token_ids":
            if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
                raise SamplingError("sampling parameter 'stop_token_ids' must be a list of integers")
            params.stop_token_ids = list(value)
        elif strict:
            raise SamplingError(f"unknown sampling parameter '{key}'")
    _check(params)
    return params


def _check(p: SamplingParams) -> None:
    if p.max_tokens is not None and p.max_tokens < 1:
        raise SamplingError(f"max_tokens must be at least 1, got {p.max_tokens}")
    if p.temperature < 0:
        raise SamplingError(f"temperature must be non-negative, got {p.temperature}")
    if not 0 < p.top_p <= 1:
        raise SamplingError(f"top_p must be in (0, 1], got {p.top_p}")
    if p.top_k < -1:
        raise SamplingError(f"top_k must be -1 (disable) or at least 1, got {p.top_k}")
    if p.n != 1:
        raise SamplingError("n must be 1 for the transformers backend (send n requests instead)")
    if p.repetition_penalty <= 0:
        raise SamplingError(f"repetition_penalty must be positive, got {p.repetition_penalty}")
    if not -2 <= p.presence_penalty <= 2 or not -2 <= p.frequency_penalty <= 2:
        raise SamplingError("presence_penalty and frequency_penalty must be in [-2, 2]")
    if p.min_tokens < 0 or (p.max_tokens is not None and p.min_tokens > p.max_tokens):
        raise SamplingError("min_tokens must be between 0 and max_tokens")


def choose_token(logits: torch.Tensor, params: SamplingParams, history: list[int], generated: list[int],
                 generator: torch.Generator | None, blocked: list[int]) -> int:
    """The next token from one row of float32 logits (vocab,)."""
    if params.repetition_penalty != 1.0 and history:
        ids = torch.tensor(sorted(set(history)), dtype=torch.long)
        picked = logits[ids]
        logits[ids] = torch.where(picked > 0, picked / params.repetition_penalty, picked * params.repetition_penalty)
    if (params.presence_penalty or params.frequency_penalty) and generated:
        ids, counts = torch.tensor(generated, dtype=torch.long).unique(return_counts=True)
        logits[ids] -= params.presence_penalty + params.frequency_penalty * counts.to(logits.dtype)
    if blocked:
        logits[blocked] = float("-inf")
    if params.greedy:
        return int(torch.argmax(logits))
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.numel():
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        drop = cumulative - sorted_probs > params.top_p
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))
