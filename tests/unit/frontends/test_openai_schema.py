"""OpenAI request bodies: accepted fields, defaults, and 400s for what the server does not implement."""

from __future__ import annotations

import pytest

from naiad.frontends.openai.schema import DEFAULT_MAX_TOKENS, RequestError, parse_chat, parse_completion


def test_completion_maps_sampling_fields():
    req = parse_completion({"model": "m", "prompt": "hi", "max_tokens": 5, "temperature": 0, "top_p": 0.5, "seed": 3,
                            "stop": ["x"], "n": 2, "ignore_eos": True, "stream": True,
                            "stream_options": {"include_usage": True}, "logprobs": None, "suffix": None})
    assert req.sampling == {"max_tokens": 5, "temperature": 0, "top_p": 0.5, "seed": 3, "stop": ["x"], "ignore_eos": True}
    assert req.n == 2 and req.stream and req.include_usage and req.prompt == "hi"


def test_defaults():
    req = parse_completion({"model": "m", "prompt": ["one"]})
    assert req.sampling == {"max_tokens": DEFAULT_MAX_TOKENS} and req.prompt == "one" and not req.stream
    chat = parse_chat({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}],
                       "max_completion_tokens": 7})
    assert chat.messages == [{"role": "user", "content": "a"}] and chat.sampling["max_tokens"] == 7


@pytest.mark.parametrize("body, message", [
    ({"model": "m", "prompt": "x", "suffix": "y"}, "'suffix' is not supported"),
    ({"model": "m", "prompt": "x", "logit_bias": {"1": 2}}, "'logit_bias' is not supported"),
    ({"model": "m", "prompt": "x", "frobnicate": 1}, "unsupported field 'frobnicate'"),
    ({"model": "m", "prompt": ["a", "b"]}, "single non-empty string"),
    ({"model": "m", "prompt": ""}, "single non-empty string"),
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
