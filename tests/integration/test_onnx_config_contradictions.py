"""The real server refuses at load time an ONNX model whose config contradicts the model (names, datatypes,
ranks, dims), with Triton's ONNX Runtime backend's reason naming the tensor; legitimate configs still load."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.onnx_models import (
    add_sub_model,
    identity_onnx,
    io_block,
    reshape_model,
    write_config,
)
from tests.support.servers import RunningServer, post_json, start_server

REFUSED = {
    # model INPUT0/INPUT1 [-1, 16]: with max_batch_size 8 the complete config shape is [-1, 1, 16]
    "batched_rank": ("INPUT0", "model 'batched_rank', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) "
                     "but the model configuration specifies 3 dimensions (an initial batch dimension because "
                     "max_batch_size > 0 followed by the explicit tensor shape, making complete shape [-1,1,16])"),
    "wrong_dtype": ("INPUT0", "unable to load model 'wrong_dtype', configuration expects datatype TYPE_INT32 for "
                    "input 'INPUT0', model provides TYPE_FP32"),
    "unknown_input": ("INPUT9", "unexpected inference input 'INPUT9', allowed inputs are: INPUT0, INPUT1"),
    "unknown_output": ("OUTPUT9", "unexpected inference output 'OUTPUT9', allowed outputs are: OUTPUT0, OUTPUT1"),
    "wrong_rank": ("INPUT0", "model 'wrong_rank', tensor 'INPUT0': the model expects 2 dimensions (shape [16,16]) "
                   "but the model configuration specifies 1 dimensions (shape [256])"),
    # outputs must match exactly: the model's -1 is not [1]
    "output_not_exact": ("OUTPUT0", "model 'output_not_exact', tensor 'OUTPUT0': the model expects 2 dimensions "
                         "(shape [-1,16]) but the model configuration specifies 2 dimensions (shape [1,16])"),
}


def _add_sub_config(name: str, max_batch_size: int, inputs: list[tuple[str, str, list[int]]],
                    outputs: list[tuple[str, str, list[int]]]) -> str:
    config = f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: {max_batch_size}\n'
    config += "".join(io_block("input", n, t, d) for n, t, d in inputs)
    config += "".join(io_block("output", n, t, d) for n, t, d in outputs)
    return config


def _identity(repo: Path, name: str, input_dims: list[int], output_dims: list[int]) -> None:
    """Model shape [-1, 16] (a free first dimension), max_batch_size 0."""
    identity_onnx(repo / name / "1" / "model.onnx", "FP32", ["n", 16])
    write_config(repo / name, f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
                 + io_block("input", "INPUT0", "FP32", input_dims) + io_block("output", "OUTPUT0", "FP32", output_dims))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("onnx_contradictions") / "models"
    fp32 = [("INPUT0", "FP32", [16]), ("INPUT1", "FP32", [16])]
    outs = [("OUTPUT0", "FP32", [16]), ("OUTPUT1", "FP32", [16])]
    cases = {
        "batched_rank": (8, [("INPUT0", "FP32", [1, 16]), ("INPUT1", "FP32", [16])], outs),
        "wrong_dtype": (8, [("INPUT0", "INT32", [16]), ("INPUT1", "FP32", [16])], outs),
        "unknown_input": (8, [("INPUT0", "FP32", [16]), ("INPUT9", "FP32", [16])], outs),
        "unknown_output": (8, fp32, [("OUTPUT0", "FP32", [16]), ("OUTPUT9", "FP32", [16])]),
    }
    for name, (mbs, inputs, outputs) in cases.items():
        add_sub_model(repo, name)
        write_config(repo / name, _add_sub_config(name, mbs, inputs, outputs))
    identity_onnx(repo / "wrong_rank" / "1" / "model.onnx", "FP32", [16, 16])
    write_config(repo / "wrong_rank", _add_sub_config("wrong_rank", 0, [("INPUT0", "FP32", [256])],
                                                       [("OUTPUT0", "FP32", [16, 16])]))
    _identity(repo, "output_not_exact", [1, 16], [1, 16])
    # Legitimate: a config dim may fix an input's free model dim; batching strips the model's -1; reshape.
    _identity(repo, "input_more_specific", [1, 16], [-1, 16])
    add_sub_model(repo, "batched")
    reshape_model(repo, "reshaped")
    with start_server(repo, "--exit-on-error=false", "--model-control-mode=explicit", "--load-model=*") as running:
        yield running


def _index(server: RunningServer) -> dict[str, dict]:
    status, body = post_json(f"http://{server.http_url}/v2/repository/index", {})
    assert status == 200
    return {e["name"]: e for e in json.loads(body)}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_contradicting_config_is_refused_at_load_naming_the_tensor(server: RunningServer, name: str) -> None:
    tensor, reason = REFUSED[name]
    entry = _index(server)[name]
    assert entry["state"] == "UNAVAILABLE"
    assert entry["reason"] == f"Invalid argument: {reason}" and f"'{tensor}'" in reason
    status, body = post_json(f"http://{server.http_url}/v2/repository/models/{name}/load", {})
    assert status == 400
    assert json.loads(body)["error"] == (f"load failed for model '{name}': version 1 is at UNAVAILABLE state: "
                                         f"Invalid argument: {reason};\n")
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.is_model_ready(name) is False


def test_legitimate_configs_load_and_serve(server: RunningServer) -> None:
    index = _index(server)
    for name in ("input_more_specific", "batched", "reshaped"):
        assert index[name]["state"] == "READY", index[name]
    client = httpclient.InferenceServerClient(server.http_url)
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    inp = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer("input_more_specific", [inp]).as_numpy("OUTPUT0"), x)
    inputs = [httpclient.InferInput("INPUT0", [2, 16], "FP32"), httpclient.InferInput("INPUT1", [2, 16], "FP32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((2, 16), np.float32))
    assert client.infer("batched", inputs).as_numpy("OUTPUT0").tolist() == [[2.0] * 16] * 2
    r = httpclient.InferInput("X", [1, 4], "FP32")
    r.set_data_from_numpy(np.array([[1, 2, 3, 4]], np.float32))
    assert client.infer("reshaped", [r]).as_numpy("Y").tolist() == [[1, 3, 2, 4]]


def test_strict_model_config_checks_the_input_count(tmp_path: Path) -> None:
    """Without auto-complete nothing fills a left-out input: the count is refused as Triton words it."""
    add_sub_model(tmp_path, "partial")
    write_config(tmp_path / "partial", _add_sub_config("partial", 8, [("INPUT0", "FP32", [16])],
                                                       [("OUTPUT0", "FP32", [16])]))
    add_sub_model(tmp_path, "complete")
    with start_server(tmp_path, "--strict-model-config=true", "--exit-on-error=false") as running:
        index = _index(running)
        assert index["partial"]["state"] == "UNAVAILABLE"
        assert index["partial"]["reason"] == ("Invalid argument: unable to load model 'partial', configuration expects "
                                              "1 inputs, model provides 2")
        assert index["complete"]["state"] == "READY"
