"""Python backend through the in-process Server: values, dtypes, errors, initialize args, auto-complete, decoupled."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from naiad import ErrorCode, NaiadError, Server
from naiad.protocol.types import InferenceRequest, InferInput
from tests.integration.test_python_backend_support import (
    ALL_TYPES,
    ERROR_PY,
    INIT_RAISE_PY,
    RAISE_PY,
    REPEAT_CONFIG,
    REPEAT_PY,
    SIMPLE_CONFIG,
    add_sub,
    identity_all_types,
    write_model,
)

ARGS_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args

    def execute(self, requests):
        out = []
        for r in requests:
            info = {
                "args": self.args,
                "request_id": r.request_id(),
                "parameters": json.loads(r.parameters()),
                "requested": r.requested_output_names(),
                "model_name": r.model_name(),
                "model_version": r.model_version(),
                "correlation_id": r.correlation_id(),
                "flags": r.flags(),
                "is_cancelled": r.is_cancelled(),
                "dtype": pb_utils.get_input_tensor_by_name(r, "INPUT0").triton_dtype(),
                "is_cpu": pb_utils.get_input_tensor_by_name(r, "INPUT0").is_cpu(),
            }
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", np.array([json.dumps(info).encode()], dtype=np.object_))],
                parameters={"echo": "yes", "count": 2}))
        return out
"""

ARGS_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
parameters { key: "greeting" value: { string_value: "hello" } }
"""

AUTO_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2)]) for r in requests]
"""

OPTIONAL_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            extra = pb_utils.get_input_tensor_by_name(r, "EXTRA")
            value = np.array([-1.0 if extra is None else float(extra.as_numpy().sum())], dtype=np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value), pb_utils.Tensor("UNREQUESTED", value)]))
        return out
