"""Build a model repository for Triton's public example clients and python_backend examples.

Triton's client examples (client repository, src/python/examples) expect `simple*` models that ship as
TensorFlow files or C++ custom backends; this script writes Python-backend models with the same names,
tensors and answers, so the same repository runs on Naiad and on any Triton with the Python backend.
The python_backend examples are laid out from a checkout of that repository (its model files are copied
into the scratch repository, never into this one).

Usage: python scripts/triton_examples_corpus.py REPO_DIR [--python-backend-examples DIR] [--pytorch] [--onnx]
                                                [--client-models-only]
  --onnx also writes `densenet_onnx`, an ONNX image classifier for image_client.py (needs `onnx`).
"""

from __future__ import annotations

import argparse
import shutil
import textwrap
from pathlib import Path

ADD_SUB_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 in the inputs' own datatype."""

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (a + b).astype(a.dtype)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(a.dtype)),
            ]))
        return responses
'''

STRING_ADD_SUB_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


def _numbers(tensor):
    return np.vectorize(lambda s: int(s.decode() if isinstance(s, bytes) else s), otypes=[np.int64])(tensor)


def _strings(values):
    return np.vectorize(lambda v: str(v).encode(), otypes=[object])(values)


class TritonPythonModel:
    """Strings holding integers: OUTPUT0 = str(INPUT0 + INPUT1), OUTPUT1 = str(INPUT0 - INPUT1)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            a = _numbers(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy())
            b = _numbers(pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy())
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", _strings(a + b)), pb_utils.Tensor("OUTPUT1", _strings(a - b))]))
        return responses
'''

IDENTITY_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
'''

# Stateless, like the example graph: OUTPUT = READY ? INPUT + START (+ END * CORRID) : 0.
SEQUENCE_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


def _control(request, name, like):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return np.zeros_like(like) if tensor is None else tensor.as_numpy().astype(like.dtype)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            out = value + _control(request, "START", value)
            if pb_utils.get_input_tensor_by_name(request, "CORRID") is not None:
                out = out + _control(request, "END", value) * _control(request, "CORRID", value)
            out = np.where(_control(request, "READY", value) == 1, out, 0).astype(np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)]))
        return responses
'''

# Stateful: a running sum per sequence; the last request adds the (numeric) string correlation ID.
STRING_DYNA_SEQUENCE_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            corrid = _scalar(request, "CORRID")
            corrid = corrid.decode() if isinstance(corrid, bytes) else str(corrid)
            value = int(_scalar(request, "INPUT"))
            total = value if _scalar(request, "START") else self.sums.get(corrid, 0) + value
            self.sums[corrid] = total
            if _scalar(request, "END"):
                total += int(corrid)
                self.sums.pop(corrid, None)
            out = np.array([[total]], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)]))
        return responses
