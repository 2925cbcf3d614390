"""Generate a mixed-framework model repository that one Naiad server serves side by side.

    python examples/generate_mixed_models.py                 # writes examples/mixed_models/
    python examples/generate_mixed_models.py --output DIR    # writes DIR/
    naiad serve --model-repository examples/mixed_models

Models written (each trained or built here with its framework's own API, from fixed seeds):
  add_sub_onnx     ONNX Runtime   OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (FP32 [4])
  add_sub_torch    PyTorch        the same maths as TorchScript, Triton's INPUT__0/OUTPUT__0 naming
  fraud_xgboost    FIL (XGBoost)  binary classifier, xgboost.json, predict_proba -> output__0 [2]
  churn_lightgbm   FIL (LightGBM) 3-class model.txt with NO config.pbtxt: the server auto-completes it
  iris_forest      FIL (sklearn)  RandomForestClassifier -> Treelite checkpoint.tl, class index output

Python models: other generators plug in through PYTHON_MODEL_WRITERS (see below); each is called
with the repository path and writes its own <name>/config.pbtxt and <name>/1/model.py.

Needs numpy, onnx, torch, xgboost, lightgbm, scikit-learn and treelite (pip install 'naiad[pytorch,fil]' onnx).
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "mixed_models"
FEATURES = 16
SEED = 7

# The slot for Python-backend models: functions taking the repository root and writing one model each
# (return value: the in-process reference object for that model, or None).
PYTHON_MODEL_WRITERS: list[Callable[[Path], object]] = []


def _write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data)
    else:
        path.write_bytes(data)


def _table(rows: int = 2000, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic tabular data: features and a score that the labels are cut from."""
    x = np.random.default_rng(seed).standard_normal((rows, FEATURES)).astype(np.float32)
    score = x[:, 0] - 0.7 * x[:, 1] + 0.5 * x[:, 2] * x[:, 3] + 0.2 * np.sin(3 * x[:, 4])
    return x, score


def add_sub_onnx(repo: Path) -> None:
    from onnx import TensorProto, helper

    shape = ["batch", 4]
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]), helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])],
        "add_sub",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("OUTPUT0", "OUTPUT1")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="naiad-examples")
    model.ir_version = 8
    _write(repo / "add_sub_onnx" / "1" / "model.onnx", model.SerializeToString(deterministic=True))
    _write(
        repo / "add_sub_onnx" / "config.pbtxt",
        'backend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }]\n'
        'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }]\n'
        "dynamic_batching { }\n",
    )


def add_sub_torch(repo: Path) -> None:
    import torch

    class AddSub(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor):
            return a + b, a - b

    path = repo / "add_sub_torch" / "1" / "model.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.script(AddSub()).save(str(path))
    _write(
        repo / "add_sub_torch" / "config.pbtxt",
        'backend: "pytorch"\nmax_batch_size: 8\n'
        'input [{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 4 ] }]\n'
        'output [{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 4 ] }]\n'
        'instance_group [{ kind: KIND_CPU count: 1 }]\ndynamic_batching { }\n',
    )


def fraud_xgboost(repo: Path):
    import xgboost as xgb

    x, score = _table()
    params = {"objective": "binary:logistic", "max_depth": 4, "eta": 0.3, "nthread": 1, "seed": SEED}
    booster = xgb.train(params, xgb.DMatrix(x, label=(score > 0.3).astype(int)), num_boost_round=20)
    path = repo / "fraud_xgboost" / "1" / "xgboost.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    booster.save_model(str(path))
    _write(
        repo / "fraud_xgboost" / "config.pbtxt",
        'backend: "fil"\nmax_batch_size: 32768\n'
        f'input [{{ name: "input__0" data_type: TYPE_FP32 dims: [ {FEATURES} ] }}]\n'
        'output [{ name: "output__0" data_type: TYPE_FP32 dims: [ 2 ] }]\n'
        "instance_group [{ kind: KIND_CPU count: 1 }]\ndynamic_batching { }\n"
        'parameters { key: "model_type" value: { string_value: "xgboost_json" } }\n'
        'parameters { key: "is_classifier" value: { string_value: "true" } }\n'
        'parameters { key: "predict_proba" value: { string_value: "true" } }\n',
    )
    return booster


def churn_lightgbm(repo: Path):
    import lightgbm as lgb

    x, score = _table(seed=SEED + 1)
    labels = np.digitize(score, np.quantile(score, [1 / 3, 2 / 3]))
    params = {"objective": "multiclass", "num_class": 3, "num_leaves": 15, "verbose": -1, "num_threads": 1, "seed": SEED}
    booster = lgb.train(params, lgb.Dataset(x, label=labels), num_boost_round=20)
    path = repo / "churn_lightgbm" / "1" / "model.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    booster.save_model(str(path))  # no config.pbtxt: backend, I/O and batching come from the file
    return booster


def iris_forest(repo: Path):
    import treelite
    from sklearn.ensemble import RandomForestClassifier

    x, score = _table(seed=SEED + 2)
    labels = np.digitize(score, np.quantile(score, [1 / 3, 2 / 3]))
    forest = RandomForestClassifier(n_estimators=10, max_depth=6, random_state=SEED, n_jobs=1).fit(x, labels)
    path = repo / "iris_forest" / "1" / "checkpoint.tl"
    path.parent.mkdir(parents=True, exist_ok=True)
    treelite.sklearn.import_model(forest).serialize(str(path))
    _write(
        repo / "iris_forest" / "config.pbtxt",
        'backend: "fil"\nmax_batch_size: 4096\n'
        f'input [{{ name: "input__0" data_type: TYPE_FP32 dims: [ {FEATURES} ] }}]\n'
        'output [{ name: "output__0" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
        "dynamic_batching { }\n"
        'parameters { key: "model_type" value: { string_value: "treelite_checkpoint" } }\n'
        'parameters { key: "is_classifier" value: { string_value: "true" } }\n',
    )
    return forest


# Each writer returns the framework object it trained (to compare the server with), or None.
WRITERS: list[Callable[[Path], object]] = [add_sub_onnx, add_sub_torch, fraud_xgboost, churn_lightgbm, iris_forest]


def write_repository(output: Path) -> dict[str, object]:
    """Write every model into `output`; returns {writer name: trained framework object or None}."""
    output.mkdir(parents=True, exist_ok=True)
    return {writer.__name__: writer(output) for writer in WRITERS + PYTHON_MODEL_WRITERS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="repository directory to write")
    args = parser.parse_args()
    models = write_repository(args.output)
    print(f"wrote {len(models)} models to {args.output}: {', '.join(models)}")


if __name__ == "__main__":
    main()
