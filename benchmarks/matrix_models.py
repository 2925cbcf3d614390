"""The models of the benchmark matrix, written for each server from the same files.

Every model has one instance and one framework thread, max_batch_size 32, and two variants: plain
(no scheduler) and `_batched` (dynamic_batching { max_queue_delay_microseconds: 500 }; MLServer:
adaptive batching of up to 32 requests within 500 us; KServe's model server has no batcher).

  add_sub       FP32[16] + and - as a Python model (the same model.py on Naiad and Triton);
                MLServer and KServe serve examples/generate_models.py's add_sub ONNX file
  add_sub_onnx  that ONNX file on Naiad's onnxruntime backend (Triton's wheel has no onnxruntime backend)
  mlp           the example 256-512-512-10 ONNX MLP: Naiad's onnxruntime backend; Triton: a Python
                model running the same file with onnxruntime on the whole batch; peers: onnxruntime
  xgboost       XGBoost binary:logistic, 100 trees of depth 6, 32 features: Naiad's FIL backend;
                Triton, MLServer, KServe: the same JSON file through xgboost's inplace_predict
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))

import load  # noqa: E402
from batching_bench import ORT_ONE_THREAD, TRITON_MLP_PY  # noqa: E402
from framework_bench import TRITON_MODEL_PY as TRITON_XGBOOST_PY  # noqa: E402
from python_backend_bench import ADD_SUB_PY  # noqa: E402

MODELS = ("add_sub", "add_sub_onnx", "mlp", "xgboost")
VARIANTS = ("plain", "batched")
SERVERS = ("naiad", "triton", "mlserver", "kserve")
SERVED_NAME = {"add_sub": "add_sub", "add_sub_onnx": "add_sub_onnx", "mlp": "mlp_classifier",
               "xgboost": "xgboost_100"}
MAX_BATCH = 32
QUEUE_DELAY_US = 500

ADD_SUB_IO = """input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""
MLP_IO = """input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "PROBABILITIES" data_type: TYPE_FP32 dims: [ 10 ] } ]
"""
XGBOOST_IO = f"""input [ {{ name: "input__0" data_type: TYPE_FP32 dims: [ {load.TREE_FEATURES} ] }} ]
output [ {{ name: "output__0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
"""
FIL_PARAMS = """parameters { key: "model_type" value: { string_value: "xgboost_json" } }
parameters { key: "cpu_nthread" value: { string_value: "1" } }
"""


def served_name(model: str, variant: str) -> str:
    return SERVED_NAME[model] + ("_batched" if variant == "batched" else "")


def config(name: str, backend: str, io: str, variant: str, extra: str = "") -> str:
    scheduler = f"dynamic_batching {{ max_queue_delay_microseconds: {QUEUE_DELAY_US} }}\n" if variant == "batched" else ""
    return (f'name: "{name}"\nbackend: "{backend}"\nmax_batch_size: {MAX_BATCH}\n{io}'
            f"instance_group [ {{ count: 1 kind: KIND_CPU }} ]\n{scheduler}{extra}")


@dataclass
class Matrix:
    """Where each server's models are, and how to check one answer of each served model exactly."""

    naiad_repo: Path
    triton_repo: Path
    mlserver: dict[str, dict] = field(default_factory=dict)   # name -> model-settings.json
    kserve: dict[str, Path] = field(default_factory=dict)     # name -> model file
    served: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # (model, variant) -> servers
    onnx_reference: dict[str, Path] = field(default_factory=dict)  # name -> ONNX file load.py checks against
    workloads: dict[str, load.Workload] = field(default_factory=dict)  # name -> exactly checked request

    def names(self, server: str) -> list[str]:
        return [served_name(m, v) for (m, v), who in self.served.items() if server in who]


def _write(directory: Path, files: dict[str, str | Path]) -> None:
    for rel, content in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copy(content, path)
        else:
            path.write_text(content)


def _tree_check(predict: Callable[[np.ndarray], np.ndarray], workload: load.Workload) -> load.Workload:
    x = workload.inputs[0][2]
    expected = predict(x)

    def check(out: dict[str, np.ndarray]) -> None:
        workload.check(out)
        np.testing.assert_allclose(out["output__0"].reshape(expected.shape), expected, rtol=1e-5, atol=1e-6)
    return load.Workload(workload.model, workload.inputs, workload.outputs, check)


def build(work: Path, models: list[str], variants: list[str]) -> Matrix:
    import framework_bench
    import generate_models

    examples = work / "examples"
    generate_models.write_repository(examples)
    add_sub_onnx = examples / "add_sub" / "1" / "model.onnx"
    mlp_onnx = examples / "mlp_classifier" / "1" / "model.onnx"
    matrix = Matrix(work / "naiad_repo", work / "triton_repo")
    predict = None
    if "xgboost" in models:
        case = framework_bench.build_xgboost(work / "xgboost_build")
        xgboost_json, predict = work / "xgboost_build" / case.model / "1" / "xgboost.json", case.predict
    for model in models:
        for variant in variants:
            name = served_name(model, variant)
            naiad, triton = matrix.naiad_repo / name, matrix.triton_repo / name
            peers = {"mlserver", "kserve"} if variant == "plain" else {"mlserver"}
            batching = {"max_batch_size": MAX_BATCH, "max_batch_time": QUEUE_DELAY_US / 1e6} if variant == "batched" else {}
            workload = load.make_workload(name)
            if model == "add_sub":
                files = {"config.pbtxt": config(name, "python", ADD_SUB_IO, variant), "1/model.py": ADD_SUB_PY}
                _write(naiad, files)
                _write(triton, files)
                who = {"naiad", "triton"} | peers
                peer_file = add_sub_onnx
            elif model == "add_sub_onnx":
                _write(naiad, {"config.pbtxt": config(name, "onnxruntime", ADD_SUB_IO, variant, ORT_ONE_THREAD),
                               "1/model.onnx": add_sub_onnx})
                who, peer_file = {"naiad"}, add_sub_onnx
                matrix.onnx_reference[name] = add_sub_onnx
            elif model == "mlp":
                _write(naiad, {"config.pbtxt": config(name, "onnxruntime", MLP_IO, variant, ORT_ONE_THREAD),
                               "1/model.onnx": mlp_onnx})
                _write(triton, {"config.pbtxt": config(name, "python", MLP_IO, variant),
                                "1/model.py": TRITON_MLP_PY, "1/model.onnx": mlp_onnx})
                who, peer_file = {"naiad", "triton"} | peers, mlp_onnx
                matrix.onnx_reference[name] = mlp_onnx
                workload = load.with_reference(workload, str(mlp_onnx))
            else:
                _write(naiad, {"config.pbtxt": config(name, "fil", XGBOOST_IO, variant, FIL_PARAMS),
                               "1/xgboost.json": xgboost_json})
                _write(triton, {"config.pbtxt": config(name, "python", XGBOOST_IO, variant),
                                "1/model.py": TRITON_XGBOOST_PY, "1/xgboost.json": xgboost_json})
                who, peer_file = {"naiad", "triton"} | peers, xgboost_json
                workload = _tree_check(predict, workload)
            if "mlserver" in who:
                runtime = "XGBoostBoosterModel" if model == "xgboost" else "OnnxRuntimeModel"
                matrix.mlserver[name] = {"implementation": f"mlserver_runtime.{runtime}",
                                         "parameters": {"uri": str(peer_file)}, **batching}
            if "kserve" in who:
                matrix.kserve[name] = peer_file
            matrix.served[(model, variant)] = who
            matrix.workloads[name] = workload
    return matrix
