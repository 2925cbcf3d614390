"""PyTorch backend in-process: TorchScript naming conventions, outputs, parameters, torch.export programs."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

import naiad
from naiad.backends.base import InstanceSpec, ModelSource
from naiad.config.model_config import ConfigError, parse_config_text
from tests.support import framework_models as fm

torch = pytest.importorskip("torch")

from naiad.backends import pytorch_backend as ptb  # noqa: E402  (needs torch)

# torch 2.13 marks TorchScript deprecated (it is what Triton's PyTorch backend serves) and warns from export internals.
pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec:FutureWarning"),
]


def _io(kind: str, tensors: list[tuple[str, str, list[int]]]) -> str:
    body = ", ".join(f'{{ name: "{n}" data_type: {t} dims: {d} }}' for n, t, d in tensors)
    return f"{kind} [ {body} ]\n"


def _config(head: str, inputs, outputs, extra: str = "") -> str:
    return head + _io("input", inputs) + _io("output", outputs) + extra


def _param(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'


F4 = [4]
BATCH8 = 'backend: "pytorch"\nmax_batch_size: 8\n'


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("pt_repo")
    models = {
        # forward(input0, input1): names listed in the reverse order still bind by argument name
        "by_arg_name": ("add_sub", _config(BATCH8, [("input1", "TYPE_FP32", F4), ("input0", "TYPE_FP32", F4)],
                                          [("OUTPUT__1", "TYPE_FP32", F4), ("OUTPUT__0", "TYPE_FP32", F4)])),
        # INPUT__1 listed first: bound by index
        "by_index": ("add_sub", _config(BATCH8, [("INPUT__1", "TYPE_FP32", F4), ("INPUT__0", "TYPE_FP32", F4)],
                                       [("OUTPUT__0", "TYPE_FP32", F4), ("OUTPUT__1", "TYPE_FP32", F4)])),
        # neither convention: config order
        "by_order": ("add_sub", _config('platform: "pytorch_libtorch"\nmax_batch_size: 0\n',
                                       [("A", "TYPE_FP32", [2]), ("B", "TYPE_FP32", [2])],
                                       [("SUM", "TYPE_FP32", [2]), ("DIFF", "TYPE_FP32", [2])])),
        "dict_input": ("dict_input", _config(BATCH8, [("b", "TYPE_FP32", [2]), ("a", "TYPE_FP32", [2])],
                                            [("OUTPUT__0", "TYPE_FP32", [2])])),
        "labels": ("labels", _config(BATCH8, [("INPUT__0", "TYPE_FP32", [1])], [("OUTPUT__0", "TYPE_STRING", [1])])),
        "int_ops": ("int_ops", _config(BATCH8, [("x", "TYPE_INT32", [3]), ("flag", "TYPE_BOOL", [3])],
                                      [("OUTPUT__0", "TYPE_INT32", [3]), ("OUTPUT__1", "TYPE_BOOL", [3])])),
        "params": ("linear", _config(BATCH8, [("x", "TYPE_FP32", [8])], [("probs", "TYPE_FP32", [3])],
                                    _param("INFERENCE_MODE", "false") + _param("DISABLE_OPTIMIZED_EXECUTION", "true")
                                    + "instance_group [{ kind: KIND_CPU count: 2 }]\ndynamic_batching { }\n")),
        "wrong_dtype": ("int_ops", _config(BATCH8, [("x", "TYPE_INT32", [3]), ("flag", "TYPE_BOOL", [3])],
                                          [("OUTPUT__0", "TYPE_FP32", [3])])),
        "too_many_inputs": ("linear", _config(BATCH8, [("x", "TYPE_FP32", [8]), ("y", "TYPE_FP32", [8])],
                                             [("OUTPUT__0", "TYPE_FP32", [3])])),
        "no_config": ("linear", None),
        "outputs_only_missing": ("linear", BATCH8 + _io("input", [("x", "TYPE_FP32", [8])])),
    }
    for name, (module, config) in models.items():
        fm.save_torchscript(module, fm.version_dir(root, name) / "model.pt")
        if config is not None:
            fm.write_config(root / name, config)
    fm.save_torch_export(fm.version_dir(root, "exported") / "model.pt2")
    fm.write_config(root / "exported", _config('platform: "torch_aoti"\nmax_batch_size: 16\n',
                                              [("x", "TYPE_FP32", [8])], [("OUTPUT__0", "TYPE_FP32", [3])]))
    (fm.version_dir(root, "not_torchscript") / "model.pt").write_bytes(b"definitely not a zip archive")
    fm.write_config(root / "not_torchscript", _config(BATCH8, [("x", "TYPE_FP32", [8])], [("y", "TYPE_FP32", [3])]))
    return root


@pytest.fixture(scope="module")
def server(repo):
    with naiad.Server(model_repository=str(repo), exit_on_error=False) as srv:
        yield srv


A = np.arange(8, dtype=np.float32).reshape(2, 4)
B = np.full((2, 4), 10.0, dtype=np.float32)


def test_inputs_bind_by_forward_argument_names(server):
    out = server.infer("by_arg_name", {"input0": A, "input1": B})
    np.testing.assert_array_equal(out["OUTPUT__0"], A + B)
    np.testing.assert_array_equal(out["OUTPUT__1"], A - B)


def test_inputs_bind_by_index_suffix(server):
    out = server.infer("by_index", {"INPUT__0": A, "INPUT__1": B})
    np.testing.assert_array_equal(out["OUTPUT__0"], A + B)
    np.testing.assert_array_equal(out["OUTPUT__1"], A - B)


def test_inputs_and_outputs_fall_back_to_config_order(server):
    a, b = np.array([1.0, 2.0], np.float32), np.array([5.0, 7.0], np.float32)
    out = server.infer("by_order", {"A": a, "B": b})
    np.testing.assert_array_equal(out["SUM"], a + b)
    np.testing.assert_array_equal(out["DIFF"], a - b)


def test_dict_input_uses_config_names_as_keys(server):
    a, b = np.array([[1.0, 2.0]], np.float32), np.array([[10.0, 20.0]], np.float32)
    np.testing.assert_array_equal(server.infer("dict_input", {"a": a, "b": b})["OUTPUT__0"], a * 2 + b)


def test_list_of_strings_output(server):
    out = server.infer("labels", {"INPUT__0": np.array([[1.5], [-2.0], [0.1]], np.float32)})["OUTPUT__0"]
    assert out.shape == (3, 1)
    assert out[:, 0].tolist() == [b"pos", b"neg", b"pos"]


def test_integer_and_bool_tensors(server):
    x = np.array([[1, -2, 3]], np.int32)
    flag = np.array([[True, False, True]])
    out = server.infer("int_ops", {"x": x, "flag": flag})
    assert out["OUTPUT__0"].dtype == np.int32 and out["OUTPUT__0"].tolist() == [[3, -6, 9]]
    assert out["OUTPUT__1"].tolist() == [[False, True, False]]


def test_parameters_and_two_instances_match_the_module(server):
    x = fm.features(5, seed=4)
    np.testing.assert_allclose(server.infer("params", {"x": x})["probs"], fm.linear_reference(x), rtol=1e-6, atol=1e-7)
    config = server.model_config_dict("params")
    assert config["instance_group"][0]["count"] == 2


def test_torch_export_program_in_model_pt2(server):
    x = fm.features(6, seed=5)
    np.testing.assert_allclose(server.infer("exported", {"x": x})["OUTPUT__0"], fm.linear_reference(x), rtol=1e-6, atol=1e-7)


def test_output_dtype_mismatch_is_reported(server):
    with pytest.raises(naiad.NaiadError, match="unexpected datatype TYPE_INT32 for inference output 'OUTPUT__0', expecting TYPE_FP32"):
        server.infer("wrong_dtype", {"x": np.ones((1, 3), np.int32), "flag": np.ones((1, 3), bool)})


@pytest.mark.parametrize(
    "name, words",
    [
        ("no_config", ["must list their inputs and outputs in config.pbtxt", "cannot auto-complete"]),
        ("outputs_only_missing", ["must list their outputs"]),
        ("too_many_inputs", ["forward() takes 1", "['x']"]),
        ("not_torchscript", ["unable to load TorchScript model"]),
    ],
)
def test_unloadable_models_say_why(server, name, words):
    entry = {e["name"]: e for e in server.repository_index()}[name]
    assert entry["state"] == "UNAVAILABLE"
    for word in words:
        assert word in entry["reason"]


def _source(repo: Path, name: str, config_text: str) -> ModelSource:
    config = parse_config_text(config_text, "test")
    config.name = name
    return ModelSource(config, 1, repo / name, repo / name / "1", repo / name / "1" / "model.pt")


def test_kind_gpu_without_cuda_is_a_clear_load_error(repo, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    source = _source(repo, "by_order", (repo / "by_order" / "config.pbtxt").read_text())
    group = mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_GPU)
    with pytest.raises(ConfigError, match=r"KIND_GPU but torch.cuda.is_available\(\) is False"):
        ptb.PyTorchBackend().create_instance(source, InstanceSpec("g_0", group, group.kind, 0))


def test_weight_sharing_loads_the_module_once(repo):
    text = (repo / "by_order" / "config.pbtxt").read_text() + _param("ENABLE_WEIGHT_SHARING", "true")
    source = _source(repo, "by_order", text)
    group = mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU, count=2)
    backend = ptb.PyTorchBackend()
    first = backend.create_instance(source, InstanceSpec("s_0", group, group.kind, 0))
    second = backend.create_instance(source, InstanceSpec("s_1", group, group.kind, 0))
    assert first._module is second._module
    assert [entry[1] for entry in backend._shared.values()] == [2]
    first.close()
    second.close()
    assert backend._shared == {}


def test_process_wide_thread_settings_first_model_wins(caplog):
    settings = ptb._ProcessSettings()
    applied = []
    caplog.set_level(logging.INFO, logger="naiad.backends.pytorch_backend")
    settings.apply("INTRA_OP_THREAD_COUNT", 3, "first", applied.append)
    settings.apply("INTRA_OP_THREAD_COUNT", 5, "second", applied.append)
    assert applied == [3]
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "set to 3 by model 'first'" in text
    assert "model 'second': INTRA_OP_THREAD_COUNT=5 ignored" in text and "model 'first' already set it to 3" in text


def test_aot_inductor_package(tmp_path):
    root = tmp_path / "repo"
    fm.save_aoti_package(fm.version_dir(root, "aoti") / "model.pt2")
    fm.write_config(root / "aoti", _config('platform: "torch_aoti"\nmax_batch_size: 0\n',
                                           [("x", "TYPE_FP32", [1, 4])], [("y", "TYPE_FP32", [1, 4])]))
    x = np.array([[0.5, -1.0, 2.0, 3.0]], np.float32)
    with naiad.Server(model_repository=str(root)) as srv:
        np.testing.assert_array_equal(srv.infer("aoti", {"x": x})["y"], x * 2 + 1)
