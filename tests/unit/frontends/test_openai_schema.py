"""OpenAI request bodies: accepted fields, defaults, and 400s for what the server does not implement."""

from __future__ import annotations

import pytest

from naiad.frontends.openai.schema import (
    DEFAULT_MAX_TOKENS,
    RequestError,
    parse_chat,
    parse_completion,
)


def test_completion_maps_sampling_fields():
    req = parse_completion({"model": "m", "prompt": "hi", "max_tokens": 5, "temperature": 0, "top_p": 0.5, "seed": 3,
                            "stop": ["x"], "n": 2, "ignore_eos": True, "stream": True,
                            "stream_options": {"include_usage": True}, "logprobs": None, "suffix": None})
    assert req.sampling == {"max_tokens": 5, "temperature": 0, "top_p": 0.5, "seed": 3, "stop": ["x"], "ignore_eos": True}
    assert req.n == 2 and req.stream and req.include_usage and req.prompts == ["hi"]


def test_defaults():
    req = parse_completion({"model": "m", "prompt": ["one"]})
    assert req.sampling == {"max_tokens": DEFAULT_MAX_TOKENS} and req.prompts == ["one"] and not req.stream
    chat = parse_chat({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}],
                       "max_completion_tokens": 7})
    assert chat.messages == [{"role": "user", "content": "a"}] and chat.sampling["max_tokens"] == 7


def test_max_tokens_defaults_follow_openai_and_vllm():
    """Chat has no default (None: until EOS or the context limit); completions default to 16, and an explicit
    null there means no limit too."""
    chat = parse_chat({"model": "m", "messages": [{"role": "user", "content": "a"}]})
    assert "max_tokens" in chat.sampling and chat.sampling["max_tokens"] is None
    assert parse_chat({"model": "m", "messages": [{"role": "user", "content": "a"}], "max_tokens": 3}
                      ).sampling["max_tokens"] == 3
    assert parse_completion({"model": "m", "prompt": "x"}).sampling["max_tokens"] == 16
    assert parse_completion({"model": "m", "prompt": "x", "max_tokens": None}).sampling["max_tokens"] is None


@pytest.mark.parametrize("prompt, prompts", [
    ("a", ["a"]), (["a", "b"], ["a", "b"]), ([1, 2, 3], [[1, 2, 3]]), ([[1, 2], [3]], [[1, 2], [3]]),
])
def test_every_prompt_form_of_the_api(prompt, prompts):
    assert parse_completion({"model": "m", "prompt": prompt}).prompts == prompts


@pytest.mark.parametrize("body, message", [
    ({"model": "m", "prompt": "x", "suffix": "y"}, "'suffix' is not supported"),
    ({"model": "m", "prompt": "x", "logit_bias": {"1": 2}}, "'logit_bias' is not supported"),
    ({"model": "m", "prompt": "x", "frobnicate": 1}, "unsupported field 'frobnicate'"),
    ({"model": "m", "prompt": ["a", 1]}, "'prompt' must be"),
    ({"model": "m", "prompt": ""}, "'prompt' must be"),
    ({"model": "m", "prompt": []}, "'prompt' must be"),
    ({"model": "m", "prompt": [[]]}, "'prompt' must be"),
    ({"model": "m", "prompt": [1, -2]}, "'prompt' must be"),
    ({"model": "m", "prompt": [True]}, "'prompt' must be"),
    ({"prompt": "x"}, "'model' is required"),
    ({"model": "m", "prompt": "x", "n": 0}, "'n' must be an integer"),
    ({"model": "m", "prompt": "x", "max_tokens": -1}, "'max_tokens'"),
    ({"model": "m", "prompt": "x", "stream_options": {"include_usage": True}}, "only allowed with 'stream': true"),
])
def test_completion_errors(body, message):
    with pytest.raises(RequestError, match=message):
        parse_completion(body)


@pytest.mark.parametrize("body, message", [
    ({"model": "m", "messages": []}, "non-empty list"),
    ({"model": "m", "messages": [{"content": "x"}]}, "'role'"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "'tools'"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}},
     "'response_format'"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "only text"),
])
def test_chat_errors(body, message):
    with pytest.raises(RequestError, match=message):
        parse_chat(body)
