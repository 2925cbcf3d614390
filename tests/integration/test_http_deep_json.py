"""JSON nested 1,000 and 100,000 deep anywhere in a request body: a 400 with a clear message (never
a 500, never a RecursionError), and the server keeps serving."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support.onnx_models import identity_model
from tests.support.servers import RunningServer, start_server

DEPTHS = [1_000, 100_000]
INFER = "/v2/models/identity_fp32/infer"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("deep_json") / "models"
    identity_model(repo, "identity_fp32", "FP32", [-1])
    identity_model(repo, "spare", "FP32", [-1])
    with start_server(repo, "--model-control-mode", "explicit", "--load-model", "identity_fp32") as running:
        yield running


def post(server: RunningServer, path: str, body: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        conn.request("POST", path, body=body.encode())
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        conn.close()


def arrays(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


def objects(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def tensor(**fields: str) -> str:
    base = {"name": '"INPUT0"', "datatype": '"FP32"', "shape": "[1,1]", "data": "[1]", **fields}
    return "{" + ",".join(f'"{key}":{value}' for key, value in base.items()) + "}"


# (where, path, body for a depth, the message a 400 must carry at depth 1,000)
PLACES = [
    ("data", INFER, lambda d: '{"inputs":[%s]}' % tensor(data=arrays(d)), "nested deeper than 100 levels"),
    ("data with NaN", INFER, lambda d: '{"inputs":[%s]}' % tensor(data=arrays(d, "NaN")), "nested too deeply"),
    ("shape", INFER, lambda d: '{"inputs":[%s]}' % tensor(shape=arrays(d)), "must contain only non-negative integers"),
    ("request parameters", INFER, lambda d: '{"parameters":{"x":%s},"inputs":[%s]}' % (arrays(d), tensor()),
     "has invalid type"),
    ("id", INFER, lambda d: '{"id":%s,"inputs":[%s]}' % (arrays(d), tensor()), "Unable to parse 'id'"),
    ("inputs", INFER, lambda d: '{"inputs":%s}' % arrays(d), "Unable to parse 'inputs'"),
    ("generate input", "/v2/models/identity_fp32/generate", lambda d: '{"INPUT0":%s}' % arrays(d),
     "nested deeper than 100 levels"),
    ("load config text", "/v2/repository/models/spare/load",
     lambda d: '{"parameters":{"config":%s}}' % json.dumps(arrays(d)), "must be a JSON object"),
    ("load config objects", "/v2/repository/models/spare/load",
     lambda d: '{"parameters":{"config":%s}}' % json.dumps(objects(d)), "nested deeper than 32 levels"),
    ("load config not text", "/v2/repository/models/spare/load",
     lambda d: '{"parameters":{"config":%s}}' % arrays(d), "expected a string"),
    ("trace setting", "/v2/trace/setting", lambda d: '{"trace_level":%s}' % arrays(d), "Unable to parse 'trace_level'"),
    ("log setting", "/v2/logging", lambda d: '{"log_verbose_level":%s}' % arrays(d), "expect positive integer"),
    ("shm register", "/v2/systemsharedmemory/region/r/register", lambda d: '{"key":"/k","byte_size":%s}' % arrays(d),
     "Unable to parse 'byte_size'"),
    ("openai max_tokens", "/v1/completions", lambda d: '{"model":"identity_fp32","prompt":"a","max_tokens":%s}' % arrays(d),
     "'max_tokens' must be an integer"),
    ("openai messages", "/v1/chat/completions", lambda d: '{"model":"identity_fp32","messages":%s}' % arrays(d),
     "messages[0] must be an object"),
]


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("where,path,body,message", PLACES, ids=[p[0] for p in PLACES])
def test_deep_nesting_is_a_clear_400(server: RunningServer, depth: int, where: str, path: str, body, message: str) -> None:
    status, text = post(server, path, body(depth))
    # A config override that cannot be read fails like Triton's repository poll: 500 with the reason.
    assert status == (500 if where.startswith("load config") and where != "load config not text" else 400), text
    error = json.loads(text)["error"]
    if isinstance(error, dict):  # the OpenAI API's error object
        error = error["message"]
    assert "recursion" not in error.lower(), error
    if depth == 1_000:
        assert message in error, error
    else:  # past the parser's depth bound the body is refused as a whole
        assert error.startswith(("failed to parse the request JSON buffer", "the request body is not valid JSON")) \
            or "load failed" in error or "failed to poll from model repository" in error, error
        assert "nested too deeply" in error or "depth limit exceeded" in error, error


@pytest.mark.parametrize("depth", DEPTHS)
def test_deep_unknown_parameters_are_ignored_or_refused(server: RunningServer, depth: int) -> None:
    """Tensor parameters Naiad does not know are ignored (as Triton), however deep; past the parser's
    bound the whole body is refused."""
    for body in ('{"inputs":[%s]}' % tensor(parameters='{"x":%s}' % objects(depth)),
                 '{"inputs":[%s],"outputs":[{"name":"OUTPUT0","parameters":{"x":%s}}]}' % (tensor(), objects(depth))):
        status, text = post(server, INFER, body)
        assert status == (200 if depth == 1_000 else 400), text
        assert "recursion" not in text.lower()


def test_the_server_keeps_serving_after_deep_bodies(server: RunningServer) -> None:
    for depth in DEPTHS:
        for _, path, body, _ in PLACES:
            post(server, path, body(depth))
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert client.is_server_live()
        inp = httpclient.InferInput("INPUT0", [1, 3], "FP32")
        inp.set_data_from_numpy(np.array([[1, 2, 3]], np.float32))
        np.testing.assert_array_equal(client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0"), [[1, 2, 3]])
    finally:
        client.close()
