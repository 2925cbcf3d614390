"""Generate Naiad's example model repository (ONNX models + config.pbtxt), deterministically.

    python examples/generate_models.py                 # writes examples/models/
    python examples/generate_models.py --output DIR    # writes DIR/
    python examples/generate_models.py --check         # exit 1 if examples/models/ is stale

Models written:
  add_sub               OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (FP32 [16], max_batch_size 8)
  mlp_classifier        256-512-512-10 FP32 MLP with softmax output and a labels file (max_batch_size 32)
  string_upper          upper-cases a 1-D BYTES tensor (ONNX StringNormalizer, max_batch_size 0)
  add_sub_autocomplete  the add_sub ONNX file with no config.pbtxt (the server derives it)

Weights come from a fixed numpy seed and the ONNX files are serialized from fixed graphs, so
re-running the script produces byte-identical files; unchanged files are not rewritten.
Only the `onnx` and `numpy` packages are needed (onnxruntime is used by --verify if present).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17  # widely supported by onnxruntime builds (Triton's included)
IR_VERSION = 8  # the IR version that goes with opset 17
SEED = 20240611
ADD_SUB_DIM = 16
MLP_SIZES = (256, 512, 512, 10)
LABELS = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "models"


def _finish(graph: onnx.GraphProto) -> bytes:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="naiad-examples",
        producer_version="1",
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString(deterministic=True)


def add_sub_onnx(batch_dim: str | int = "batch") -> bytes:
    """INPUT0, INPUT1: float32 [batch, 16] -> OUTPUT0 = sum, OUTPUT1 = difference."""
    shape = [batch_dim, ADD_SUB_DIM]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("INPUT0", "INPUT1")]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("OUTPUT0", "OUTPUT1")]
    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="add"),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="sub"),
    ]
    return _finish(helper.make_graph(nodes, "add_sub", inputs, outputs))


def mlp_weights(seed: int = SEED) -> list[tuple[np.ndarray, np.ndarray]]:
    """(W, b) per layer, He-initialised from a fixed seed; W has shape [fan_in, fan_out]."""
    rng = np.random.default_rng(seed)
    layers = []
    for fan_in, fan_out in zip(MLP_SIZES[:-1], MLP_SIZES[1:]):
        w = rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)
        b = rng.standard_normal(fan_out) * 0.01
        layers.append((w.astype(np.float32), b.astype(np.float32)))
    return layers


def mlp_onnx(seed: int = SEED) -> bytes:
    """INPUT: float32 [batch, 256] -> PROBABILITIES: float32 [batch, 10] (Gemm+Relu x2, Gemm, Softmax)."""
    layers = mlp_weights(seed)
    initializers, nodes = [], []
    current = "INPUT"
    for i, (w, b) in enumerate(layers):
        initializers += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"B{i}")]
        out = f"h{i}" if i < len(layers) - 1 else "logits"
        nodes.append(helper.make_node("Gemm", [current, f"W{i}", f"B{i}"], [out], name=f"gemm{i}"))
        current = out
        if i < len(layers) - 1:
            nodes.append(helper.make_node("Relu", [current], [f"relu{i}"], name=f"relu{i}"))
            current = f"relu{i}"
    nodes.append(helper.make_node("Softmax", [current], ["PROBABILITIES"], axis=1, name="softmax"))
    graph = helper.make_graph(
        nodes,
        "mlp_classifier",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", MLP_SIZES[0]])],
        [helper.make_tensor_value_info("PROBABILITIES", TensorProto.FLOAT, ["batch", MLP_SIZES[-1]])],
        initializer=initializers,
    )
    return _finish(graph)


def string_upper_onnx() -> bytes:
    """INPUT: string [n] -> OUTPUT: string [n], ASCII letters upper-cased.

    StringNormalizer takes a non-empty 1-D tensor. Its locale is "C" because the default
    ("en_US.UTF-8") makes onnxruntime fail at load time on machines without that locale;
    with "C" only ASCII letters change case.
    """
    node = helper.make_node(
        "StringNormalizer",
        ["INPUT"],
        ["OUTPUT"],
        case_change_action="UPPER",
        is_case_sensitive=1,
        locale="C",
        name="upper",
    )
    graph = helper.make_graph(
        [node],
        "string_upper",
        [helper.make_tensor_value_info("INPUT", TensorProto.STRING, ["n"])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.STRING, ["n"])],
    )
    return _finish(graph)


ADD_SUB_CONFIG = """\
name: "add_sub"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
dynamic_batching { }
"""

MLP_CONFIG = """\
name: "mlp_classifier"
backend: "onnxruntime"
max_batch_size: 32
input [
  { name: "INPUT" data_type: TYPE_FP32 dims: [ 256 ] }
]
output [
  { name: "PROBABILITIES" data_type: TYPE_FP32 dims: [ 10 ] label_filename: "labels.txt" }
]
dynamic_batching { }
"""

STRING_UPPER_CONFIG = """\
name: "string_upper"
backend: "onnxruntime"
max_batch_size: 0
input [
  { name: "INPUT" data_type: TYPE_STRING dims: [ -1 ] }
]
output [
  { name: "OUTPUT" data_type: TYPE_STRING dims: [ -1 ] }
]
"""


def repository_files() -> dict[str, bytes]:
    """Every file of the example repository, keyed by its path relative to the repository root."""
    add_sub = add_sub_onnx()
    return {
        "add_sub/config.pbtxt": ADD_SUB_CONFIG.encode(),
        "add_sub/1/model.onnx": add_sub,
        "mlp_classifier/config.pbtxt": MLP_CONFIG.encode(),
        "mlp_classifier/labels.txt": ("\n".join(LABELS) + "\n").encode(),
        "mlp_classifier/1/model.onnx": mlp_onnx(),
        "string_upper/config.pbtxt": STRING_UPPER_CONFIG.encode(),
        "string_upper/1/model.onnx": string_upper_onnx(),
        "add_sub_autocomplete/1/model.onnx": add_sub,
    }


def write_repository(output: Path) -> list[str]:
    """Write the repository under `output`; returns the relative paths that were (re)written."""
    written = []
    for rel, data in repository_files().items():
        path = output / rel
        if path.is_file() and path.read_bytes() == data:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        written.append(rel)
    return written


def stale_files(output: Path) -> list[str]:
    return [rel for rel, data in repository_files().items()
            if not (output / rel).is_file() or (output / rel).read_bytes() != data]


def verify_repository(output: Path) -> None:
    """Run every model once in onnxruntime (in-process) and compare with numpy."""
    import onnxruntime as ort

    def session(model: str) -> ort.InferenceSession:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        return ort.InferenceSession(str(output / model / "1" / "model.onnx"), opts,
                                    providers=["CPUExecutionProvider"])

    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, ADD_SUB_DIM)).astype(np.float32)
    b = rng.standard_normal((3, ADD_SUB_DIM)).astype(np.float32)
    for model in ("add_sub", "add_sub_autocomplete"):
        out0, out1 = session(model).run(None, {"INPUT0": a, "INPUT1": b})
        np.testing.assert_allclose(out0, a + b, rtol=1e-6)
        np.testing.assert_allclose(out1, a - b, rtol=1e-6)

    x = rng.standard_normal((4, MLP_SIZES[0])).astype(np.float32)
    (probs,) = session("mlp_classifier").run(None, {"INPUT": x})
    h = x
    for i, (w, bias) in enumerate(mlp_weights()):
        h = h @ w + bias
        if i < len(MLP_SIZES) - 2:
            h = np.maximum(h, 0)
    e = np.exp(h - h.max(axis=1, keepdims=True))
    np.testing.assert_allclose(probs, e / e.sum(axis=1, keepdims=True), rtol=1e-4, atol=1e-6)
    assert probs.shape == (4, 10)

    words = np.array(["hello", "Naiad", "x-1 y", ""], dtype=object)
    (upper,) = session("string_upper").run(None, {"INPUT": words})
    assert list(upper) == ["HELLO", "NAIAD", "X-1 Y", ""], upper


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT,
                        help=f"repository directory to write (default: {DEFAULT_OUTPUT})")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if the repository differs from what would be generated")
    parser.add_argument("--verify", action="store_true",
                        help="after writing, run each model once in onnxruntime and check its outputs")
    args = parser.parse_args(argv)

    if args.check:
        stale = stale_files(args.output)
        for rel in stale:
            print(f"stale: {args.output / rel}")
        return 1 if stale else 0

    written = write_repository(args.output)
    print(f"{args.output}: {len(written)} file(s) written, "
          f"{len(repository_files()) - len(written)} already up to date")
    if args.verify:
        verify_repository(args.output)
        print("verified: every model runs in onnxruntime and matches numpy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
