"""OpenVINO backend in-process: IR auto-complete, ONNX through OpenVINO, batch reshaping, the missing-package message."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import naiad
from naiad.backends.registry import BackendRegistry, BackendUnavailable
from tests.support import framework_models as fm
from tests.support.onnx_models import add_sub_onnx


def test_missing_openvino_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` now raises ImportError
    monkeypatch.delitem(sys.modules, "naiad.backends.openvino_backend", raising=False)
    with pytest.raises(BackendUnavailable) as err:
        BackendRegistry().get("openvino")
    message = str(err.value)
    assert "the OpenVINO backend needs the 'openvino' package" in message
    assert "pip install 'naiad[openvino]'" in message


ov = pytest.importorskip("openvino")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("ov_repo")
    weights = fm.save_openvino_ir(fm.version_dir(root, "ir_auto") / "model.xml")
    fm.save_openvino_ir(fm.version_dir(root, "ir_f32") / "model.xml")
    fm.write_config(
        root / "ir_f32",
        'backend: "openvino"\nparameters { key: "INFERENCE_PRECISION_HINT" value: { string_value: "f32" } }\n'
        'parameters { key: "INFERENCE_NUM_THREADS" value: { string_value: "1" } }\n',
    )
    fm.save_openvino_ir(fm.version_dir(root, "ir_static") / "model.xml", batch_dim=1)
    fm.write_config(
        root / "ir_static",
        'backend: "openvino"\nmax_batch_size: 8\ninput [{ name: "X" data_type: TYPE_FP32 dims: [ 8 ] }]\n'
        'output [{ name: "Y" data_type: TYPE_FP32 dims: [ 3 ] }]\n'
        'parameters { key: "INFERENCE_PRECISION_HINT" value: { string_value: "f32" } }\n',
    )
    add_sub_onnx(fm.version_dir(root, "onnx_via_ov") / "model.onnx", dims=4)
    fm.write_config(root / "onnx_via_ov", 'backend: "openvino"\ndefault_model_filename: "model.onnx"\n')
    fm.save_openvino_ir(fm.version_dir(root, "bad_name") / "model.xml")
    fm.write_config(root / "bad_name", 'backend: "openvino"\ninput [{ name: "INPUT" data_type: TYPE_FP32 dims: [ 8 ] }]\n')
    return root, weights


@pytest.fixture(scope="module")
def server(repo):
    with naiad.Server(model_repository=str(repo[0]), exit_on_error=False) as srv:
        yield srv


def _openvino_in_process(path, x):
    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(path)), "CPU")
    return compiled.create_infer_request().infer({"X": x})[compiled.outputs[0]]


def test_ir_without_config_is_auto_completed_and_matches_openvino(server, repo):
    config = server.model_config_dict("ir_auto")
    assert config["backend"] == "openvino"
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("X", "TYPE_FP32", [8])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [("Y", "TYPE_FP32", [3])]
    x = fm.features(3, seed=8)
    expected = _openvino_in_process(repo[0] / "ir_auto" / "1" / "model.xml", x)
    np.testing.assert_allclose(server.infer("ir_auto", {"X": x})["Y"], expected, rtol=1e-5, atol=1e-6)


def test_full_precision_hint_matches_numpy(server, repo):
    weights, bias = repo[1]
    x = fm.features(4, seed=9)
    np.testing.assert_allclose(server.infer("ir_f32", {"X": x})["Y"], np.maximum(x @ weights + bias, 0), rtol=1e-5, atol=1e-5)


def test_static_batch_ir_is_reshaped_for_batching(server, repo):
    weights, bias = repo[1]
    x = fm.features(5, seed=10)
    np.testing.assert_allclose(server.infer("ir_static", {"X": x})["Y"], np.maximum(x @ weights + bias, 0), rtol=1e-5, atol=1e-5)


def test_onnx_through_openvino(server):
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.ones((2, 4), np.float32)
    out = server.infer("onnx_via_ov", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_allclose(out["OUTPUT0"], a + b)
    np.testing.assert_allclose(out["OUTPUT1"], a - b)


def test_unknown_tensor_name_is_a_load_error(server):
    entry = {e["name"]: e for e in server.repository_index()}["bad_name"]
    assert entry["state"] == "UNAVAILABLE"
    assert "'INPUT' is not an input or output of the OpenVINO model" in entry["reason"]
