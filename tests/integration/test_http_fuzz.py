"""Property-based fuzzing of the HTTP/1.1 request parsing on the real server: random and mutated
request bytes get a 2xx-4xx answer (or 501 for an unsupported transfer coding) or a closed
connection, never another 5xx, never a traceback in the server's log, and the server keeps serving."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.onnx_models import add_sub_model, identity_model
from tests.support.servers import RunningServer, raw_exchange, start_server

_JSON_INFER = json.dumps({"inputs": [
    {"name": "INPUT0", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4]},
    {"name": "INPUT1", "datatype": "INT32", "shape": [1, 4], "data": [5, 6, 7, 8]},
]}).encode()
_HEADER = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2],
                                  "parameters": {"binary_data_size": 8}}]}).encode()
_BINARY = _HEADER + np.array([1.5, -2], dtype="<f4").tobytes()


def _request(method: bytes, path: bytes, headers: list[bytes], body: bytes = b"") -> bytes:
    return method + b" " + path + b" HTTP/1.1\r\nHost: fuzz\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body


def _chunked(body: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:7], body[7:])) + b"0\r\n\r\n"


# Well-formed requests the mutations start from: every way a body can be framed and encoded.
SEEDS = [
    _request(b"GET", b"/v2/health/ready", []),
    _request(b"GET", b"/v2/models/add_sub/config", [b"Connection: keep-alive"]),
    _request(b"POST", b"/v2/models/add_sub/infer", [b"Content-Length: %d" % len(_JSON_INFER)], _JSON_INFER),
    _request(b"POST", b"/v2/models/add_sub/infer", [b"Transfer-Encoding: chunked"], _chunked(_JSON_INFER)),
    _request(b"POST", b"/v2/models/identity_fp32/infer",
             [b"Inference-Header-Content-Length: %d" % len(_HEADER), b"Content-Length: %d" % len(_BINARY)], _BINARY),
    _request(b"POST", b"/v2/models/add_sub/infer",
             [b"Content-Encoding: gzip", b"Content-Length: %d" % len(gzip.compress(_JSON_INFER))], gzip.compress(_JSON_INFER)),
    _request(b"POST", b"/v2/models/add_sub/infer",
             [b"Expect: 100-continue", b"Content-Length: %d" % len(_JSON_INFER)], _JSON_INFER),
    _request(b"POST", b"/v2/repository/index", [b"Content-Length: 2"], b"{}"),
    _request(b"HEAD", b"/v2", []) + _request(b"GET", b"/v2/health/live", [b"Connection: close"]),
]

# Byte strings that often confuse HTTP parsers.
TOKENS = [b"\r\n", b"\n", b"\r", b"\x00", b" ", b"\t", b":", b";", b"0", b"-1", b"ffffffffffffffffff", b"%",
          b"chunked", b"Content-Length: 5\r\n", b"Transfer-Encoding: chunked\r\n", b"Transfer-Encoding: gzip, chunked\r\n",
          b"HTTP/1.0", b"HTTP/2.0", b"\r\n\r\n", b"\xff\xfe", b"GET / HTTP/1.1\r\n", b"0\r\n\r\n", b"Host: x\r\n",
          b"Content-Encoding: deflate\r\n", b"Inference-Header-Content-Length: 99999999999999999999\r\n", b"[[[[", b'{"', b"\\u0000"]

_mutation = st.one_of(
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.one_of(st.sampled_from(TOKENS), st.binary(max_size=12))),
    st.tuples(st.just("delete"), st.integers(0, 10**6), st.integers(1, 40)),
    st.tuples(st.just("replace"), st.integers(0, 10**6), st.binary(min_size=1, max_size=4)),
    st.tuples(st.just("truncate"), st.integers(0, 10**6), st.just(b"")),
    st.tuples(st.just("repeat"), st.integers(0, 10**6), st.integers(1, 200)),
)


@st.composite
def mutated_requests(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for kind, where, arg in draw(st.lists(_mutation, min_size=1, max_size=6)):
        at = where % (len(data) + 1)
        if kind == "insert":
            data[at:at] = arg
        elif kind == "delete":
            del data[at:at + arg]
        elif kind == "replace":
            data[at:at + len(arg)] = arg
        elif kind == "truncate":
            del data[at:]
        else:  # repeat a short stretch: long header lines, many headers, many chunks
            data[at:at] = bytes(data[at:at + 16]) * arg
    return bytes(data)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("http_fuzz") / "models"
    add_sub_model(repo, "add_sub", datatype="INT32", dims=4, scheduler="")
    identity_model(repo, "identity_fp32", "FP32", [-1])
    with start_server(repo, "--http-header-timeout-secs", "5", "--http-body-timeout-secs", "5") as running:
        yield running


def _statuses(answer: bytes) -> list[int]:
    """Status codes of the responses in an answer (lines starting `HTTP/1.1 NNN ` at a line start)."""
    found = []
    for line in answer.split(b"\r\n"):
        if line.startswith(b"HTTP/1.1 ") and len(line) >= 12 and line[9:12].isdigit():
            found.append(int(line[9:12]))
    return found


def _check(server: RunningServer, payload: bytes) -> None:
    answer = raw_exchange(server.http_port, payload, end_write=True)
    statuses = _statuses(answer)
    # 501 is the answer to a transfer coding other than chunked; any other 5xx is a server fault
    assert all(status < 500 or status == 501 for status in statuses), (payload[:300], answer[:500])
    assert server.process.poll() is None, "the server died"
    _assert_no_traceback(server)


def _assert_no_traceback(server: RunningServer) -> None:
    log = "".join(server.output)
    assert "Traceback" not in log and "exception in ASGI application" not in log, log[-3000:]


FUZZ = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(payload=mutated_requests())
def test_mutated_requests_never_get_a_5xx(server: RunningServer, payload: bytes) -> None:
    _check(server, payload)


@FUZZ
@given(payload=st.one_of(
    st.binary(max_size=2048),
    st.lists(st.sampled_from(TOKENS), max_size=40).map(b"".join),
    st.builds(lambda method, path, lines: method + b" " + path + b" HTTP/1.1\r\n" + b"".join(lines) + b"\r\n",
              st.sampled_from([b"GET", b"POST", b"PUT", b"HEAD", b"OPTIONS", b"DELETE", b"G\x00T", b"CONNECT"]),
              st.one_of(st.sampled_from([b"/v2", b"/v2/models/add_sub/infer", b"*", b"http://x/v2", b"/%zz", b"/v2/models/%00/ready"]),
                        st.binary(max_size=64)),
              st.lists(st.sampled_from(TOKENS[10:25]) | st.binary(max_size=30).map(lambda b: b + b"\r\n"), max_size=12)),
))
def test_random_bytes_never_get_a_5xx(server: RunningServer, payload: bytes) -> None:
    _check(server, payload)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)
# Request documents of the JSON endpoints, and where a value may be replaced in each.
_INFER_PLACES = [("inputs",), ("inputs", 0), ("inputs", 0, "name"), ("inputs", 0, "datatype"), ("inputs", 0, "shape"),
                 ("inputs", 0, "shape", 1), ("inputs", 0, "data"), ("inputs", 0, "data", 2), ("inputs", 0, "parameters"),
                 ("parameters",), ("id",), ("outputs",)]
JSON_TARGETS = [
    (b"/v2/models/add_sub/infer", json.loads(_JSON_INFER), _INFER_PLACES),
    (b"/v2/models/identity_fp32/infer", {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3],
                                                     "data": [1, 2, 3]}]}, _INFER_PLACES),
    (b"/v2/models/add_sub/generate", {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 2, 3, 4], "parameters": {"p": 1}},
     [("INPUT0",), ("INPUT1",), ("parameters",), ("parameters", "p")]),
    (b"/v2/systemsharedmemory/region/fuzz/register", {"key": "/naiad_fuzz_absent", "offset": 0, "byte_size": 4},
     [("key",), ("offset",), ("byte_size",)]),
    (b"/v2/models/add_sub/trace/setting", {"trace_level": ["OFF"], "trace_rate": "1000"},
     [("trace_level",), ("trace_rate",), ("trace_count",)]),
    (b"/v1/completions", {"model": "add_sub", "prompt": "a", "max_tokens": 2},
     [("model",), ("prompt",), ("max_tokens",), ("temperature",), ("stop",)]),
]
_HOLE = "\x00hole\x00"


@st.composite
def json_bodies(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(path, body): a JSON endpoint's request with one value replaced by any JSON value, possibly
    nested thousands deep, written with the NaN / Infinity literals clients use."""
    path, template, places = draw(st.sampled_from(JSON_TARGETS))
    doc = json.loads(json.dumps(template))
    *parents, last = draw(st.sampled_from(places))
    node = doc
    for key in parents:
        node = node[key]
    node[last] = _HOLE
    depth = draw(st.sampled_from([0, 0, 0, 1, 2, 99, 101, 1_000, 1_030, 5_000]))
    value = "[" * depth + json.dumps(draw(json_values), allow_nan=True) + "]" * depth
    return path, json.dumps(doc).replace(json.dumps(_HOLE), value).encode()


@FUZZ
@given(request=json_bodies())
def test_any_json_value_anywhere_never_gets_a_5xx(server: RunningServer, request: tuple[bytes, bytes]) -> None:
    path, body = request
    _check(server, _request(b"POST", path, [b"Content-Length: %d" % len(body)], body))


def test_the_server_is_healthy_after_fuzzing(server: RunningServer) -> None:
    """After the fuzz tests (file order): no traceback was logged and inference still works."""
    _assert_no_traceback(server)
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        a = np.arange(4, dtype=np.int32).reshape(1, 4)
        inputs = [httpclient.InferInput(f"INPUT{i}", [1, 4], "INT32") for i in (0, 1)]
        for inp in inputs:
            inp.set_data_from_numpy(a)
        np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a * 2)
    finally:
        client.close()
