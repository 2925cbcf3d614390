"""Writes small real ONNX models (and their Triton model directories) for the tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17

ONNX_TYPES = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}
CONFIG_TYPES = {
    "BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16", "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64", "INT8": "TYPE_INT8", "INT16": "TYPE_INT16", "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64", "FP16": "TYPE_FP16", "FP32": "TYPE_FP32", "FP64": "TYPE_FP64", "BYTES": "TYPE_STRING",
}


def _save(model: onnx.ModelProto, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    model.opset_import[0].version = OPSET
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _tensor(name: str, datatype: str, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, ONNX_TYPES[datatype], shape)


def add_sub_onnx(path: Path, datatype: str = "FP32", dims: int = 16, batch: bool = True) -> None:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""
    shape = ["batch", dims] if batch else [dims]
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]), helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])],
        "add_sub",
        [_tensor("INPUT0", datatype, shape), _tensor("INPUT1", datatype, shape)],
        [_tensor("OUTPUT0", datatype, shape), _tensor("OUTPUT1", datatype, shape)],
    )
    _save(helper.make_model(graph), path)


def identity_onnx(path: Path, datatype: str, shape: list) -> None:
    """OUTPUT0 = INPUT0 (any datatype, incl. BOOL, FP16 and strings)."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "identity",
        [_tensor("INPUT0", datatype, shape)],
        [_tensor("OUTPUT0", datatype, shape)],
    )
    _save(helper.make_model(graph), path)