"""

OPTIONAL_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "EXTRA" data_type: TYPE_FP32 dims: [ 2 ] optional: true } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

WRONG_RETURN_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return []
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("pyrepo")
    add_sub(repo, "add_sub")
    add_sub(repo, "add_sub_int", "TYPE_INT32")
    add_sub(repo, "add_sub_bytes", "TYPE_STRING")
    identity_all_types(repo)
    write_model(repo, "errors", SIMPLE_CONFIG, ERROR_PY)
    write_model(repo, "raiser", SIMPLE_CONFIG, RAISE_PY)
    write_model(repo, "init_raiser", SIMPLE_CONFIG, INIT_RAISE_PY)
    write_model(repo, "args", ARGS_CONFIG, ARGS_PY)
    write_model(repo, "auto", 'backend: "python"\n', AUTO_PY)
    write_model(repo, "repeat", REPEAT_CONFIG, REPEAT_PY)
    write_model(repo, "optional", OPTIONAL_CONFIG, OPTIONAL_PY)
    write_model(repo, "wrong_return", SIMPLE_CONFIG, WRONG_RETURN_PY)
    with Server(model_repository=str(repo)) as running:
        yield running


def run(server: Server, coroutine, timeout: float = 60.0):
    return asyncio.run_coroutine_threadsafe(coroutine, server._loop).result(timeout)


def request(model: str, **inputs: np.ndarray) -> InferenceRequest:
    from naiad.protocol.datatypes import datatype_of_array

    return InferenceRequest(model, [InferInput(n, datatype_of_array(a), tuple(a.shape), a) for n, a in inputs.items()])


def test_add_sub_fp32_values(server):
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.full((2, 16), 0.5, dtype=np.float32)
    out = server.infer("add_sub", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)
    assert out["OUTPUT0"].dtype == np.float32 and out["OUTPUT0"].shape == (2, 16)


def test_add_sub_int32(server):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    out = server.infer("add_sub_int", {"INPUT0": a, "INPUT1": a * 3})
    np.testing.assert_array_equal(out["OUTPUT0"], a * 4)
    np.testing.assert_array_equal(out["OUTPUT1"], -2 * a)


def test_add_sub_bytes_are_bytes_objects(server):
    a = np.array([[f"a{i}".encode() for i in range(16)]], dtype=np.object_)
    b = np.array([["é".encode(), b""] * 8], dtype=np.object_)
    out = server.infer("add_sub_bytes", {"INPUT0": a, "INPUT1": b})
    assert out["OUTPUT0"].dtype == np.object_
    assert out["OUTPUT0"][0, 0] == b"a0" + "é".encode() and out["OUTPUT0"][0, 1] == b"a1"
    assert out["OUTPUT1"][0, 12] == b"21a"
    assert all(isinstance(x, bytes) for x in out["OUTPUT1"].ravel())


@pytest.mark.parametrize("datatype", sorted(ALL_TYPES))
def test_identity_every_datatype(server, datatype):
    rng = np.random.default_rng(7)
    inputs = {}
    for name in ALL_TYPES:
        if name == "BYTES":
            inputs["IN_BYTES"] = np.array([b"x" * i for i in range(5)] + [b"\x00end\x00"], dtype=np.object_)
        elif name == "BOOL":
            inputs["IN_BOOL"] = np.array([True, False, True])
        else:
            from naiad.protocol.datatypes import numpy_dtype

            inputs[f"IN_{name}"] = (rng.random(7) * 100).astype(numpy_dtype(name))
    out = server.infer("identity_all", inputs)
    got, sent = out[f"OUT_{datatype}"], inputs[f"IN_{datatype}"]
    assert got.dtype == sent.dtype
    np.testing.assert_array_equal(got, sent)


def test_empty_tensor(server):
    from naiad.protocol.datatypes import numpy_dtype

    inputs = {f"IN_{n}": np.zeros((0,), dtype=numpy_dtype(n)) for n in ALL_TYPES}
    out = server.infer("identity_all", inputs)
    assert out["OUT_FP32"].shape == (0,) and out["OUT_BYTES"].shape == (0,)


def test_error_response_default_internal(server):
    with pytest.raises(NaiadError) as info:
        server.infer("errors", {"INPUT0": np.ones(2, np.float32)})
    assert info.value.code == ErrorCode.INTERNAL
    assert info.value.message == "custom error response"


def test_error_response_code_is_kept(server):
    req = request("errors", INPUT0=np.ones(2, np.float32))
    req.id = "bad-arg"
    with pytest.raises(NaiadError) as info:
        run(server, server.infer_async(req))
    assert info.value.code == ErrorCode.INVALID_ARG
    assert info.value.code.http_status == 400


def test_exception_in_execute(server):
    with pytest.raises(NaiadError) as info:
        server.infer("raiser", {"INPUT0": np.ones(1, np.float32)})
    message = info.value.message
    assert info.value.code == ErrorCode.INTERNAL
    assert message.startswith("Failed to process the request(s) for model 'raiser_0', message: ValueError: boom from execute")
    assert "\n\nAt:\n" in message and "model.py(3): _helper\n" in message and "model.py(8): execute\n" in message


def test_wrong_number_of_responses(server):
    with pytest.raises(NaiadError) as info:
        server.infer("wrong_return", {"INPUT0": np.ones(1, np.float32)})
    assert info.value.message == (
        "Failed to process the request(s) for model 'wrong_return_0', message: Number of InferenceResponse objects do "
        "not match the number of InferenceRequest objects. InferenceRequest(s) size is:1, and InferenceResponse(s) "
        "size is:0\n")


def test_initialize_exception_makes_model_unavailable(server):
    entry = next(e for e in server.repository_index() if e["name"] == "init_raiser")
    assert entry["state"] == "UNAVAILABLE"
    assert entry["reason"].startswith("Internal: RuntimeError: init exploded\n\nAt:\n")
    assert "init_raiser/1/model.py(4): initialize\n" in entry["reason"]
    with pytest.raises(NaiadError) as info:
        server.infer("init_raiser", {"INPUT0": np.ones(1, np.float32)})
    assert info.value.code == ErrorCode.NOT_FOUND


def test_initialize_args_and_request_accessors(server, tmp_path_factory):
    req = request("args", INPUT0=np.ones(3, np.float32))
    req.id = "req-7"
    req.parameters = {"flag": True, "n": 3, "s": "text"}
    response = run(server, server.infer_async(req))
    info = json.loads(response.outputs[0].data[0])
    args = info["args"]
    assert sorted(args) == sorted([
        "model_config", "model_instance_kind", "model_instance_name", "model_instance_device_id",
        "model_repository", "model_version", "model_name",
    ])
    assert args["model_instance_kind"] == "CPU" and args["model_instance_name"] == "args_0"
    assert args["model_instance_device_id"] == "0" and args["model_version"] == "1" and args["model_name"] == "args"
    assert args["model_repository"].endswith("/args")
    config = json.loads(args["model_config"])
    assert config["name"] == "args" and config["parameters"] == {"greeting": {"string_value": "hello"}}
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert info["request_id"] == "req-7"
    assert info["parameters"] == {"flag": True, "n": 3, "s": "text"}
    assert info["requested"] == ["OUTPUT0"]
    assert info["model_name"] == "args" and info["model_version"] == 1
    assert info["correlation_id"] == 0 and info["flags"] == 0 and info["is_cancelled"] is False
    assert info["dtype"] == 11 and info["is_cpu"] is True
    assert response.parameters == {"echo": "yes", "count": 2}


def test_auto_complete_config_fills_the_config(server):
    config = server.model_config_dict("auto")
    assert config["max_batch_size"] == 4
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("X", "TYPE_FP32", [4])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [("Y", "TYPE_FP32", [4])]
    assert "dynamic_batching" in config
    out = server.infer("auto", {"X": np.ones((2, 4), np.float32)})
    np.testing.assert_array_equal(out["Y"], np.full((2, 4), 2, np.float32))


def test_optional_input_and_unrequested_output(server):
    out = server.infer("optional", {"INPUT0": np.ones(1, np.float32)})
    assert out["OUTPUT0"][0] == -1.0 and "UNREQUESTED" not in out
    out = server.infer("optional", {"INPUT0": np.ones(1, np.float32), "EXTRA": np.array([2, 3], np.float32)})
    assert out["OUTPUT0"][0] == 5.0


async def _collect(server: Server, count: int) -> list:
    items = []
    async for response, final in server.infer_stream(request("repeat", IN=np.array([count], np.int32))):
        items.append((None if response is None else int(response.output("OUT").data[0]), final))
    return items


def test_decoupled_repeat_stream(server):
    items = run(server, _collect(server, 4))
    assert items == [(0, False), (1, False), (2, False), (3, False), (None, True)]


def test_decoupled_zero_responses(server):
    assert run(server, _collect(server, 0)) == [(None, True)]


def test_decoupled_refused_by_infer_async(server):
    with pytest.raises(NaiadError) as info:
        server.infer("repeat", {"IN": np.array([2], np.int32)})
    assert info.value.code == ErrorCode.UNSUPPORTED


def test_many_concurrent_requests(server):
    async def many():
        reqs = []
        for i in range(200):
            a = np.full((1, 16), i, np.float32)
            reqs.append(server.infer_async(request("add_sub", INPUT0=a, INPUT1=a)))
        return await asyncio.gather(*reqs)

    responses = run(server, many())
    assert [float(r.output("OUTPUT0").data[0, 0]) for r in responses] == [2.0 * i for i in range(200)]


BF16_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_BF16 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_BF16 dims: [ -1 ] } ]
"""

BF16_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            tensor = pb_utils.get_input_tensor_by_name(r, "IN")
            try:
                tensor.as_numpy()
                raise pb_utils.TritonModelException("as_numpy() of a BF16 tensor should fail")
            except pb_utils.TritonModelException as exc:
                if "should fail" in str(exc):
                    raise
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("OUT", tensor.to_dlpack())]))
        return out
"""


def test_bf16_round_trip_through_dlpack(tmp_path):
    write_model(tmp_path, "bf16", BF16_CONFIG, BF16_PY)
    words = np.array([0x3F80, 0x4000, 0xC040], dtype=np.uint16)
    with Server(model_repository=str(tmp_path)) as server:
        response = run(server, server.infer_async(InferenceRequest("bf16", [InferInput("IN", "BF16", (3,), words)])))
    out = response.output("OUT")
    assert out.datatype == "BF16"
    np.testing.assert_array_equal(out.data, words)
