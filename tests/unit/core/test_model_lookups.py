"""One model lookup per request on the paths that decode against the model (generate, a raw binary
body, the OpenAI API), and a resolved model that stops serving before its request runs."""

import asyncio
import json
import shutil

import numpy as np
import pytest

import naiad
from naiad.frontends.http.server import HttpFrontend
from naiad.protocol.errors import ErrorCode, NaiadError
from naiad.protocol.types import InferenceRequest, InferInput
from tests.support.onnx_models import add_sub_model, identity_model
from tests.support.python_models import write_text_echo_model
from tests.support.servers import raw_exchange


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    add_sub_model(root, "add_sub")
    identity_model(root, "identity_fp32", "FP32", [-1])
    write_text_echo_model(root, "text_echo")
    return root


def _call(server, coroutine):
    return asyncio.run_coroutine_threadsafe(coroutine, server._loop).result(60)


@pytest.fixture(scope="module")
def served(repo):
    """An in-process server, its HTTP port, and the names its model registry was asked for."""
    with naiad.Server(model_repository=str(repo)) as server:
        frontend = HttpFrontend(server, "127.0.0.1", 0)
        port = _call(server, frontend.start())
        lookups: list[str] = []
        real_lookup = server.models.lookup

        def counting(name, version=""):
            lookups.append(name)
            return real_lookup(name, version)

        server.models.lookup = counting
        try:
            yield server, port, lookups
        finally:
            server.models.lookup = real_lookup
            _call(server, frontend.stop())


def _post(port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict, bytes]:
    """POST over a raw socket; (status, lower-cased headers, body)."""
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    answer = raw_exchange(port, head.encode() + b"\r\n" + body)
    status_line, _, rest = answer.partition(b"\r\n")
    header_block, _, payload = rest.partition(b"\r\n\r\n")
    fields = dict(line.decode().split(": ", 1) for line in header_block.split(b"\r\n") if line)
    return int(status_line.split()[1]), {k.lower(): v for k, v in fields.items()}, payload


def test_generate_looks_its_model_up_once(served):
    server, port, lookups = served
    lookups.clear()
    doc = {"INPUT0": list(range(16)), "INPUT1": [1] * 16}
    status, _, body = _post(port, "/v2/models/add_sub/generate", json.dumps(doc).encode())
    assert status == 200, body
    assert json.loads(body)["OUTPUT0"] == [i + 1 for i in range(16)]
    assert lookups == ["add_sub"]
    status, _, body = _post(port, "/v2/models/nope/generate", b"{}")
    assert status == 404 and json.loads(body)["error"] == "Request for unknown model: 'nope' is not found"


def test_a_raw_binary_body_looks_its_model_up_once(served):
    server, port, lookups = served
    x = np.arange(5, dtype=np.float32)
    lookups.clear()
    status, headers, body = _post(port, "/v2/models/identity_fp32/infer", x.tobytes(), {"Inference-Header-Content-Length": "0"})
    assert status == 200, body
    length = int(headers["inference-header-content-length"])
    assert np.frombuffer(body[length:], np.float32).tolist() == x.tolist()
    assert lookups == ["identity_fp32"]
    # decoding fails after the model was resolved: the body's error, still one lookup
    lookups.clear()
    status, _, body = _post(port, "/v2/models/add_sub/infer", b"\0" * 128, {"Inference-Header-Content-Length": "0"})
    assert status == 400 and "Raw request must only have 1 input" in json.loads(body)["error"]
    assert lookups == ["add_sub"]
    status, _, body = _post(port, "/v2/models/nope/infer", b"\0" * 4, {"Inference-Header-Content-Length": "0"})
    assert status == 404 and json.loads(body)["error"] == "Request for unknown model: 'nope' is not found"


def test_an_openai_completion_looks_its_model_up_once(served):
    server, port, lookups = served
    lookups.clear()
    doc = {"model": "text_echo", "prompt": "hello there", "max_tokens": 4}
    status, _, body = _post(port, "/v1/completions", json.dumps(doc).encode(), {"Content-Type": "application/json"})
    assert status == 200, body
    assert json.loads(body)["choices"][0]["text"] == "hello there"
    assert lookups == ["text_echo"]
    # a model outside the vLLM contract is unknown to /v1, and the server keeps serving
    status, _, body = _post(port, "/v1/completions", json.dumps(dict(doc, model="add_sub")).encode())
    assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"
    status, _, body = _post(port, "/v1/chat/completions",
                            json.dumps({"model": "text_echo", "messages": [{"role": "user", "content": "hi"}]}).encode())
    assert status == 400 and "no tokenizer chat template" in json.loads(body)["error"]["message"]


def _add_sub_request() -> InferenceRequest:
    a = np.ones((1, 16), np.float32)
    return InferenceRequest(model_name="add_sub", inputs=[InferInput("INPUT0", "FP32", (1, 16), a),
                                                          InferInput("INPUT1", "FP32", (1, 16), a)])


