"""BLS from Python models: exec() and async_exec() into ONNX and Python models, decoupled iterators, errors."""

from __future__ import annotations

import numpy as np
import pytest

from naiad import Server
from tests.integration.test_python_backend_support import (
    REPEAT_CONFIG,
    REPEAT_PY,
    add_sub,
    write_model,
)
from tests.support.onnx_models import add_sub_model

BLS_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""

BLS_SYNC_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            onnx = pb_utils.InferenceRequest(
                model_name="onnx_add_sub", inputs=request.inputs(), requested_output_names=["OUTPUT0"]).exec()
            python = pb_utils.InferenceRequest(
                model_name="py_add_sub", inputs=request.inputs(), requested_output_names=["OUTPUT1"],
                parameters={"via": "bls"}).exec()
            missing = pb_utils.InferenceRequest(
                model_name="no_such_model", inputs=request.inputs(), requested_output_names=["OUTPUT0"]).exec()
            for response in (onnx, python):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
            out0 = pb_utils.get_output_tensor_by_name(onnx, "OUTPUT0")
            out1 = pb_utils.get_output_tensor_by_name(python, "OUTPUT1")
            responses.append(pb_utils.InferenceResponse(
                [out0, out1],
                parameters={"missing_error": missing.error().message() if missing.has_error() else "",
                            "missing_code": missing.error().code() if missing.has_error() else -1,
                            "onnx_outputs": len(onnx.output_tensors())}))
        return responses
"""

BLS_ASYNC_PY = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            calls = [
                pb_utils.InferenceRequest(model_name=model, inputs=request.inputs(),
                                          requested_output_names=["OUTPUT0", "OUTPUT1"]).async_exec()
                for model in ("onnx_add_sub", "py_add_sub")
            ]
            onnx, python = await asyncio.gather(*calls)
            repeat = pb_utils.InferenceRequest(
                model_name="repeat", inputs=[pb_utils.Tensor("IN", np.array([3], dtype=np.int32))],
                requested_output_names=["OUT"])
            streamed = []
            for response in repeat.exec(decoupled=True):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                if len(response.output_tensors()) > 0:
                    streamed.append(int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0]))
            out0 = pb_utils.get_output_tensor_by_name(onnx, "OUTPUT0").as_numpy()
            out1 = pb_utils.get_output_tensor_by_name(python, "OUTPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", out0), pb_utils.Tensor("OUTPUT1", out1)],
                parameters={"streamed": ",".join(map(str, streamed))}))
        return responses
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("blsrepo")
    add_sub_model(repo, "onnx_add_sub")
    add_sub(repo, "py_add_sub")
    write_model(repo, "repeat", REPEAT_CONFIG, REPEAT_PY)
    write_model(repo, "bls_sync", BLS_CONFIG, BLS_SYNC_PY)
    write_model(repo, "bls_async", BLS_CONFIG, BLS_ASYNC_PY)
    with Server(model_repository=str(repo)) as running:
        yield running


def _inputs(rows: int = 2) -> dict[str, np.ndarray]:
    a = np.arange(16 * rows, dtype=np.float32).reshape(rows, 16)
    return {"INPUT0": a, "INPUT1": np.full((rows, 16), 3, np.float32)}


def _infer_with_parameters(server: Server, model: str, inputs: dict):
    import asyncio

    from naiad.protocol.types import InferenceRequest, InferInput

    request = InferenceRequest(model, [InferInput(n, "FP32", a.shape, a) for n, a in inputs.items()])
    return asyncio.run_coroutine_threadsafe(server.infer_async(request), server._loop).result(60)


def test_bls_exec_onnx_and_python(server):
    inputs = _inputs()
    response = _infer_with_parameters(server, "bls_sync", inputs)
    np.testing.assert_array_equal(response.output("OUTPUT0").data, inputs["INPUT0"] + inputs["INPUT1"])
    np.testing.assert_array_equal(response.output("OUTPUT1").data, inputs["INPUT0"] - inputs["INPUT1"])
    assert response.parameters["onnx_outputs"] == 1  # only the requested output comes back
    assert "no_such_model" in response.parameters["missing_error"]
    assert response.parameters["missing_code"] == 2  # TritonError.NOT_FOUND


def test_bls_async_exec_and_decoupled_iterator(server):
    inputs = _inputs(3)
    response = _infer_with_parameters(server, "bls_async", inputs)
    np.testing.assert_array_equal(response.output("OUTPUT0").data, inputs["INPUT0"] + inputs["INPUT1"])
    np.testing.assert_array_equal(response.output("OUTPUT1").data, inputs["INPUT0"] - inputs["INPUT1"])
    assert response.parameters["streamed"] == "0,1,2"


def test_bls_counts_in_callee_statistics(server):
    before = server.model_statistics("py_add_sub")["model_stats"][0]["inference_stats"]["success"]["count"]
    server.infer("bls_sync", _inputs(1))
    after = server.model_statistics("py_add_sub")["model_stats"][0]["inference_stats"]["success"]["count"]
    assert after == before + 1


BIG_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

BIG_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("OUTPUT1", x * 2)]))
        return out
"""


def test_large_outputs_are_lent_and_handed_back(tmp_path):
    import gc

    from tests.support.waiting import wait_until

    write_model(tmp_path, "big", BIG_CONFIG, BIG_PY)
    data = np.random.default_rng(3).random(262144, dtype=np.float32)  # 1 MiB: above the zero-copy threshold
    with Server(model_repository=str(tmp_path)) as server:
        session = server.models.lookup("big").pool.instances[0]._serving
        for _ in range(20):
            out = server.infer("big", {"INPUT0": data})
            np.testing.assert_array_equal(out["OUTPUT0"], data)
            np.testing.assert_array_equal(out["OUTPUT1"], data * 2)
        held = dict(session.outputs._holds)
        assert held  # the last response still lends the worker's block
        del out
        gc.collect()
        wait_until(lambda: not session.outputs._holds)
