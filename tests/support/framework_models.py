"""Writes small real models with each framework's own API (XGBoost, LightGBM, scikit-learn via Treelite,
TorchScript, torch.export, OpenVINO IR, TensorFlow SavedModel) into Triton model directories."""

from __future__ import annotations

from pathlib import Path

import numpy as np

FEATURES = 8


def features(rows: int, seed: int = 0, n_features: int = FEATURES) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, n_features)).astype(np.float32)


def _labels(x: np.ndarray, classes: int) -> np.ndarray:
    score = x[:, 0] + 0.5 * x[:, 1] * x[:, 2] - 0.3 * x[:, 3]
    if classes == 2:
        return (score > 0).astype(np.int64)
    edges = np.quantile(score, np.linspace(0, 1, classes + 1)[1:-1])
    return np.digitize(score, edges).astype(np.int64)


def _target(x: np.ndarray) -> np.ndarray:
    return (x[:, 0] * 2.0 - x[:, 1] + 0.5 * x[:, 2] ** 2).astype(np.float32)


def write_config(model_dir: Path, text: str) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(text)


def version_dir(repo: Path, name: str, version: int = 1) -> Path:
    path = repo / name / str(version)
    path.mkdir(parents=True, exist_ok=True)
    return path


def fil_config(name: str, n_features: int, width: int, model_type: str = "", max_batch_size: int = 1024, **params: str) -> str:
    """A Triton FIL config.pbtxt (parameters as given; model_type only when set)."""
    if model_type:
        params = {"model_type": model_type, **params}
    parameters = "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in params.items())
    return (
        f'name: "{name}"\nbackend: "fil"\nmax_batch_size: {max_batch_size}\n'
        f'input [{{ name: "input__0" data_type: TYPE_FP32 dims: [ {n_features} ] }}]\n'
        f'output [{{ name: "output__0" data_type: TYPE_FP32 dims: [ {width} ] }}]\n'
        f"instance_group [{{ kind: KIND_CPU count: 1 }}]\ndynamic_batching {{ }}\n{parameters}"
    )


# ----------------------------------------------------------------------------- XGBoost


def xgboost_booster(task: str, trees: int = 8, depth: int = 3, n_features: int = FEATURES, rows: int = 400, seed: int = 0):
    """A trained xgboost.Booster; task: binary, multiclass (3 classes, softprob), softmax, regression."""
    import xgboost as xgb

    x = features(rows, seed, n_features)
    params: dict = {"max_depth": depth, "eta": 0.3, "nthread": 1, "seed": seed}
    if task == "binary":
        params["objective"], y = "binary:logistic", _labels(x, 2)
    elif task in ("multiclass", "softmax"):
        params["objective"] = "multi:softprob" if task == "multiclass" else "multi:softmax"
        params["num_class"], y = 3, _labels(x, 3)
    else:
        params["objective"], y = "reg:squarederror", _target(x)
    return xgb.train(params, xgb.DMatrix(x, label=y), num_boost_round=trees)


def xgboost_classifier(n_features: int = FEATURES, classes: int = 2, trees: int = 8, seed: int = 0):
    """A fitted xgboost.XGBClassifier (the scikit-learn API)."""
    import xgboost as xgb

    x = features(300, seed, n_features)
    return xgb.XGBClassifier(n_estimators=trees, max_depth=3, n_jobs=1, random_state=seed).fit(x, _labels(x, classes))


def save_xgboost(booster, path: Path) -> Path:
    """Saved by the suffix: .json JSON, .ubj UBJSON; others (Triton's `xgboost.model`) as XGBoost's default."""
    import warnings

    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Saving model in the UBJSON format as default")
        booster.save_model(str(path))
    return path


# ----------------------------------------------------------------------------- LightGBM


def lightgbm_booster(task: str, trees: int = 8, n_features: int = FEATURES, rows: int = 400, seed: int = 0):
    """A trained lightgbm.Booster; task: binary, multiclass (3 classes), regression."""
    import lightgbm as lgb

    x = features(rows, seed, n_features)
    params: dict = {"num_leaves": 8, "min_data_in_leaf": 5, "verbose": -1, "num_threads": 1, "seed": seed}
    if task == "binary":
        params["objective"], y = "binary", _labels(x, 2)
    elif task == "multiclass":
        params["objective"], params["num_class"], y = "multiclass", 3, _labels(x, 3)
    else:
        params["objective"], y = "regression", _target(x)
    return lgb.train(params, lgb.Dataset(x, label=y), num_boost_round=trees)


