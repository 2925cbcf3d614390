"""Request JSON parsing (strict JSON plus Triton's NaN/Infinity literals) and bounded value previews."""

from __future__ import annotations

import math
import sys

import pytest

from naiad.protocol.errors import ErrorCode, NaiadError
from naiad.protocol.request_json import json_preview, load_request_json


def test_strict_json_and_non_finite_literals() -> None:
    assert load_request_json(b'{"a": [1, 2.5, 18446744073709551615]}') == {"a": [1, 2.5, 18446744073709551615]}
    values = load_request_json(memoryview(b"[NaN, -NaN, Inf, -Inf, Infinity, -Infinity, 1]"))
    assert math.isnan(values[0]) and math.isnan(values[1])
    assert values[2:] == [math.inf, -math.inf, math.inf, -math.inf, 1]


@pytest.mark.parametrize("body,fragment", [
    (b"[1,", "failed to parse the request JSON buffer"),
    (b"[NaN,", "failed to parse the request JSON buffer"),
    (b"[nan]", "failed to parse the request JSON buffer"),
    (b"[" * 100_000 + b"]" * 100_000, "depth limit exceeded"),
    (b"[" * 100_000 + b"NaN" + b"]" * 100_000, "nested too deeply"),
])
def test_malformed_or_too_deep_is_invalid_arg(body: bytes, fragment: str) -> None:
    with pytest.raises(NaiadError) as info:
        load_request_json(body)
    assert info.value.code is ErrorCode.INVALID_ARG and fragment in info.value.message


def test_non_finite_body_past_the_recursion_limit_is_invalid_arg() -> None:
    # python-rapidjson bounds its nesting by the interpreter's recursion limit, which other code in the
    # process (a test framework, a library) may have raised: go past whatever it is now.
    depth = sys.getrecursionlimit() + 1_000
    with pytest.raises(NaiadError) as info:
        load_request_json(b"[" * depth + b"Infinity" + b"]" * depth)
    assert info.value.code is ErrorCode.INVALID_ARG and "nested too deeply" in info.value.message


def test_preview_is_bounded_and_never_recurses() -> None:
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert json_preview(deep) == "<a list nested too deeply to show>"
    assert json_preview(["a", 1, True, None]) == '["a",1,true,null]'
    assert json_preview(2**70) == str(2**70)
    long = json_preview("x" * 10_000)
    assert len(long) == 120 and long.endswith("...")
