"""OpenAI request bodies -> (prompt source, sampling parameters); refuses fields this server does not implement."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from naiad.protocol.request_json import json_preview

# Legacy completions default to 16 tokens (OpenAI's and vLLM's CompletionRequest); chat completions have no
# default: they generate until EOS or the context limit, which `"max_tokens": null` asks of the backend
# (vLLM's SamplingParams(max_tokens=None)).
DEFAULT_MAX_TOKENS = 16


class RequestError(Exception):
    """A 400 with a message naming the field."""


# Accepted with any value / only with a value meaning "off" (anything else is refused).
_COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop", "seed",
           "frequency_penalty", "presence_penalty", "user",
           # vLLM's extra sampling fields
           "ignore_eos", "top_k", "min_tokens", "repetition_penalty", "stop_token_ids", "include_stop_str_in_output",
           "skip_special_tokens"}
_COMPLETION = _COMMON | {"prompt", "echo"}
_CHAT = _COMMON | {"messages", "max_completion_tokens", "parallel_tool_calls", "add_generation_prompt"}
_OFF_VALUES = {
    "logprobs": (None, False, 0), "top_logprobs": (None, 0), "best_of": (None, 1), "suffix": (None, ""),
    "logit_bias": (None,), "tools": (None,), "tool_choice": (None, "none"), "response_format": (None,),
    "functions": (None,), "function_call": (None, "none"), "service_tier": (None, "auto", "default"),
    "store": (None, False), "metadata": (None,), "modalities": (None,), "audio": (None,), "prediction": (None,),
    "reasoning_effort": (None,), "web_search_options": (None,),
}
_SAMPLING_KEYS = {"temperature", "top_p", "seed", "stop", "frequency_penalty", "presence_penalty", "ignore_eos",
                  "top_k", "min_tokens", "repetition_penalty", "stop_token_ids", "include_stop_str_in_output",
                  "skip_special_tokens"}


@dataclass
class GenerationRequest:
    model: str
    n: int
    stream: bool
    include_usage: bool
    sampling: dict[str, Any]
    prompts: list[str | list[int]] = field(default_factory=list)  # completions: texts or token ids
    messages: list[dict[str, Any]] = field(default_factory=list)  # chat
    echo: bool = False
    add_generation_prompt: bool = True


def _check_fields(body: dict[str, Any], allowed: set[str]) -> None:
    for key, value in body.items():
        if key in allowed:
            continue
        if key in _OFF_VALUES:
            if value in _OFF_VALUES[key] or value == {} or value == [] or (key == "response_format" and value == {"type": "text"}):
                continue
            raise RequestError(f"'{key}' is not supported by this server")
        raise RequestError(f"unsupported field '{key}'")


def _int(body: dict[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise RequestError(f"'{key}' must be an integer {bound}, got {json_preview(value)}")
    return value


def _common(body: dict[str, Any]) -> tuple[str, int, bool, bool, dict[str, Any]]:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("'model' is required (a model name from /v1/models)")
    n = _int(body, "n", 1, 16) or 1
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise RequestError("'stream' must be a boolean")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}):
        raise RequestError("'stream_options' accepts only {\"include_usage\": bool}")
    if options is not None and not stream:
        raise RequestError("'stream_options' is only allowed with 'stream': true")
    include_usage = bool((options or {}).get("include_usage", False))
    sampling = {k: v for k, v in body.items() if k in _SAMPLING_KEYS and v is not None}
    return model, n, stream, include_usage, sampling


def parse_completion(body: Any) -> GenerationRequest:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    _check_fields(body, _COMPLETION)
    model, n, stream, include_usage, sampling = _common(body)
    prompts = _prompts(body.get("prompt"))
    # vLLM: max_tokens defaults to 16; an explicit null generates until EOS or the context limit.
    sampling["max_tokens"] = _int(body, "max_tokens", 1) if "max_tokens" in body else DEFAULT_MAX_TOKENS
    echo = body.get("echo") or False
    if not isinstance(echo, bool):
        raise RequestError("'echo' must be a boolean")
    return GenerationRequest(model, n, stream, include_usage, sampling, prompts=prompts, echo=echo)


def _is_ids(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value))


def _prompts(prompt: Any) -> list[str | list[int]]:
    """The API's four prompt forms: a string, a list of strings, token ids, a list of token-id lists."""
    if isinstance(prompt, str) and prompt:
        return [prompt]
    if _is_ids(prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) and p for p in prompt):
        return list(prompt)
    if isinstance(prompt, list) and prompt and all(_is_ids(p) for p in prompt):
        return list(prompt)
    raise RequestError("'prompt' must be a non-empty string, a list of non-empty strings, a list of token ids "
                       "(non-negative integers) or a list of such lists")


def parse_chat(body: Any) -> GenerationRequest:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    _check_fields(body, _CHAT)
    model, n, stream, include_usage, sampling = _common(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list")
    cleaned = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{index}] must be an object with a 'role'")
        content = message.get("content")
        if isinstance(content, list):  # content parts: text only
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise RequestError(f"messages[{index}]: only text content parts are supported")
                texts.append(part["text"])
            content = "".join(texts)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise RequestError(f"messages[{index}].content must be a string or a list of text parts")
        if message.get("tool_calls"):
            raise RequestError("tool calls are not supported by this server")
        cleaned.append({"role": message["role"], "content": content})
    # No default: None asks for generation until EOS or the context limit (OpenAI, vLLM).
    sampling["max_tokens"] = _int(body, "max_completion_tokens", 1) or _int(body, "max_tokens", 1)
    add = body.get("add_generation_prompt", True)
    return GenerationRequest(model, n, stream, include_usage, sampling, messages=cleaned,
                             add_generation_prompt=bool(add))