def save_lightgbm(booster, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    booster.save_model(str(path))
    return path


# ----------------------------------------------------------------------------- scikit-learn via Treelite


def sklearn_forest(task: str, trees: int = 5, n_features: int = FEATURES, seed: int = 0):
    """A fitted RandomForestClassifier (task binary / multiclass) or RandomForestRegressor."""
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

    x = features(300, seed, n_features)
    if task == "regression":
        return RandomForestRegressor(n_estimators=trees, max_depth=5, random_state=seed, n_jobs=1).fit(x, _target(x))
    classes = 2 if task == "binary" else 3
    return RandomForestClassifier(n_estimators=trees, max_depth=5, random_state=seed, n_jobs=1).fit(x, _labels(x, classes))


def save_treelite_checkpoint(estimator, path: Path) -> Path:
    import treelite

    path.parent.mkdir(parents=True, exist_ok=True)
    treelite.sklearn.import_model(estimator).serialize(str(path))
    return path


# ----------------------------------------------------------------------------- PyTorch


def torch_modules():
    """TorchScript-able modules covering Triton's PyTorch naming conventions (built lazily: torch is heavy)."""

    import torch

    class AddSub(torch.nn.Module):
        def forward(self, input0: torch.Tensor, input1: torch.Tensor):
            return input0 + input1, input0 - input1

    class Linear(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.fc = torch.nn.Linear(FEATURES, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(self.fc(x), dim=-1)

    class DictInput(torch.nn.Module):
        def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
            return inputs["a"] * 2.0 + inputs["b"]

    class Labels(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> list[str]:
            out: list[str] = []
            flat = x.reshape(-1)
            for i in range(flat.shape[0]):
                out.append("pos" if bool(flat[i] > 0) else "neg")
            return out

    class IntOps(torch.nn.Module):
        def forward(self, x: torch.Tensor, flag: torch.Tensor):
            return x * 3, torch.logical_not(flag)

    return {"add_sub": AddSub, "linear": Linear, "dict_input": DictInput, "labels": Labels, "int_ops": IntOps}


def save_torchscript(module_name: str, path: Path) -> Path:
    import warnings

    import torch

    module = torch_modules()[module_name]()
    module.eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`torch.jit.script` is deprecated", category=DeprecationWarning)
        torch.jit.script(module).save(str(path))
    return path


def save_torch_export(path: Path, batch: int = 4) -> Path:
    """A torch.export ExportedProgram of the Linear module with a dynamic batch dimension."""
    import torch

    module = torch_modules()["linear"]().eval()
    example = (torch.randn(batch, FEATURES),)
    program = torch.export.export(module, example, dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=1024)},))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))
    return path


def save_aoti_package(path: Path, n_features: int = 4) -> Path:
    """An AOTInductor package (compiled C++, ~20 s) of y = x * 2 + 1 for a [1, n_features] input."""
    import torch

    class Affine(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2.0 + 1.0

    program = torch.export.export(Affine(), (torch.zeros(1, n_features),))
    path.parent.mkdir(parents=True, exist_ok=True)
    options = {"aot_inductor.compile_wrapper_opt_level": "O0"}  # compile time, not speed, matters here
    torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=options)
    return path


def linear_reference(x: np.ndarray) -> np.ndarray:
    """What the `linear` module computes, by calling it in-process."""
    import torch

    module = torch_modules()["linear"]().eval()
    with torch.inference_mode():
        return module(torch.from_numpy(x)).numpy()


# ----------------------------------------------------------------------------- OpenVINO