async def _streamed(server, request, resolved):
    return [item async for item in server.inference.stream(request, resolved=resolved)]


def test_a_model_unloaded_between_resolve_and_infer_answers_as_infer_does(repo):
    with naiad.Server(model_repository=str(repo), model_control_mode="explicit", load_models=["add_sub"]) as server:
        resolved = _call(server, server.inference.resolve("add_sub"))
        assert (resolved.name, resolved.version, resolved.decoupled) == ("add_sub", "1", False)
        assert [(t.name, t.datatype, t.shape) for t in resolved.inputs] == [("INPUT0", "FP32", (-1, 16)),
                                                                             ("INPUT1", "FP32", (-1, 16))]
        _call(server, server.control.unload_model("add_sub"))
        with pytest.raises(NaiadError) as without:
            _call(server, server.inference.infer(_add_sub_request()))
        with pytest.raises(NaiadError) as handed:
            _call(server, server.inference.infer(_add_sub_request(), resolved))
        with pytest.raises(NaiadError) as streamed:
            _call(server, _streamed(server, _add_sub_request(), resolved))
        assert without.value.code is ErrorCode.NOT_FOUND
        for error in (handed.value, streamed.value):
            assert (error.code, error.message) == (without.value.code, without.value.message)
        # loaded again: the stale handle's request runs on the new version
        _call(server, server.control.load_model("add_sub"))
        response = _call(server, server.inference.infer(_add_sub_request(), resolved))
        np.testing.assert_array_equal(response.output("OUTPUT0").data, np.full((1, 16), 2, np.float32))
        # a handle is for the model it was resolved for
        other = _call(server, server.inference.resolve("add_sub"))
        request = _add_sub_request()
        request.model_name = "identity_fp32"
        with pytest.raises(NaiadError) as mismatched:
            _call(server, server.inference.infer(request, other))
        assert mismatched.value.code is ErrorCode.INTERNAL


def test_a_model_unloaded_after_resolve_is_loaded_again_on_demand(repo):
    with naiad.Server(model_repository=str(repo), model_control_mode="explicit", load_on_demand=True) as server:
        resolved = _call(server, server.inference.resolve("add_sub"))  # loads it
        _call(server, server.control.unload_model("add_sub"))
        response = _call(server, server.inference.infer(_add_sub_request(), resolved))
        np.testing.assert_array_equal(response.output("OUTPUT1").data, np.zeros((1, 16), np.float32))
        assert {"name": "add_sub", "version": "1", "state": "READY"} in server.control.repository_index()


def test_generate_and_raw_bodies_load_a_model_on_demand(repo):
    """Resolving is the request's lookup: with --load-on-demand it loads the model, as infer does."""
    with naiad.Server(model_repository=str(repo), model_control_mode="explicit", load_on_demand=True) as server:
        frontend = HttpFrontend(server, "127.0.0.1", 0)
        port = _call(server, frontend.start())
        try:
            doc = {"INPUT0": [2] * 16, "INPUT1": [1] * 16}
            status, _, body = _post(port, "/v2/models/add_sub/generate", json.dumps(doc).encode())
            assert status == 200, body
            assert json.loads(body)["OUTPUT1"] == [1] * 16
            x = np.arange(3, dtype=np.float32)
            status, headers, body = _post(port, "/v2/models/identity_fp32/infer", x.tobytes(),
                                          {"Inference-Header-Content-Length": "0"})
            assert status == 200, body
            assert np.frombuffer(body[int(headers["inference-header-content-length"]):], np.float32).tolist() == [0, 1, 2]
            ready = {e["name"] for e in server.control.repository_index(ready_only=True)}
            assert {"add_sub", "identity_fp32"} <= ready
            status, _, body = _post(port, "/v2/models/not_in_repository/generate", b"{}")
            assert status == 404, body
        finally:
            _call(server, frontend.stop())


def test_a_version_the_policy_drops_after_resolve_is_looked_up_again(tmp_path):
    """Resolved without a version: the newest (2). A reload whose version policy keeps only 1 retires
    it, and the request runs on what a lookup finds then."""
    model_dir = add_sub_model(tmp_path, "add_sub")
    shutil.copytree(model_dir / "1", model_dir / "2")
    with naiad.Server(model_repository=str(tmp_path), model_control_mode="explicit", load_models=["add_sub"]) as server:
        resolved = _call(server, server.inference.resolve("add_sub"))
        assert resolved.version == "2"
        config = model_dir / "config.pbtxt"
        config.write_text(config.read_text() + "version_policy { specific { versions: [1] } }\n")
        _call(server, server.control.load_model("add_sub"))
        response = _call(server, server.inference.infer(_add_sub_request(), resolved))
        assert response.model_version == "1"
        np.testing.assert_array_equal(response.output("OUTPUT0").data, np.full((1, 16), 2, np.float32))