def classifier_onnx(path: Path, features: int = 4, classes: int = 5, seed: int = 0) -> None:
    """PROBS = softmax(INPUT @ W + b), batch dim dynamic."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((features, classes)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(classes).astype(np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["INPUT", "W", "B"], ["LOGITS"]), helper.make_node("Softmax", ["LOGITS"], ["PROBS"], axis=1)],
        "classifier",
        [_tensor("INPUT", "FP32", ["batch", features])],
        [_tensor("PROBS", "FP32", ["batch", classes])],
        initializer=[w, b],
    )
    _save(helper.make_model(graph), path)


def write_config(model_dir: Path, text: str) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(text)


def io_block(kind: str, name: str, datatype: str, dims: list[int], extra: str = "") -> str:
    return f'{kind} [{{ name: "{name}" data_type: {CONFIG_TYPES[datatype]} dims: {dims} {extra} }}]\n'


def add_sub_model(repo: Path, name: str = "add_sub", datatype: str = "FP32", dims: int = 16,
                  max_batch_size: int = 8, scheduler: str = "dynamic_batching { }", instances: int = 1) -> Path:
    """A complete add/sub model directory with config.pbtxt."""
    model_dir = repo / name
    add_sub_onnx(model_dir / "1" / "model.onnx", datatype, dims, batch=max_batch_size > 0)
    config = f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: {max_batch_size}\n'
    for kind, names in (("input", ["INPUT0", "INPUT1"]), ("output", ["OUTPUT0", "OUTPUT1"])):
        config += f"{kind} [" + ", ".join(
            f'{{ name: "{n}" data_type: {CONFIG_TYPES[datatype]} dims: [{dims}] }}' for n in names
        ) + "]\n"
    config += f"instance_group [{{ kind: KIND_CPU count: {instances} }}]\n{scheduler}\n"
    write_config(model_dir, config)
    return model_dir


def identity_model(repo: Path, name: str, datatype: str, dims: list[int], max_batch_size: int = 8) -> Path:
    model_dir = repo / name
    shape = (["batch"] if max_batch_size > 0 else []) + [d if d > 0 else f"d{i}" for i, d in enumerate(dims)]
    identity_onnx(model_dir / "1" / "model.onnx", datatype, shape)
    config = f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n'
    config += io_block("input", "INPUT0", datatype, dims) + io_block("output", "OUTPUT0", datatype, dims)
    write_config(model_dir, config)
    return model_dir


def classifier_model(repo: Path, name: str = "classifier", labels: list[str] | None = None) -> Path:
    model_dir = repo / name
    classifier_onnx(model_dir / "1" / "model.onnx")
    label_clause = ""
    if labels is not None:
        (model_dir / "labels.txt").write_text("\n".join(labels) + "\n")
        label_clause = 'label_filename: "labels.txt"'
    config = f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 16\n'
    config += io_block("input", "INPUT", "FP32", [4]) + io_block("output", "PROBS", "FP32", [5], label_clause)
    write_config(model_dir, config)
    return model_dir


ALL_DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES"]


def standard_repository(repo: Path) -> Path:
    """The repository most integration tests serve: add_sub, identities of every datatype, a classifier."""
    add_sub_model(repo, "add_sub")
    add_sub_model(repo, "add_sub_int32", datatype="INT32", max_batch_size=8, scheduler="")
    add_sub_model(repo, "add_sub_nobatch", max_batch_size=0, dims=4, scheduler="")
    for datatype in ALL_DATATYPES:
        identity_model(repo, f"identity_{datatype.lower()}", datatype, [-1])
    classifier_model(repo, "classifier", labels=[f"class_{i}" for i in range(5)])
    classifier_model(repo, "classifier_nolabels")
    # no config.pbtxt at all: auto-complete from the ONNX graph
    add_sub_onnx(repo / "add_sub_auto" / "1" / "model.onnx")
    return repo


def slow_onnx(path: Path, matmuls: int = 8, size: int = 768) -> None:
    """Y[1] = sum of a chain of size x size MatMuls seeded from X[1]: a model that takes a while."""
    weight = numpy_helper.from_array(np.full((size, size), 1.0 / size, dtype=np.float32), "W")
    shape = numpy_helper.from_array(np.array([size, size], dtype=np.int64), "SHAPE")
    nodes = [helper.make_node("Expand", ["X", "SHAPE"], ["M0"])]
    for i in range(matmuls):
        nodes.append(helper.make_node("MatMul", [f"M{i}", "W"], [f"M{i + 1}"]))
    nodes.append(helper.make_node("ReduceMean", [f"M{matmuls}"], ["Y1"], keepdims=0))
    nodes.append(helper.make_node("Reshape", ["Y1", "ONE"], ["Y"]))
    one = numpy_helper.from_array(np.array([1], dtype=np.int64), "ONE")
    graph = helper.make_graph(nodes, "slow", [_tensor("X", "FP32", [1])], [_tensor("Y", "FP32", [1])], initializer=[weight, shape, one])
    _save(helper.make_model(graph), path)


def slow_model(repo: Path, name: str = "slow", matmuls: int = 8) -> Path:
    model_dir = repo / name
    slow_onnx(model_dir / "1" / "model.onnx", matmuls)
    config = f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
    config += io_block("input", "X", "FP32", [1]) + io_block("output", "Y", "FP32", [1])
    config += 'instance_group [{ kind: KIND_CPU count: 1 }]\nparameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n'
    write_config(model_dir, config)
    return model_dir


def reshape_model(repo: Path, name: str = "reshape") -> Path:
    """ONNX graph works on [batch, 2, 2]; config exposes dims [4] with reshape [2, 2] (and back for the output)."""
    model_dir = repo / name
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["X"], ["Y"], perm=[0, 2, 1])],
        "reshape",
        [_tensor("X", "FP32", ["batch", 2, 2])],
        [_tensor("Y", "FP32", ["batch", 2, 2])],
    )
    _save(helper.make_model(graph), model_dir / "1" / "model.onnx")
    config = f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 4\n'
    config += io_block("input", "X", "FP32", [4], "reshape: { shape: [2, 2] }")
    config += io_block("output", "Y", "FP32", [4], "reshape: { shape: [2, 2] }")
    write_config(model_dir, config)
    return model_dir


def ensemble_model(repo: Path, name: str, steps: list[tuple[str, dict[str, str], dict[str, str]]],
                   inputs: list[tuple[str, str, list[int]]], outputs: list[tuple[str, str, list[int]]],
                   max_batch_size: int = 8) -> Path:
    """An ensemble directory: steps are (model, input_map, output_map); an empty version dir 1/."""
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    config = f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
    for n, dt, dims in inputs:
        config += io_block("input", n, dt, dims)
    for n, dt, dims in outputs:
        config += io_block("output", n, dt, dims)
    config += "ensemble_scheduling { step ["
    parts = []
    for model, input_map, output_map in steps:
        maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in input_map.items())
        maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in output_map.items())
        parts.append(f'{{ model_name: "{model}" model_version: -1{maps} }}')
    config += ", ".join(parts) + "] }\n"
    write_config(model_dir, config)
    return model_dir


def accumulator_model(repo: Path, name: str = "accumulator", strategy: str = "direct { }", idle_us: int = 5_000_000) -> Path:
    """Stateful sum: OUTPUT = STATE_IN * (1 - START) + INPUT; STATE_OUT = OUTPUT; CORRID echoed as CID."""
    model_dir = repo / name
    nodes = [
        helper.make_node("Sub", ["ONE", "START"], ["KEEP"]),
        helper.make_node("Mul", ["STATE_IN", "KEEP"], ["KEPT"]),
        helper.make_node("Add", ["KEPT", "INPUT"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
        helper.make_node("Identity", ["CORRID"], ["CID"]),
    ]
    one = numpy_helper.from_array(np.ones((1, 1), dtype=np.float32), "ONE")
    graph = helper.make_graph(
        nodes, "accumulator",
        [_tensor("INPUT", "FP32", ["b", 1]), _tensor("START", "FP32", ["b", 1]), _tensor("STATE_IN", "FP32", ["b", 1]),
         _tensor("CORRID", "UINT64", ["b", 1])],
        [_tensor("OUTPUT", "FP32", ["b", 1]), _tensor("STATE_OUT", "FP32", ["b", 1]), _tensor("CID", "UINT64", ["b", 1])],
        initializer=[one],
    )
    _save(helper.make_model(graph), model_dir / "1" / "model.onnx")
    config = f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 4\n'
    config += io_block("input", "INPUT", "FP32", [1])
    config += "output [" + ", ".join(f'{{ name: "{n}" data_type: {t} dims: [1] }}' for n, t in (("OUTPUT", "TYPE_FP32"), ("CID", "TYPE_UINT64"))) + "]\n"
    config += f"""sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
  control_input [
    {{ name: "START" control [{{ kind: CONTROL_SEQUENCE_START fp32_false_true: [0, 1] }}] }},
    {{ name: "CORRID" control [{{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }}] }}
  ]
  state [{{ input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [1]
            initial_state {{ data_type: TYPE_FP32 dims: [1] zero_data: true name: "zero" }} }}]
}}
instance_group [{{ kind: KIND_CPU count: 1 }}]
"""
    write_config(model_dir, config)
    return model_dir