def save_openvino_ir(path: Path, n_features: int = FEATURES, outputs: int = 3, batch_dim: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """model.xml + model.bin: Y = relu(X @ W + b), built with openvino's opset API; returns (W, b)."""
    import openvino as ov
    import openvino.opset13 as ops

    rng = np.random.default_rng(3)
    weights = rng.standard_normal((n_features, outputs)).astype(np.float32)
    bias = rng.standard_normal(outputs).astype(np.float32)
    x = ops.parameter([batch_dim, n_features], np.float32, name="X")
    y = ops.relu(ops.add(ops.matmul(x, ops.constant(weights), False, False), ops.constant(bias)))
    y.output(0).get_tensor().set_names({"Y"})
    model = ov.Model([y], [x], "linear_relu")
    path.parent.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, str(path), compress_to_fp16=False)
    return weights, bias


# ----------------------------------------------------------------------------- TensorFlow


def save_tf_savedmodel(path: Path, n_features: int = 4) -> None:
    """model.savedmodel/: serving_default(x FP32 [None, n], tag STRING [None]) -> {scaled, echo}."""
    import tensorflow as tf

    class Scale(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec([None, n_features], tf.float32, name="x"),
                tf.TensorSpec([None], tf.string, name="tag"),
            ]
        )
        def serve(self, x, tag):
            return {"scaled": x * 3.0 + 1.0, "echo": tf.strings.join([tag, "!"])}

    module = Scale()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})


def save_tf_graphdef(path: Path, n_features: int = 4) -> tuple[str, str]:
    """model.graphdef: a frozen graph computing y = x * 2 - 1; returns its (input, output) node names."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    @tf.function(input_signature=[tf.TensorSpec([None, n_features], tf.float32, name="x")])
    def double(x):
        return tf.identity(x * 2.0 - 1.0, name="y")

    frozen = convert_variables_to_constants_v2(double.get_concrete_function())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(frozen.graph.as_graph_def().SerializeToString())
    return frozen.inputs[0].name.split(":")[0], frozen.outputs[0].name.split(":")[0]


def save_tf_sequence_graphdef(path: Path, batching: bool, dyna: bool) -> None:
    """model.graphdef of a TF1 graph fed by sequence control inputs, as Triton's simple_(dyna_)sequence.

    INT32 placeholders INPUT, START, READY, and with dyna END plus CORRID (UINT64), all [None, 1]
    (or [1] without batching); OUTPUT = READY * (INPUT + START (+ END * CORRID with dyna)).
    """
    import tensorflow as tf

    shape = [None, 1] if batching else [1]
    names = ("INPUT", "START", "READY", "END") if dyna else ("INPUT", "START", "READY")
    graph = tf.Graph()
    with graph.as_default():
        feeds = {name: tf.compat.v1.placeholder(tf.int32, shape, name) for name in names}
        total = feeds["INPUT"] + feeds["START"]
        if dyna:
            total += feeds["END"] * tf.cast(tf.compat.v1.placeholder(tf.uint64, shape, "CORRID"), tf.int32)
        tf.identity(feeds["READY"] * total, name="OUTPUT")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(graph.as_graph_def().SerializeToString())


def save_tf_state_graphdef(path: Path) -> None:
    """model.graphdef of a TF1 graph with implicit state: OUTPUT = STATE_IN * (1 - START) + INPUT = STATE_OUT.

    INPUT, START, STATE_IN are INT32 placeholders of shape [None, 1].
    """
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        value, start, state = (tf.compat.v1.placeholder(tf.int32, [None, 1], n) for n in ("INPUT", "START", "STATE_IN"))
        total = state * (1 - start) + value
        tf.identity(total, name="OUTPUT")
        tf.identity(total, name="STATE_OUT")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(graph.as_graph_def().SerializeToString())


def save_tf_sequence_savedmodel(path: Path) -> None:
    """model.savedmodel/: serving_default(INPUT, START, READY: INT32 [None, 1]) -> {OUTPUT: READY * (INPUT + START)}."""
    import tensorflow as tf

    spec = [tf.TensorSpec([None, 1], tf.int32, name=n) for n in ("INPUT", "START", "READY")]

    class Sequence(tf.Module):
        @tf.function(input_signature=spec)
        def serve(self, INPUT, START, READY):  # the signature's keys are Triton's tensor names
            return {"OUTPUT": READY * (INPUT + START)}

    module = Sequence()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
