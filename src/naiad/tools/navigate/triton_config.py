"""Writes the chosen variant as `<repository>/<name>/1/<model file>` plus a config.pbtxt Triton loads unchanged."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from naiad.protocol.datatypes import PROTOCOL_TO_CONFIG
from naiad.tools.navigate.runtimes import CONFIG_GRAPH_LEVEL, IoSpec

if TYPE_CHECKING:
    from naiad.tools.navigate.navigator import Variant

FILES = {"onnx": "model.onnx", "torchscript": "model.pt", "openvino": "model.xml"}
BACKENDS = {"onnx": "onnxruntime", "torchscript": "pytorch", "openvino": "openvino"}


@dataclass
class ModelSignature:
    inputs: list[IoSpec]  # names as the config declares them
    outputs: list[IoSpec]
    batchable: bool
    output_alias: dict[str, str] = field(default_factory=dict)  # reference output name -> config name

    def wire_output(self, name: str) -> str:
        return self.output_alias.get(name, name)


def _io(spec: IoSpec, batchable: bool) -> tuple[str, int, list[int]]:
    dims = spec.shape[1:] if batchable else spec.shape
    return spec.name, getattr(mc, PROTOCOL_TO_CONFIG[spec.datatype]), [-1 if d is None else int(d) for d in dims]


def _add_tensor(tensors: object, name: str, dtype: int, dims: list[int]) -> None:
    """A tensor with no dimension besides the batch one is written as Triton writes it: dims [1] with an
    empty reshape (a config without dims does not load)."""
    entry = tensors.add(name=name, data_type=dtype, dims=dims or [1])  # type: ignore[attr-defined]
    if not dims:
        entry.reshape.SetInParent()


def build_config(name: str, variant: Variant, signature: ModelSignature, max_batch_size: int,
                 instance_count: int) -> mc.ModelConfig:
    config = mc.ModelConfig(name=name, backend=BACKENDS[variant.fmt], max_batch_size=max_batch_size)
    for index, spec in enumerate(signature.inputs):
        n, dtype, dims = _io(spec, signature.batchable)
        if variant.fmt == "torchscript":
            n = f"INPUT__{index}"  # the PyTorch backend's positional naming
        _add_tensor(config.input, n, dtype, dims)
    for spec in signature.outputs:
        n, dtype, dims = _io(spec, signature.batchable)
        _add_tensor(config.output, n, dtype, dims)
    config.instance_group.add(count=instance_count, kind=mc.ModelInstanceGroup.KIND_CPU)
    if max_batch_size > 0:
        config.dynamic_batching.SetInParent()
    if variant.ort is not None:
        level = CONFIG_GRAPH_LEVEL[variant.ort.graph_level]
        if level != 0:
            config.optimization.graph.level = level
        for key, value in variant.ort.config_parameters().items():
            config.parameters[key].string_value = value
    return config


def write_model(repository: Path, name: str, variant: Variant, signature: ModelSignature, max_batch_size: int,
                instance_count: int = 1) -> Path:
    model_dir = repository / name
    if model_dir.exists():
        shutil.rmtree(model_dir)
    version_dir = model_dir / "1"
    version_dir.mkdir(parents=True)
    shutil.copy2(variant.path, version_dir / FILES[variant.fmt])
    if variant.fmt == "openvino":
        shutil.copy2(variant.path.with_suffix(".bin"), version_dir / "model.bin")
    config = build_config(name, variant, signature, max_batch_size, instance_count)
    (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))
    return model_dir
