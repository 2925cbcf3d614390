"""The navigator's correctness check and choice, in process on real ONNX files (no server)."""

import json

import numpy as np
import pytest
from google.protobuf import text_format
from onnx import helper
from tritonclient.grpc import model_config_pb2 as mc

from naiad.tools.navigate.navigator import NavigateError, NavigateOptions, compare, run_navigate
from tests.support.onnx_models import _save, _tensor, add_sub_onnx


def wrong_add_sub(path, dims=16):
    """Same signature as add_sub, but OUTPUT1 = INPUT0 + INPUT1 (a broken conversion)."""
    shape = ["batch", dims]
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]), helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT1"])],
        "wrong", [_tensor("INPUT0", "FP32", shape), _tensor("INPUT1", "FP32", shape)],
        [_tensor("OUTPUT0", "FP32", shape), _tensor("OUTPUT1", "FP32", shape)])
    _save(helper.make_model(graph), path)


def test_compare_tolerances_shapes_and_nan():
    ref = {"y": np.array([1.0, np.nan, 3.0], dtype=np.float32)}
    assert compare(ref, {"y": np.array([1.00001, np.nan, 3.0], dtype=np.float32)}, 1e-4, 0)[0]
    ok, diffs, why = compare(ref, {"y": np.array([1.1, np.nan, 3.0], dtype=np.float32)}, 1e-4, 1e-4)
    assert not ok and "differs by up to 0.1" in why and diffs["y"] == pytest.approx(0.1, rel=1e-3)
    assert not compare(ref, {"y": np.zeros(4, dtype=np.float32)}, 1, 1)[0]
    assert not compare(ref, {}, 1, 1)[0]
    assert compare({"i": np.arange(3)}, {"i": np.arange(3)}, 0, 0)[0]
    assert not compare({"i": np.arange(3)}, {"i": np.arange(1, 4)}, 10, 10)[0]  # integers must be equal


def options(tmp_path, source, **extra):
    return NavigateOptions(model_name="as", output_repository=tmp_path / "repo", onnx=source,
                           workspace=tmp_path / "ws", batch_sizes=[1, 4], measure_seconds=0.02,
                           formats=["onnx"], **extra)


def test_wrong_variant_is_rejected_and_a_correct_one_written(tmp_path):
    source, wrong = tmp_path / "add_sub.onnx", tmp_path / "wrong.onnx"
    add_sub_onnx(source)
    wrong_add_sub(wrong)
    best = run_navigate(options(tmp_path, source, extra_onnx=[wrong]), out=open(tmp_path / "log.txt", "w"))
    report = json.loads((tmp_path / "ws" / "navigation_report.json").read_text())
    statuses = {v["name"]: v for v in report["variants"]}
    assert statuses["extra-0-wrong"]["status"] == "incorrect"
    assert "OUTPUT1" in statuses["extra-0-wrong"]["error"]
    assert statuses["onnx"]["status"] == "ok" and statuses["onnx-optimized"]["status"] == "ok"
    assert best.name != "extra-0-wrong" and report["chosen"] == best.name
    config = text_format.Parse((tmp_path / "repo" / "as" / "config.pbtxt").read_text(), mc.ModelConfig())
    assert config.name == "as" and config.backend == "onnxruntime" and config.max_batch_size == 4
    assert [(i.name, list(i.dims)) for i in config.input] == [("INPUT0", [16]), ("INPUT1", [16])]
    assert (tmp_path / "repo" / "as" / "1" / "model.onnx").is_file()


def test_nothing_correct_is_an_error(tmp_path):
    source, wrong = tmp_path / "add_sub.onnx", tmp_path / "wrong.onnx"
    add_sub_onnx(source)
    wrong_add_sub(wrong)
    opts = options(tmp_path, source, extra_onnx=[wrong])
    opts.formats = []  # only the extra candidate
    with pytest.raises(NavigateError, match="no variant produced the original's outputs"):
        run_navigate(opts, out=open(tmp_path / "log.txt", "w"))


def test_samples_file_and_non_batching_model(tmp_path):
    source = tmp_path / "nb.onnx"
    add_sub_onnx(source, dims=4, batch=False)
    samples = tmp_path / "s.npz"
    np.savez(samples, INPUT0=np.ones(4, np.float32), INPUT1=np.arange(4, dtype=np.float32))
    opts = options(tmp_path, source, sample_inputs=samples)
    run_navigate(opts, out=open(tmp_path / "log.txt", "w"))
    config = text_format.Parse((tmp_path / "repo" / "as" / "config.pbtxt").read_text(), mc.ModelConfig())
    assert config.max_batch_size == 0 and list(config.input[0].dims) == [4]
    np.savez(samples, OTHER=np.ones(4, np.float32))
    with pytest.raises(NavigateError, match="no array for input"):
        run_navigate(opts, out=open(tmp_path / "log2.txt", "w"))


def test_openvino_variant_when_installed(tmp_path):
    pytest.importorskip("openvino")
    source = tmp_path / "add_sub.onnx"
    add_sub_onnx(source)
    opts = options(tmp_path, source)
    opts.formats = ["openvino"]
    best = run_navigate(opts, out=open(tmp_path / "log.txt", "w"))
    assert best.name == "onnx-openvino" and best.status == "ok"
    config = text_format.Parse((tmp_path / "repo" / "as" / "config.pbtxt").read_text(), mc.ModelConfig())
    assert config.backend == "openvino"
    assert {p.name for p in (tmp_path / "repo" / "as" / "1").iterdir()} == {"model.xml", "model.bin"}