'''

CLASSIFIER_LABELS = [f"CLASS_{i}" for i in range(1000)]


def io(kind: str, tensors: list[tuple[str, str, str]]) -> str:
    body = ",\n".join(f'  {{ name: "{n}" data_type: {t} dims: {d} }}' for n, t, d in tensors)
    return f"{kind} [\n{body}\n]\n"


def python_model(repo: Path, name: str, source: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(source).lstrip())
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n' + config)


def control(name: str, kind: str, body: str) -> str:
    return f'{{ name: "{name}" control [ {{ kind: {kind} {body} }} ] }}'


def add_sub_config(datatype: str) -> str:
    ins = [("INPUT0", datatype, "[ 16 ]"), ("INPUT1", datatype, "[ 16 ]")]
    outs = [("OUTPUT0", datatype, "[ 16 ]"), ("OUTPUT1", datatype, "[ 16 ]")]
    return "max_batch_size: 8\n" + io("input", ins) + io("output", outs)


def client_models(repo: Path) -> None:
    """The models the client examples name: simple, simple_int8, simple_string, simple_identity, sequences."""
    python_model(repo, "simple", ADD_SUB_PY, add_sub_config("TYPE_INT32"))
    python_model(repo, "simple_int8", ADD_SUB_PY, add_sub_config("TYPE_INT8"))
    python_model(repo, "simple_string", STRING_ADD_SUB_PY, add_sub_config("TYPE_STRING"))
    python_model(repo, "simple_identity", IDENTITY_PY, "max_batch_size: 8\n"
                 + io("input", [("INPUT0", "TYPE_STRING", "[ -1 ]")]) + io("output", [("OUTPUT0", "TYPE_STRING", "[ -1 ]")]))
    seq_io = io("input", [("INPUT", "TYPE_INT32", "[ 1 ]")]) + io("output", [("OUTPUT", "TYPE_INT32", "[ 1 ]")])
    flag = "int32_false_true: [ 0, 1 ]"
    start = control("START", "CONTROL_SEQUENCE_START", flag)
    ready = control("READY", "CONTROL_SEQUENCE_READY", flag)
    end = control("END", "CONTROL_SEQUENCE_END", flag)
    python_model(repo, "simple_sequence", SEQUENCE_PY,
                 f"max_batch_size: 8\nsequence_batching {{ control_input [ {start}, {ready} ] }}\n" + seq_io
                 + "instance_group [ { kind: KIND_CPU } ]\n")
    corrid = control("CORRID", "CONTROL_SEQUENCE_CORRID", "data_type: TYPE_UINT64")
    oldest = "oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }"
    python_model(repo, "simple_dyna_sequence", SEQUENCE_PY,
                 f"max_batch_size: 8\nsequence_batching {{ max_sequence_idle_microseconds: 10000000 {oldest}\n"
                 f"  control_input [ {start}, {end}, {ready}, {corrid} ] }}\n" + seq_io
                 + "instance_group [ { count: 2 kind: KIND_CPU } ]\n")
    string_corrid = control("CORRID", "CONTROL_SEQUENCE_CORRID", "data_type: TYPE_STRING")
    # A TYPE_STRING CORRID is served by Naiad; Triton 2.51's Python backend refuses it at request time.
    python_model(repo, "simple_string_dyna_sequence", STRING_DYNA_SEQUENCE_PY,
                 f"max_batch_size: 8\nsequence_batching {{ max_sequence_idle_microseconds: 10000000 {oldest}\n"
                 f"  control_input [ {start}, {end}, {ready}, {string_corrid} ] }}\n" + seq_io
                 + "instance_group [ { count: 2 kind: KIND_CPU } ]\n")


def onnx_classifier(repo: Path, name: str = "densenet_onnx") -> None:
    """An NCHW 3x224x224 image classifier over 1000 labels: channel means through a fixed linear map."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(0).standard_normal((3, 1000)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["data_0"], ["means"], axes=[2, 3], keepdims=0),
         helper.make_node("MatMul", ["means", "W"], ["logits"]),
         helper.make_node("Softmax", ["logits"], ["fc6_1"], axis=1)],
        "classifier",
        [helper.make_tensor_value_info("data_0", TensorProto.FLOAT, ["batch", 3, 224, 224])],
        [helper.make_tensor_value_info("fc6_1", TensorProto.FLOAT, ["batch", 1000])],
        initializer=[numpy_helper.from_array(weights, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(repo / name / "1" / "model.onnx"))
    (repo / name / "labels.txt").write_text("\n".join(CLASSIFIER_LABELS) + "\n")
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "data_0" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 224, 224 ] } ]\n'
        'output [ { name: "fc6_1" data_type: TYPE_FP32 dims: [ 1000 ] label_filename: "labels.txt" } ]\n')


# (model name, example directory, model file, config file or None when the model completes its own config)
PYTHON_BACKEND_EXAMPLES = [
    ("add_sub", "add_sub", "model.py", "config.pbtxt"),
    ("pytorch", "pytorch", "model.py", "config.pbtxt"),
    ("bls_sync", "bls", "sync_model.py", "sync_config.pbtxt"),
    ("bls_async", "bls", "async_model.py", "async_config.pbtxt"),
    ("bls_decoupled_sync", "bls_decoupled", "sync_model.py", "sync_config.pbtxt"),
    ("bls_decoupled_async", "bls_decoupled", "async_model.py", "async_config.pbtxt"),
    ("repeat_int32", "decoupled", "repeat_model.py", "repeat_config.pbtxt"),
    ("square_int32", "decoupled", "square_model.py", "square_config.pbtxt"),
    ("nobatch_auto_complete", "auto_complete", "nobatch_model.py", None),
    ("batch_auto_complete", "auto_complete", "batch_model.py", None),
    ("custom_metrics", "custom_metrics", "model.py", "config.pbtxt"),
]


def python_backend_examples(repo: Path, examples: Path, with_pytorch: bool) -> None:
    """Lay out python_backend's examples/ as its READMEs describe: <name>/1/model.py (+ config.pbtxt)."""
    for name, folder, model_file, config_file in PYTHON_BACKEND_EXAMPLES:
        if name == "pytorch" and not with_pytorch:
            continue
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        shutil.copy(examples / folder / model_file, repo / name / "1" / "model.py")
        if config_file is not None:
            shutil.copy(examples / folder / config_file, repo / name / "config.pbtxt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("repo", type=Path)
    parser.add_argument("--python-backend-examples", type=Path, help="python_backend checkout's examples/ directory")
    parser.add_argument("--pytorch", action="store_true", help="also lay out the pytorch example (needs torch)")
    parser.add_argument("--onnx", action="store_true", help="also write the ONNX image classifier densenet_onnx")
    parser.add_argument("--client-models-only", action="store_true",
                        help="write only the seven client-example models (plus densenet_onnx with --onnx): the "
                             "model_control examples count the repository index (HTTP: 7 models, gRPC: 8)")
    args = parser.parse_args()
    args.repo.mkdir(parents=True, exist_ok=True)
    client_models(args.repo)
    if args.onnx:
        onnx_classifier(args.repo)
    if args.python_backend_examples is not None and not args.client_models_only:
        python_backend_examples(args.repo, args.python_backend_examples, args.pytorch)


if __name__ == "__main__":
    main()
