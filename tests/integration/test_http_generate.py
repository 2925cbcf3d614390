"""The generate extension over HTTP: /generate and /generate_stream on a real server."""

import http.client
import json

import pytest

from tests.support.onnx_models import add_sub_model, identity_model
from tests.support.servers import start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    add_sub_model(repo, "add_sub", dims=4)
    identity_model(repo, "text", "BYTES", [1], max_batch_size=0)
    with start_server(repo) as running:
        yield running


def _post(server, path, body, raw=False):
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    conn.request("POST", path, body if raw else json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, response.getheader("Content-Type"), data


def test_generate_maps_keys_to_inputs_and_parameters(server):
    status, ctype, data = _post(server, "/v2/models/add_sub/generate",
                                {"INPUT0": [1, 2, 3, 4], "parameters": {"INPUT1": [1, 1, 1, 1], "temperature": 0.5}, "id": "g1"})
    assert status == 200 and ctype == "application/json", data
    doc = json.loads(data)
    assert doc == {"model_name": "add_sub", "model_version": "1", "id": "g1",
                   "OUTPUT0": [2.0, 3.0, 4.0, 5.0], "OUTPUT1": [0.0, 1.0, 2.0, 3.0]}


def test_scalar_output_is_unwrapped(server):
    status, _, data = _post(server, "/v2/models/text/generate", {"INPUT0": "hello"})
    assert status == 200 and json.loads(data) == {"model_name": "text", "model_version": "1", "OUTPUT0": "hello"}


def test_generate_stream_sends_events(server):
    status, ctype, data = _post(server, "/v2/models/text/generate_stream", {"INPUT0": "hi"})
    assert status == 200 and ctype == "text/event-stream; charset=utf-8"
    events = [json.loads(chunk[len("data: "):]) for chunk in data.decode().split("\n\n") if chunk]
    assert events == [{"model_name": "text", "model_version": "1", "OUTPUT0": "hi"}]


@pytest.mark.parametrize("body,status,fragment", [
    ({"INPUT0": [1, 2, 3, 4]}, 400, "expected 2 inputs but got 1"),
    ({"INPUT0": [1, 2, 3], "INPUT1": [1, 2, 3]}, 400, "unable to fit"),
    ({"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 2, 3, 4], "triton_x": 1}, 400, "reserved"),
    ([1, 2], 400, "expected a JSON object"),
])
def test_errors_before_streaming_are_plain_json(server, body, status, fragment):
    for path in ("/v2/models/add_sub/generate", "/v2/models/add_sub/generate_stream"):
        got, ctype, data = _post(server, path, body)
        assert got == status and ctype == "application/json" and fragment in json.loads(data)["error"]


def test_unknown_model_and_bad_json(server):
    status, _, data = _post(server, "/v2/models/nope/generate", {"x": 1})
    assert status == 404 and "unknown model" in json.loads(data)["error"]
    status, _, data = _post(server, "/v2/models/text/generate", b"{not json", raw=True)
    assert status == 400
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    conn.request("GET", "/v2/models/text/generate")
    assert conn.getresponse().status == 405
