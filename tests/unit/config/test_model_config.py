"""config.pbtxt parsing, the JSON view, completion and validation."""

from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.registry import BackendRegistry
from naiad.config.completion import fill_instance_groups
from naiad.config.model_config import ConfigError, config_to_dict, parse_config_text
from naiad.config.server_config import ServerConfig
from naiad.core.model_loader import (
    instance_source,
    instance_specs,
    prepare_model,
    select_versions,
)
from tests.support.onnx_models import add_sub_model, add_sub_onnx, write_config


def test_parse_error_names_file_line_and_field():
    with pytest.raises(ConfigError) as err:
        parse_config_text('name: "m"\nmax_batch_size: "eight"\n', "/repo/m/config.pbtxt")
    assert str(err.value).startswith("/repo/m/config.pbtxt:2:")
    assert "max_batch_size" in str(err.value)


def test_json_view_has_int64_as_numbers_and_defaults():
    config = parse_config_text(
        'name: "m"\nmax_batch_size: 4\ninput [{ name: "X" data_type: TYPE_FP32 dims: [ -1, 3 ] }]\n'
        "dynamic_batching { max_queue_delay_microseconds: 100 }\nversion_policy { specific { versions: [1, 3] } }\n",
        "c",
    )
    view = config_to_dict(config)
    assert view["input"][0]["dims"] == [-1, 3]
    assert view["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert view["version_policy"]["specific"]["versions"] == [1, 3]
    assert view["input"][0]["data_type"] == "TYPE_FP32"
    assert view["input"][0]["optional"] is False  # defaults printed


def test_default_instance_groups():
    config = mc.ModelConfig(name="m", backend="onnxruntime")
    fill_instance_groups(config, gpu_count=0)
    group = config.instance_group[0]
    assert (group.name, group.kind, group.count) == ("m", mc.ModelInstanceGroup.KIND_CPU, 2)
    config = mc.ModelConfig(name="p", backend="pytorch")
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU)
    fill_instance_groups(config, gpu_count=0)
    assert (config.instance_group[0].name, config.instance_group[0].count) == ("p_0", 1)


def test_gpu_group_refused_without_gpu():
    config = mc.ModelConfig(name="m", backend="onnxruntime")
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_GPU)
    with pytest.raises(ConfigError, match="no GPU"):
        fill_instance_groups(config, gpu_count=0)


def test_version_policies():
    available = {1: Path("1"), 2: Path("2"), 5: Path("5")}
    config = mc.ModelConfig()
    config.version_policy.latest.num_versions = 2
    assert sorted(select_versions(config, available)[0]) == [2, 5]
    config.version_policy.all.SetInParent()
    assert sorted(select_versions(config, available)[0]) == [1, 2, 5]
    config.version_policy.specific.versions.extend([1, 3])
    chosen, missing = select_versions(config, available)
    assert sorted(chosen) == [1] and missing == [3]


def test_auto_complete_from_onnx_without_config(tmp_path):
    add_sub_onnx(tmp_path / "auto" / "1" / "model.onnx")
    prepared = prepare_model("auto", tmp_path / "auto", ServerConfig(), BackendRegistry())
    config = prepared.config
    assert config.backend == "onnxruntime" and config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 4 and config.HasField("dynamic_batching")
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"] and list(config.input[0].dims) == [16]
    assert config.instance_group[0].count == 2


def test_backend_config_sets_default_max_batch_size(tmp_path):
    add_sub_onnx(tmp_path / "auto" / "1" / "model.onnx")
    settings = ServerConfig(backend_config={"onnxruntime": {"default-max-batch-size": "16"}})
    assert prepare_model("auto", tmp_path / "auto", settings, BackendRegistry()).config.max_batch_size == 16


def test_strict_config_skips_auto_complete(tmp_path):
    add_sub_onnx(tmp_path / "auto" / "1" / "model.onnx")
    prepared = prepare_model("auto", tmp_path / "auto", ServerConfig(strict_model_config=True), BackendRegistry())
    assert len(prepared.config.input) == 0 and prepared.config.max_batch_size == 0


def test_config_conflicting_with_graph_is_refused(tmp_path):
    model_dir = add_sub_model(tmp_path, "m")
    text = (model_dir / "config.pbtxt").read_text().replace("TYPE_FP32", "TYPE_INT32", 1)
    write_config(model_dir, text)
    prepared = prepare_model("m", model_dir, ServerConfig(), BackendRegistry())
    backend, source = instance_source(prepared, 1, ServerConfig(), BackendRegistry(), None)
    with pytest.raises(ConfigError, match="configuration expects datatype TYPE_INT32 for input 'INPUT0', model provides TYPE_FP32"):
        backend.create_instance(source, instance_specs(prepared.config)[0])


def test_semantic_error_names_line_and_field(tmp_path):
    model_dir = add_sub_model(tmp_path, "m")
    text = (model_dir / "config.pbtxt").read_text().replace("dims: [16]", "dims: [-2]", 1)
    write_config(model_dir, text)
    with pytest.raises(ConfigError) as err:
        prepare_model("m", model_dir, ServerConfig(), BackendRegistry())
    message = str(err.value)
    assert "config.pbtxt:4" in message and "input.dims" in message and "-2" in message


def test_name_mismatch_refused(tmp_path):
    model_dir = add_sub_model(tmp_path, "m")
    write_config(model_dir, (model_dir / "config.pbtxt").read_text().replace('name: "m"', 'name: "other"'))
    with pytest.raises(ConfigError, match="does not match the model directory"):
        prepare_model("m", model_dir, ServerConfig(), BackendRegistry())
