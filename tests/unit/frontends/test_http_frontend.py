"""HttpFrontend end to end over real sockets, against an in-process fake of the Server facade."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import re
import socket
import struct
import threading
import zlib
from multiprocessing import shared_memory as mp_shm

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from naiad.config.server_config import ServerConfig
from naiad.core.shared_memory_service import SharedMemoryService
from naiad.frontends.http import HttpFrontend
from naiad.frontends.http.routes import INFER_PATH, PATH_CHARS_KEPT, PATHS_KEPT, FastRoute, FastRoutes, build_router
from naiad.protocol.errors import (
    DecoupledModelError,
    ErrorCode,
    NaiadError,
    invalid_arg,
    not_found,
    unsupported,
)
from naiad.protocol.tensor_codec import array_to_raw
from naiad.protocol.types import InferenceRequest, InferenceResponse, OutputTensor
from naiad.runtime.shared_memory import SystemSharedMemoryRegistry

MAX_INPUT = 1 << 20


def _config(name: str, max_batch: int, inputs, outputs, decoupled: bool = False) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=name, max_batch_size=max_batch, backend="fake")
    for n, t, dims in inputs:
        cfg.input.add(name=n, data_type=t, dims=dims)
    for n, t, dims in outputs:
        cfg.output.add(name=n, data_type=t, dims=dims)
    cfg.model_transaction_policy.decoupled = decoupled
    return cfg


class _Regions(SharedMemoryService):
    def cuda_register(self, name, raw_handle, device_id, byte_size) -> None:
        raise unsupported("CUDA shared memory is not supported")


class _Resolved:
    """What a frontend reads of a resolved model here: its config (raw binary bodies)."""

    def __init__(self, config: mc.ModelConfig) -> None:
        self.config = config
        self.name = config.name


class FakeServer:
    """Just enough of the facade: a few echo-style models, shm, repository bookkeeping."""

    def __init__(self) -> None:
        self.config = ServerConfig(
            http_max_input_size=MAX_INPUT, http_body_timeout_secs=1.0, http_header_timeout_secs=1.0
        )
        self.regions = SystemSharedMemoryRegistry(enabled=True)
        self.shared_memory = _Regions(self.regions)
        self.inference = self.control = self.info = self  # the facade's interfaces, all in this one fake
        self.models = {
            "identity": _config("identity", 8, [("INPUT0", mc.TYPE_FP32, [-1])], [("OUTPUT0", mc.TYPE_FP32, [-1])]),
            "add_sub": _config(
                "add_sub",
                8,
                [("INPUT0", mc.TYPE_INT32, [4]), ("INPUT1", mc.TYPE_INT32, [4])],
                [("OUTPUT0", mc.TYPE_INT32, [4]), ("OUTPUT1", mc.TYPE_INT32, [4])],
            ),
            "strings": _config("strings", 0, [("INPUT0", mc.TYPE_STRING, [-1])], [("OUTPUT0", mc.TYPE_STRING, [-1])]),
            "one_string": _config("one_string", 0, [("INPUT0", mc.TYPE_STRING, [1])], [("OUTPUT0", mc.TYPE_STRING, [1])]),
            "half": _config("half", 0, [("INPUT0", mc.TYPE_FP16, [4])], [("OUTPUT0", mc.TYPE_FP16, [4])]),
            "decoupled": _config("decoupled", 0, [("IN", mc.TYPE_INT32, [1])], [("OUT", mc.TYPE_INT32, [1])], True),
        }
        self.loaded: list[tuple[str, str | None, dict | None]] = []
        self.unloaded: list[tuple[str, bool]] = []
        self.last_request: InferenceRequest | None = None
        self.log = {"log_file": "", "log_info": True, "log_verbose_level": 0}

    # -- health / metadata
    def is_live(self) -> bool:
        return True

    def is_ready(self) -> bool:
        return True

    def metadata(self) -> dict:
        return {"name": "triton", "version": "0.0.1", "extensions": ["binary_tensor_data"]}

    def _cfg(self, name: str, version: str = "") -> mc.ModelConfig:
        if name not in self.models:
            raise not_found(f"Request for unknown model: '{name}' is not found")
        if version not in ("", "1"):
            raise not_found(f"Request for unknown model: '{name}' version {version} is not found")
        return self.models[name]

    def model_ready(self, name: str, version: str = "") -> bool:
        self._cfg(name, version)
        return name != "half"

    def check_servable(self, name: str, version: str = "") -> None:
        self._cfg(name, version)

    def model_metadata(self, name: str, version: str = "") -> dict:
        cfg = self._cfg(name, version)
        return {"name": name, "versions": ["1"], "platform": "fake", "inputs": [], "outputs": [],
                "n_inputs": len(cfg.input)}

    def model_config(self, name: str, version: str = ""):
        return self._cfg(name, version)

    def model_config_dict(self, name: str, version: str = "") -> dict:
        cfg = self._cfg(name, version)
        return {"name": cfg.name, "max_batch_size": cfg.max_batch_size}

    async def resolve(self, name: str, version: str = "") -> _Resolved:
        return _Resolved(self._cfg(name, version))

    def model_statistics(self, name: str = "", version: str = "") -> dict:
        if name:
            self._cfg(name, version)
        return {"model_stats": [{"name": name or "all", "version": version}]}

    def repository_index(self, ready_only: bool = False) -> list[dict]:
        return [{"name": n, "version": "1", "state": "READY"} for n in sorted(self.models)][: 1 if ready_only else None]

    async def load_model(self, name: str, config_json: str | None = None, files: dict | None = None) -> None:
        if name == "missing":
            raise NaiadError(ErrorCode.INTERNAL, f"failed to load '{name}', failed to poll from model repository")
        self.loaded.append((name, config_json, files))

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self.unloaded.append((name, unload_dependents))

    # -- logging extension
    def get_log_settings(self) -> dict:
        return dict(self.log)

    def update_log_settings(self, changes: dict) -> dict:
        if "log_file" in changes:
            raise unsupported("log file location can not be updated through network protocol")
        self.log.update(changes)
        return dict(self.log)

    # -- inference
    async def infer_async(self, request: InferenceRequest, resolved: _Resolved | None = None) -> InferenceResponse:
        self.last_request = request
        cfg = self._cfg(request.model_name, request.model_version)
        for inp in request.inputs:  # as the core does: read inputs sent by shared-memory reference
            if inp.data is None:
                inp.data = self.regions.read_tensor(inp.shared_memory, inp.datatype, inp.shape, inp.name)
        if cfg.model_transaction_policy.decoupled:
            raise DecoupledModelError(request.model_name)
        by_name = {i.name: i for i in request.inputs}
        for spec in cfg.input:
            if spec.name not in by_name:
                raise invalid_arg(f"[request id: {request.id or '<id_unknown>'}] expected {len(cfg.input)} inputs")
        if request.model_name == "add_sub":
            a, b = by_name["INPUT0"].data, by_name["INPUT1"].data
            produced = {"OUTPUT0": ("INT32", a + b), "OUTPUT1": ("INT32", a - b)}
        else:
            src = by_name[cfg.input[0].name]
            produced = {cfg.output[0].name: (src.datatype, src.data)}
        wanted = request.outputs or []
        names = [o.name for o in wanted] or list(produced)
        outputs = []
        for name in names:
            if name not in produced:
                raise invalid_arg(f"unexpected inference output '{name}' for model '{request.model_name}'")
            datatype, data = produced[name]
            req = next((o for o in wanted if o.name == name), None)
            if req is not None and req.classification:
                flat = data.reshape(data.shape[0], -1) if cfg.max_batch_size else data.reshape(1, -1)
                rows = []
                for row in flat:
                    top = np.argsort(-row, kind="stable")[: req.classification]
                    rows.append([f"{float(row[i]):g}:{i}".encode() for i in top])
                arr = np.array(rows, dtype=np.object_)
                if not cfg.max_batch_size:
                    arr = arr.reshape(-1)
                outputs.append(OutputTensor(name, "BYTES", arr.shape, arr))
            elif req is not None and req.shared_memory is not None:
                self.regions.write(req.shared_memory, array_to_raw(data, datatype), name)
                outputs.append(OutputTensor(name, datatype, data.shape, None))
            else:
                outputs.append(OutputTensor(name, datatype, data.shape, data))
        return InferenceResponse(request.model_name, "1", outputs, id=request.id,
                                 parameters={"echo": True} if "echo" in request.parameters else {})

    infer = infer_async  # InferenceAPI's name


@pytest.fixture(scope="module")
def running():
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover
        loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = FakeServer()
    frontend = HttpFrontend(server, "127.0.0.1", 0)
    port = asyncio.run_coroutine_threadsafe(frontend.start(), loop).result(10)
    yield port, server
    asyncio.run_coroutine_threadsafe(frontend.stop(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


@pytest.fixture()
def port(running):
    return running[0]


@pytest.fixture()
def fake(running):
    return running[1]


@pytest.fixture()
def client(port):
    c = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    yield c
    c.close()


def call(port: int, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict((k.lower(), v) for k, v in resp.getheaders()), resp.read()
    finally:
        conn.close()


def error_of(body: bytes) -> str:
    return json.loads(body)["error"]


def infer_json(port: int, model: str, doc: dict, headers: dict | None = None):
    return call(port, "POST", f"/v2/models/{model}/infer", json.dumps(doc).encode(), headers)


# ------------------------------------------------------------------ health / metadata / routing


def test_health_and_metadata(port, client):
    assert client.is_server_live() and client.is_server_ready()
    status, headers, body = call(port, "GET", "/v2/health/live")
    assert (status, body) == (200, b"") and headers["content-type"].startswith("text/plain")
    assert client.get_server_metadata()["name"] == "triton"
    assert client.is_model_ready("identity")
    assert client.is_model_ready("identity", "1")
    assert not client.is_model_ready("half")
    assert client.get_model_metadata("add_sub")["n_inputs"] == 2
    assert client.get_model_config("identity", "1")["max_batch_size"] == 8


def test_model_ready_errors(port):
    status, _, body = call(port, "GET", "/v2/models/half/ready")
    assert status == 400 and error_of(body) == "Model version not ready"
    status, _, body = call(port, "GET", "/v2/models/nope/ready")
    assert status == 400 and "unknown model: 'nope'" in error_of(body)


def test_unknown_model_is_404(port):
    status, headers, body = call(port, "GET", "/v2/models/nope")
    assert status == 404 and headers["content-type"] == "application/json"
    assert error_of(body) == "Request for unknown model: 'nope' is not found"
    status, _, body = call(port, "GET", "/v2/models/identity/versions/7/config")
    assert status == 404 and error_of(body) == "Request for unknown model: 'identity' version 7 is not found"


def test_unknown_path_and_wrong_method(port):
    for path in ("/v3", "/v2/models/identity/versions/abc", "/v2/models/identity/versions/1/nope", "/"):
        status, _, body = call(port, "GET", path)
        assert (status, json.loads(body)) == (404, {"error": "Not Found"}), path
    status, headers, body = call(port, "GET", "/v2/models/identity/infer")
    assert (status, json.loads(body)) == (405, {"error": "Method Not Allowed"})
    assert headers["allow"] == "POST"
    status, _, body = call(port, "POST", "/v2/health/live", b"{}")
    assert (status, json.loads(body)) == (405, {"error": "Method Not Allowed"})
    status, _, body = call(port, "GET", "/v2/repository/index")
    assert status == 405


def test_fast_entries_answer_a_wrong_method_like_the_router(port, fake):
    for path in ("/v2/models/identity/versions/2/infer", "/v2/models/identity/generate",
                 "/v2/models/identity/versions/1/generate_stream"):
        status, headers, body = call(port, "GET", path)
        assert (status, json.loads(body), headers["allow"]) == (405, {"error": "Method Not Allowed"}, "POST"), path
    # infer and generate are entries of the table's fast part only: the Router does not hold them again
    assert not [r.path for r in build_router(fake).routes if r.path.endswith(("/infer", "/generate"))]
    status, _, _ = call(port, "GET", "/v2/health/live")
    assert status == 200


def test_fast_targets_are_remembered_within_bounds():
    async def handler(scope, receive, send, model, version):  # pragma: no cover - never awaited here
        pass

    fast = FastRoutes((FastRoute("/infer", INFER_PATH, handler, lambda match: (match.group(1), match.group(2) or "")),))
    assert fast.target("/v2/models/m/versions/3/infer") == (handler, ("m", "3"))
    assert fast.known["/v2/models/m/versions/3/infer"] == (handler, ("m", "3"))
    assert fast.target("/v2/health/live") is None and fast.known["/v2/health/live"] is None  # the Router's
    for i in range(PATHS_KEPT + 10):
        assert fast.target(f"/v2/models/m{i}/infer") == (handler, (f"m{i}", ""))
    assert 0 < len(fast.known) <= PATHS_KEPT
    long_name = "x" * PATH_CHARS_KEPT
    assert fast.target(f"/v2/models/{long_name}/infer") == (handler, (long_name, ""))
    assert f"/v2/models/{long_name}/infer" not in fast.known


def test_remembered_paths_answer_as_the_first_time(port, client):
    for _ in range(3):
        status, headers, _ = call(port, "GET", "/v2/models/identity/infer")
        assert (status, headers["allow"]) == (405, "POST")
        status, _, _ = call(port, "GET", "/v2/health/live")
        assert status == 200
        status, _, body = infer_json(port, "nope", {"inputs": []})
        assert status == 404 and "unknown model: 'nope'" in error_of(body)


def test_statistics(client):
    assert client.get_inference_statistics()["model_stats"][0]["name"] == "all"
    stats = client.get_inference_statistics("identity", "1")
    assert stats["model_stats"] == [{"name": "identity", "version": "1"}]
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.get_inference_statistics("nope")


# ------------------------------------------------------------------ inference with tritonclient


@pytest.mark.parametrize("binary_in", [True, False])
@pytest.mark.parametrize("binary_out", [True, False])
def test_infer_roundtrip(client, binary_in, binary_out):
    a = np.arange(8, dtype=np.int32).reshape(2, 4)
    b = np.ones((2, 4), dtype=np.int32)
    inputs = [httpclient.InferInput("INPUT0", [2, 4], "INT32"), httpclient.InferInput("INPUT1", [2, 4], "INT32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary_in)
    inputs[1].set_data_from_numpy(b, binary_data=binary_in)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary_out) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer("add_sub", inputs, outputs=outputs, request_id="r1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert response["id"] == "r1" and response["model_version"] == "1"


def test_infer_bytes_and_fp16_binary(client):
    data = np.array([b"hello", b"", "wörld".encode()], dtype=np.object_)
    inp = httpclient.InferInput("INPUT0", [3], "BYTES")
    inp.set_data_from_numpy(data, binary_data=True)
    result = client.infer("strings", [inp])
    assert list(result.as_numpy("OUTPUT0")) == list(data)
    inp = httpclient.InferInput("INPUT0", [3], "BYTES")
    inp.set_data_from_numpy(data, binary_data=False)
    result = client.infer("strings", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
    assert [x.decode() if isinstance(x, bytes) else x for x in result.as_numpy("OUTPUT0")] == ["hello", "", "wörld"]
    half = np.array([1.5, -2, 0, 65504], dtype=np.float16)
    inp = httpclient.InferInput("INPUT0", [4], "FP16")
    inp.set_data_from_numpy(half, binary_data=True)
    result = client.infer("half", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), half)


def test_fp16_json_refused_both_ways(client, port):
    inp = httpclient.InferInput("INPUT0", [4], "FP16")
    inp.set_data_from_numpy(np.zeros(4, np.float16), binary_data=True)
    with pytest.raises(InferenceServerException) as info:
        client.infer("half", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
    assert info.value.status() == "400"
    assert "sending FP16 data via JSON is not supported" in info.value.message()
    status, _, body = infer_json(
        port, "half", {"inputs": [{"name": "INPUT0", "datatype": "FP16", "shape": [4], "data": [1, 2, 3, 4]}]}
    )
    assert status == 400 and "receiving FP16 data via JSON is not supported" in error_of(body)


def test_classification(client):
    x = np.array([[0.1, 3.3, 1.0, 2.0], [5.0, 0.0, 4.0, 1.0]], dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [2, 4], "FP32")
    inp.set_data_from_numpy(x)
    for binary in (True, False):
        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary, class_count=2)
        result = client.infer("identity", [inp], outputs=[out])
        got = result.as_numpy("OUTPUT0")
        assert got.shape == (2, 2)
        assert [x.decode() if isinstance(x, bytes) else x for x in got.ravel()] == ["3.3:1", "2:3", "5:0", "4:2"]
        assert result.get_output("OUTPUT0")["datatype"] == "BYTES"


def test_request_parameters_reach_the_core(client, fake):
    inp = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 2), np.float32))
    result = client.infer(
        "identity", [inp], sequence_id=42, sequence_start=True, sequence_end=False, priority=3, timeout=1000,
        parameters={"echo": "x", "n": 5, "f": 1.5, "flag": False},
    )
    req = fake.last_request
    assert (req.sequence_id, req.sequence_start, req.sequence_end, req.priority, req.timeout_us) == (42, True, False, 3, 1000)
    assert req.parameters == {"echo": "x", "n": 5, "f": 1.5, "flag": False}
    assert result.get_response()["parameters"] == {"echo": True}
    client.infer("identity", [inp], sequence_id="abc")
    assert fake.last_request.sequence_id == "abc"


def test_reserved_parameter_prefix(port):
    doc = {"parameters": {"triton_x": 1}, "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}
    status, _, body = infer_json(port, "identity", doc)
    assert status == 400
    assert error_of(body) == (
        "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
    )


def test_compression_both_ways(client):
    x = np.arange(64, dtype=np.float32).reshape(1, 64)
    inp = httpclient.InferInput("INPUT0", [1, 64], "FP32")
    inp.set_data_from_numpy(x)
    for algo in ("gzip", "deflate"):
        result = client.infer("identity", [inp], request_compression_algorithm=algo, response_compression_algorithm=algo)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)


def test_response_is_compressed_per_accept_encoding(port):
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
    status, headers, body = infer_json(port, "identity", doc, {"Accept-Encoding": "deflate;q=0.5, gzip;q=0.9"})
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert json.loads(gzip.decompress(body))["outputs"][0]["data"] == [1.0, 2.0, 3.0]
    status, headers, body = infer_json(port, "identity", doc, {"Accept-Encoding": "br"})
    assert status == 200 and "content-encoding" not in headers
    assert json.loads(body)["outputs"][0]["shape"] == [1, 3]


def test_request_compression_raw(port):
    doc = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [[1, 2]]}]}).encode()
    status, _, body = call(port, "POST", "/v2/models/identity/infer", zlib.compress(doc), {"Content-Encoding": "deflate"})
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [1.0, 2.0]
    status, headers, body = call(port, "POST", "/v2/models/identity/infer", doc, {"Content-Encoding": "br"})
    assert status == 400 and "Unsupported compression type 'br'" in error_of(body)
    assert headers["accept-encoding"] == "gzip, deflate"
    status, _, body = call(port, "POST", "/v2/models/identity/infer", b"\x1f\x8bnot gzip", {"Content-Encoding": "gzip"})
    assert status == 400 and "unable to decompress" in error_of(body)


def test_gzip_bomb_is_capped(port):
    bomb = gzip.compress(b" " * (MAX_INPUT * 4))
    assert len(bomb) < MAX_INPUT
    status, _, body = call(port, "POST", "/v2/models/identity/infer", bomb, {"Content-Encoding": "gzip"})
    assert status == 400 and "exceeds the maximum allowed value" in error_of(body)


def test_decoupled_model_is_501(port):
    status, _, body = infer_json(port, "decoupled", {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}]})
    assert status == 501
    assert error_of(body) == "HTTP end point doesn't support models with decoupled transaction policy"


def test_outputs_requested_as_binary_by_request_default(port):
    doc = {
        "parameters": {"binary_data_output": True},
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}],
    }
    status, headers, body = infer_json(port, "identity", doc)
    assert status == 200 and headers["content-type"] == "application/octet-stream"
    n = int(headers["inference-header-content-length"])
    header = json.loads(body[:n])
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 8}
    assert np.frombuffer(body[n:], np.float32).tolist() == [1.0, 2.0]
    # a per-output choice overrides the request default
    doc["outputs"] = [{"name": "OUTPUT0", "parameters": {"binary_data": False}}]
    status, headers, body = infer_json(port, "identity", doc)
    assert headers["content-type"] == "application/json" and json.loads(body)["outputs"][0]["data"] == [1.0, 2.0]


def test_raw_binary_request(port):
    x = np.arange(6, dtype=np.float32)
    status, headers, body = call(
        port, "POST", "/v2/models/identity/infer", x.tobytes(), {"Inference-Header-Content-Length": "0"}
    )
    assert status == 200
    n = int(headers["inference-header-content-length"])
    header = json.loads(body[:n])
    assert header["outputs"][0]["shape"] == [1, 6]
    assert np.frombuffer(body[n:], np.float32).tolist() == x.tolist()
    status, _, body = call(port, "POST", "/v2/models/one_string/infer", b"raw text", {"Inference-Header-Content-Length": "0"})
    assert status == 200
    n = body.index(b"}]}") + 3
    assert body[n:] == struct.pack("<I", 8) + b"raw text"
    status, _, body = call(port, "POST", "/v2/models/add_sub/infer", b"\0" * 32, {"Inference-Header-Content-Length": "0"})
    assert status == 400
    assert "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'add_sub'" in error_of(body)
    status, _, body = call(port, "POST", "/v2/models/strings/infer", b"abc", {"Inference-Header-Content-Length": "0"})
    assert status == 400 and "For BYTE datatype raw input, the model must have input shape [1]" in error_of(body)


# ------------------------------------------------------------------ shared memory


def test_system_shared_memory_infer(client, fake):
    region = mp_shm.SharedMemory(create=True, size=64)
    try:
        key = "/" + region.name
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        region.buf[:16] = x.tobytes()
        client.register_system_shared_memory("in_region", key, 32)
        client.register_system_shared_memory("out_region", key, 32, offset=32)
        status = client.get_system_shared_memory_status()
        assert {r["name"] for r in status} == {"in_region", "out_region"}
        assert client.get_system_shared_memory_status("in_region") == [
            {"name": "in_region", "key": key, "offset": 0, "byte_size": 32}
        ]
        inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_shared_memory("in_region", 16)
        out = httpclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("out_region", 16)
        result = client.infer("identity", [inp], outputs=[out])
        out_json = result.get_output("OUTPUT0")
        assert out_json["shape"] == [1, 4] and "data" not in out_json
        assert np.frombuffer(bytes(region.buf[32:48]), np.float32).tolist() == [0.0, 1.0, 2.0, 3.0]
        with pytest.raises(InferenceServerException, match="already in manager"):
            client.register_system_shared_memory("in_region", key, 32)
        client.unregister_system_shared_memory("in_region")
        assert [r["name"] for r in client.get_system_shared_memory_status()] == ["out_region"]
        client.unregister_system_shared_memory()
        assert client.get_system_shared_memory_status() == []
        with pytest.raises(InferenceServerException, match="Unable to find system shared memory region: 'gone'"):
            client.get_system_shared_memory_status("gone")
    finally:
        fake.shared_memory.unregister()
        region.close()
        region.unlink()


def test_shared_memory_register_errors(port):
    status, _, body = call(port, "POST", "/v2/systemsharedmemory/region/r/register", b'{"key": "/x"}')
    assert status == 400 and error_of(body) == "Shared memory register request has no 'byte_size' field"
    status, _, body = call(port, "POST", "/v2/systemsharedmemory/region/r/register", b'{"byte_size": 4}')
    assert status == 400 and error_of(body) == "Shared memory register request has no 'key' field"
    status, _, body = call(port, "POST", "/v2/systemsharedmemory/region/r/register", b'{"key": "/x", "byte_size": -1}')
    assert status == 400 and "Unable to parse 'byte_size'" in error_of(body)
    status, _, body = call(port, "POST", "/v2/systemsharedmemory/register", b'{"key": "/x", "byte_size": 4}')
    assert status == 400 and "'region name' is necessary" in error_of(body)
    status, _, body = call(port, "POST", "/v2/systemsharedmemory/region/r/register", b"{not json")
    assert status == 400 and "failed to parse the request JSON buffer" in error_of(body)
    status, _, body = call(port, "POST", "/v2/systemsharedmemory/region/r/register",
                           b'{"key": "/naiad_no_such_key_xyz", "byte_size": 4}')
    assert status == 400 and "Unable to open shared memory region" in error_of(body)


def test_shm_input_unknown_region(port):
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2],
                       "parameters": {"shared_memory_region": "nope", "shared_memory_byte_size": 8}}]}
    status, _, body = infer_json(port, "identity", doc)
    assert status == 400 and "Unable to find shared memory region: 'nope'" in error_of(body)


def test_cuda_shared_memory_routes(client, port):
    assert client.get_cuda_shared_memory_status() == []
    body = json.dumps({"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 16}).encode()
    status, _, resp = call(port, "POST", "/v2/cudasharedmemory/region/c0/register", body)
    assert status == 501 and error_of(resp) == "CUDA shared memory is not supported"
    client.unregister_cuda_shared_memory()
    client.unregister_cuda_shared_memory("c0")


# ------------------------------------------------------------------ repository


def test_repository_endpoints(client, fake, port):
    index = client.get_model_repository_index()
    assert {"name": "add_sub", "version": "1", "state": "READY"} in index
    status, _, body = call(port, "POST", "/v2/repository/index", b'{"ready": true}')
    assert status == 200 and len(json.loads(body)) == 1
    status, _, body = call(port, "POST", "/v2/repository/index", b'{"ready": "yes"}')
    assert status == 400 and "Unable to parse 'ready'" in error_of(body)
    client.load_model("identity")
    client.load_model("identity", config='{"max_batch_size": 2}', files={"file:1/model.onnx": b"\x00\x01model"})
    assert fake.loaded[-2:] == [
        ("identity", None, None),
        ("identity", '{"max_batch_size": 2}', {"file:1/model.onnx": b"\x00\x01model"}),
    ]
    with pytest.raises(InferenceServerException) as info:
        client.load_model("missing")
    assert info.value.status() == "500" and "failed to poll from model repository" in info.value.message()
    client.unload_model("identity", unload_dependents=True)
    client.unload_model("add_sub")
    assert fake.unloaded[-2:] == [("identity", True), ("add_sub", False)]


def test_repository_errors(port):
    status, _, resp = call(port, "POST", "/v2/repository/models/m/load", b'{"parameters": {"config": 5}}')
    assert status == 400 and "Unable to parse parameter 'config'" in error_of(resp)
    status, _, resp = call(port, "POST", "/v2/repository/models/m/load",
                           b'{"parameters": {"config": "{}", "file:1/x": "***"}}')
    assert status == 400 and "Unable to decode base64 content of 'file:1/x'" in error_of(resp)
    status, _, resp = call(port, "POST", "/v2/repository/models/m/unload", b'{"parameters": {"unload_dependents": 1}}')
    assert status == 400 and error_of(resp).startswith("Unable to parse 'unload_dependents'")
    for path in ("/v2/repository/other/index", "/v2/repository/other/models/m/load", "/v2/repository/other/models/m/unload"):
        status, _, resp = call(port, "POST", path)
        assert status == 501 and error_of(resp) == "'repository_name' specification is not supported"


# ------------------------------------------------------------------ hostile input


BAD_INFER_BODIES = [
    (b"{not json", "failed to parse the request JSON buffer"),
    (b"[]", "expected a JSON object"),
    (b"{}", "Unable to parse 'inputs'"),
    (b'{"inputs": {}}', "Unable to parse 'inputs'"),
    (b'{"inputs": [5]}', "Unable to parse 'inputs'"),
    (b'{"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]}', "Unable to parse 'name'"),
    (b'{"inputs": [{"name": "INPUT0", "datatype": 3, "shape": [1], "data": [1]}]}', "Unable to parse 'datatype'"),
    (b'{"inputs": [{"name": "INPUT0", "datatype": "FP99", "shape": [1], "data": [1]}]}', "invalid datatype"),
    (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, -2], "data": [1]}]}', "non-negative"),
    (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": "1", "data": [1]}]}', "shape of input"),
    (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2147483648, 4], "data": [1]}]}',
     "Shape does not match true shape of 'data' field"),
    (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, "x"]}]}', "unable to parse 'data'"),
    (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2]}]}', "But no field is set"),
    (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1], '
     b'"parameters": {"binary_data_size": 4}}]}', "But set 'data' 'binary_data_size'"),
    (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": 4}}]}',
     "must specify valid 'Infer-Header-Content-Length'"),
    (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": -4}}]}',
     "Unable to parse 'binary_data_size'"),
    (b'{"id": 5, "inputs": []}', "Unable to parse 'id'"),
    (b'{"parameters": [], "inputs": []}', "Unable to parse 'parameters'"),
    (b'{"parameters": {"priority": -1}, "inputs": []}', "Unable to parse 'priority'"),
    (b'{"parameters": {"sequence_start": 1}, "inputs": []}', "Unable to parse 'sequence_start'"),
    (b'{"parameters": {"sequence_id": 1.5}, "inputs": []}', "Unable to parse 'sequence_id'"),
    (b'{"parameters": {"custom": {"a": 1}}, "inputs": []}', "parameter 'custom' has invalid type"),
    (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1]}], "outputs": {}}',
     "Unable to parse 'outputs'"),
    (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1]}], '
     b'"outputs": [{"name": "OUTPUT0", "parameters": {"classification": -1}}]}', "Unable to set 'classification'"),
    (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1]}], '
     b'"outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": "yes"}}]}', "Unable to parse 'binary_data'"),
    (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1]}], '
     b'"outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4, '
     b'"classification": 2}}]}', "Output can't set both 'shared_memory_region' and 'classification'"),
    (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1]}], '
     b'"outputs": [{"name": "NOPE"}]}', "unexpected inference output 'NOPE'"),
    (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": ' + b"[" * 150 + b"1" + b"]" * 150
     + b"}]}", "nested deeper than 100"),
    (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": ' + b"[" * 100000 + b"]" * 100000
     + b"}]}", "failed to parse the request JSON buffer"),
]


@pytest.mark.parametrize("body,message", BAD_INFER_BODIES)
def test_malformed_infer_json_is_400(port, body, message):
    status, headers, resp = call(port, "POST", "/v2/models/identity/infer", body)
    assert status == 400, resp
    assert headers["content-type"] == "application/json"
    assert message in error_of(resp)


def _binary_request(inputs: list[tuple[str, str, list, bytes]], extra: bytes = b"", header_override=None):
    doc = {"inputs": [{"name": n, "datatype": d, "shape": s, "parameters": {"binary_data_size": len(b)}}
                      for n, d, s, b in inputs]}
    header = json.dumps(doc).encode()
    body = header + b"".join(b for *_, b in inputs) + extra
    return body, {"Inference-Header-Content-Length": header_override if header_override is not None else str(len(header))}


def test_binary_size_checks(port):
    good = np.arange(4, dtype=np.int32).tobytes()
    body, headers = _binary_request([("INPUT0", "INT32", [1, 4], good), ("INPUT1", "INT32", [1, 4], good)])
    status, _, resp = call(port, "POST", "/v2/models/add_sub/infer", body, headers)
    assert status == 200, resp
    status, _, resp = call(port, "POST", "/v2/models/add_sub/infer", body[:-3], headers)
    assert status == 400
    assert error_of(resp) == "unexpected size for input 'INPUT1', expecting 3 additional bytes for model 'add_sub'"
    status, _, resp = call(port, "POST", "/v2/models/add_sub/infer", body + b"xx", headers)
    assert status == 400 and error_of(resp) == "unexpected additional input data for model 'add_sub'"
    big, headers = _binary_request([("INPUT0", "INT32", [2147483648, 4], good), ("INPUT1", "INT32", [1, 4], good)])
    status, _, resp = call(port, "POST", "/v2/models/add_sub/infer", big, headers)
    assert status == 400 and "unexpected total byte size 16 for input 'INPUT0'" in error_of(resp)


@pytest.mark.parametrize("value", ["abc", "-1", "99999999", "1.5", ""])
def test_bad_inference_header_length(port, value):
    body, headers = _binary_request([("INPUT0", "FP32", [1, 1], b"\0" * 4)], header_override=value)
    status, _, resp = call(port, "POST", "/v2/models/identity/infer", body, headers)
    assert status == 400
    assert error_of(resp) == f"inference header size should be in range (0, {len(body)}), got: {value}"


def test_body_too_large_refused_before_reading(port):
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        conn.sendall(
            b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\n{"
        )
        data = read_until_closed(conn)
    finally:
        conn.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert b"connection: close" in head.lower()
    message = error_of(body)
    assert "Request JSON size of 10000000000 bytes exceeds the maximum allowed value" in message
    assert "Use --http-max-input-size to increase the limit" in message


def test_chunked_body_capped_while_reading(port):
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        conn.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n" % 65536 + b" " * 65536 + b"\r\n"
        try:
            for _ in range(MAX_INPUT // 65536 + 4):
                conn.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = read_until_closed(conn)
    finally:
        conn.close()
    assert data.startswith(b"HTTP/1.1 400")
    assert b"exceeds the maximum allowed value" in data


def read_until_closed(conn: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            data = conn.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


def test_slow_body_is_cut_off(port):
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        conn.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"inp")
        data = read_until_closed(conn)
    finally:
        conn.close()
    assert data.startswith(b"HTTP/1.1 408")
    assert b"request body was not received within 1 seconds" in data


def test_slow_headers_are_cut_off(port):
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        conn.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
        data = read_until_closed(conn)
    finally:
        conn.close()
    assert data.startswith(b"HTTP/1.1 408")
    assert b"request headers were not received within 1 seconds" in data


def test_idle_connection_is_closed(port):
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        assert read_until_closed(conn) == b""
    finally:
        conn.close()


def test_huge_headers_are_refused(port):
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        conn.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: ")
        try:
            for _ in range(64):
                conn.sendall(b"a" * 8192)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = read_until_closed(conn)
    finally:
        conn.close()
    assert data.startswith(b"HTTP/1.1 431")
    assert b"request headers exceed the maximum" in data


def test_garbage_request_line(port):
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        conn.sendall(b"\x00\x01\x02 nonsense\r\n\r\n")
        data = read_until_closed(conn)
    finally:
        conn.close()
    assert data.startswith(b"HTTP/1.1 400")


def test_still_serving_after_abuse(client):
    inp = httpclient.InferInput("INPUT0", [1, 3], "FP32")
    inp.set_data_from_numpy(np.ones((1, 3), np.float32))
    for _ in range(3):
        assert client.infer("identity", [inp]).as_numpy("OUTPUT0").tolist() == [[1.0, 1.0, 1.0]]


def test_keep_alive_survives_client_errors(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        for body in (b"{bad", b'{"inputs": []}', b"{bad"):
            conn.request("POST", "/v2/models/identity/infer", body=body)
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 400
        conn.request("GET", "/v2/health/ready")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read() == b""
    finally:
        conn.close()


def test_pipelined_requests_are_answered_in_order(port):
    doc = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [7]}]}).encode()
    infer = (b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(doc)) + doc
    live = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    last = b"GET /v2/nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        conn.sendall(infer + live + infer + last)
        data = read_until_closed(conn)
    finally:
        conn.close()
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", data)
    assert statuses == [b"200", b"200", b"200", b"404"]
    assert data.count(b'"data":[7.0]') == 2


def test_logging_settings(port, client):
    assert client.get_log_settings()["log_file"] == ""
    updated = client.update_log_settings({"log_verbose_level": 2})
    assert updated["log_verbose_level"] == 2 and client.get_log_settings()["log_verbose_level"] == 2
    status, _, body = call(port, "POST", "/v2/logging", b'{"log_file": "/tmp/x"}')
    assert status == 501 and error_of(body) == "log file location can not be updated through network protocol"
    status, _, body = call(port, "POST", "/v2/logging", b"")
    assert status == 400 and "failed to parse the request JSON buffer" in error_of(body)
    status, _, body = call(port, "PUT", "/v2/logging", b"{}")
    assert status == 405
