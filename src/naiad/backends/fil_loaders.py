"""Tree-model files -> a Forest that predicts like the framework that trained it (XGBoost, LightGBM, Treelite)."""

from __future__ import annotations

import ctypes
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from naiad.config.model_config import ConfigError

log = logging.getLogger(__name__)

# model_type -> Triton's default file name in the version directory.
MODEL_TYPE_FILENAMES = {
    "xgboost_ubj": "xgboost.ubj",
    "xgboost_json": "xgboost.json",
    "xgboost": "xgboost.model",
    "lightgbm": "model.txt",
    "treelite_checkpoint": "checkpoint.tl",
}
_SUFFIX_TYPES = {".ubj": "xgboost_ubj", ".json": "xgboost_json", ".txt": "lightgbm", ".tl": "treelite_checkpoint"}
_FRAMEWORK_PACKAGES = {
    "xgboost_ubj": "xgboost",
    "xgboost_json": "xgboost",
    "xgboost": "xgboost",
    "lightgbm": "lightgbm",
    "treelite_checkpoint": "treelite",
}


@dataclass
class Forest:
    """A loaded tree ensemble.

    `predict(x)` takes (rows, n_features) float32 and returns (rows, n_outputs) float32 with the model's
    own output transform applied (probabilities for classifiers, values for regressors): exactly what
    the framework's predict returns, as FP32. `task` is "regression", "binary" or "multiclass";
    `n_classes` counts classes the way FIL does (1 for binary models whose predict is p(positive)).
    `class_index_output` marks models whose predict already returns a class index (XGBoost multi:softmax);
    their probabilities come from `predict_proba`. `contributions(x)` is the framework's exact TreeSHAP
    (rows, n_features + 1) or (rows, shap_groups, n_features + 1), bias last; None when the engine has none.
    """

    model_type: str
    engine: str
    n_features: int
    n_outputs: int
    n_classes: int
    task: str
    predict: Callable[[np.ndarray], np.ndarray]
    predict_proba: Callable[[np.ndarray], np.ndarray] | None = None
    class_index_output: bool = False
    contributions: Callable[[np.ndarray], np.ndarray] | None = None

    @property
    def shap_groups(self) -> int:
        """SHAP blocks per row: one per class for multiclass models, one per target otherwise."""
        return self.n_classes if self.task == "multiclass" else self.n_outputs

    def describe(self) -> str:
        kind = {"binary": "binary classifier", "multiclass": f"{self.n_classes}-class classifier"}.get(self.task, "regressor")
        return f"{self.model_type} {kind}, {self.n_features} features, predicting with {self.engine}"


def model_type_for_file(path: Path) -> str | None:
    """Guess model_type from a file name (Triton's default names first, then the suffix)."""
    for model_type, filename in MODEL_TYPE_FILENAMES.items():
        if path.name == filename:
            return model_type
    return _SUFFIX_TYPES.get(path.suffix)


def resolve_model_file(model_file: Path, model_type: str | None) -> tuple[Path, str]:
    """The file to load and its model_type; `model_file` may be the version directory (no default name)."""
    if model_file.is_dir():
        if model_type:
            if model_type not in MODEL_TYPE_FILENAMES:
                raise ConfigError(_unknown_type(model_type))
            return model_file / MODEL_TYPE_FILENAMES[model_type], model_type
        for candidate_type, filename in MODEL_TYPE_FILENAMES.items():
            if (model_file / filename).exists():
                return model_file / filename, candidate_type
        names = ", ".join(MODEL_TYPE_FILENAMES.values())
        raise ConfigError(f"no tree model file in '{model_file}': expected one of {names} (or set default_model_filename)")
    if model_type:
        if model_type not in MODEL_TYPE_FILENAMES:
            raise ConfigError(_unknown_type(model_type))
        return model_file, model_type
    guessed = model_type_for_file(model_file)
    if guessed is None:
        raise ConfigError(
            f"cannot tell the format of '{model_file.name}': set parameter model_type to one of {sorted(MODEL_TYPE_FILENAMES)}"
        )
    return model_file, guessed


def _unknown_type(model_type: str) -> str:
    return f"parameter model_type '{model_type}' is not one of {sorted(MODEL_TYPE_FILENAMES)}"


def load_forest(path: Path, model_type: str, threads: int) -> Forest:
    """Load `path` with the framework that wrote it; `threads` <= 0 leaves the framework's default."""
    if not path.exists():
        raise ConfigError(f"unable to find tree model file '{path}'")
    package = _FRAMEWORK_PACKAGES[model_type]
    try:
        if model_type.startswith("xgboost"):
            return _load_xgboost(path, model_type, threads)
        if model_type == "lightgbm":
            return _load_lightgbm(path, threads)
        return _load_treelite(path, threads)
    except ImportError as exc:
        raise ConfigError(
            f"model_type '{model_type}' needs the '{package}' package, which is not installed ({exc}); "
            "install the FIL extra: pip install 'naiad[fil]'"
        ) from None


def _as_rows(values: np.ndarray, rows: int) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).reshape(rows, -1)


def _softmax(margins: np.ndarray) -> np.ndarray:
    shifted = margins - margins.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


class _DensePredict:
    """XGBoosterPredictFromDense called directly: the C function `inplace_predict` ends in, without the
    ~0.1-0.3 ms of Python dispatch it adds per call (input type sniffing, imports, JSON, a class built per
    result), which is most of the cost of a small batch. Same C call, same numbers."""

    def __init__(self, booster, margin: bool) -> None:
        from xgboost import core

        self._booster = booster  # owns the handle
        self._call = core._LIB.XGBoosterPredictFromDense
        self._check = core._check_call
        self._ulong = core.c_bst_ulong
        self._no_proxy = ctypes.c_void_p()
        self._args = core.make_jcargs(
            type=1 if margin else 0, training=False, iteration_begin=0, iteration_end=0, missing=float("nan"),
            strict_shape=False, cache_id=0,
        )

    def __call__(self, x: np.ndarray) -> np.ndarray:
        # XGBoost rejects a pointer that is not 4-byte aligned (a tensor sliced out of a request body can be).
        if x.dtype != np.float32 or not x.flags.c_contiguous or not x.flags.aligned:
            x = np.array(x, dtype=np.float32, order="C")
        interface = b'{"data": [%d, true], "shape": [%d, %d], "strides": null, "typestr": "<f4", "version": 3}' % (
            x.ctypes.data, x.shape[0], x.shape[1])
        shape = ctypes.POINTER(self._ulong)()
        dims = self._ulong()
        preds = ctypes.POINTER(ctypes.c_float)()
        self._check(self._call(self._booster.handle, interface, self._args, self._no_proxy,
                               ctypes.byref(shape), ctypes.byref(dims), ctypes.byref(preds)))
        size = 1
        for i in range(dims.value):
            size *= shape[i]
        # The result lives in the booster's buffer until its next call: copy it out.
        return np.ctypeslib.as_array(preds, (size,)).copy()


def _fast_predict(booster, margin: bool, n_features: int) -> Callable[[np.ndarray], np.ndarray] | None:
    """The direct C call when it answers exactly like inplace_predict on a probe batch, else None."""
    probe = np.random.default_rng(0).standard_normal((5, n_features)).astype(np.float32)
    probe[1, 0] = np.nan
    try:
        fast = _DensePredict(booster, margin)
        expected = booster.inplace_predict(probe, validate_features=False, predict_type="margin" if margin else "value")
        if np.array_equal(fast(probe), np.asarray(expected).reshape(-1), equal_nan=True):
            return fast
    except Exception as exc:  # an XGBoost whose private bindings moved: keep the public API
        log.info("XGBoost direct predict unavailable (%s); using inplace_predict", exc)
    return None


def _load_xgboost(path: Path, model_type: str, threads: int) -> Forest:
    import xgboost as xgb

    booster = xgb.Booster()
    try:
        if model_type in ("xgboost_json", "xgboost_ubj"):
            booster.load_model(str(path))
        else:
            # Legacy binary name; current XGBoost writes UBJSON under any other suffix. Loading from
            # a buffer lets XGBoost detect the content instead of guessing from the suffix.
            booster.load_model(bytearray(path.read_bytes()))
    except xgb.core.XGBoostError as exc:
        if model_type != "xgboost":
            raise ConfigError(f"unable to load XGBoost model '{path}': {exc}") from None
        return _load_xgboost_legacy_with_treelite(path, threads, exc)
    if threads > 0:
        booster.set_param({"nthread": threads})
    learner = json.loads(booster.save_config())["learner"]
    objective = learner["objective"]["name"]
    params = learner["learner_model_param"]
    num_class = int(params.get("num_class", "0") or 0)
    num_target = int(params.get("num_target", "1") or 1)
    n_features = booster.num_features()

    fast = _fast_predict(booster, False, n_features)

    def predict(x: np.ndarray) -> np.ndarray:
        if fast is not None:
            return fast(x).reshape(x.shape[0], -1)
        return _as_rows(booster.inplace_predict(x, validate_features=False), x.shape[0])

    def contributions(x: np.ndarray) -> np.ndarray:
        # inplace_predict has no SHAP path; pred_contribs needs a DMatrix.
        dmatrix = xgb.DMatrix(x, nthread=threads if threads > 0 else -1)
        return np.asarray(booster.predict(dmatrix, pred_contribs=True, validate_features=False), dtype=np.float32)

    if objective == "multi:softmax":

        fast_margin = _fast_predict(booster, True, n_features)

        def softmax_proba(x: np.ndarray) -> np.ndarray:
            if fast_margin is not None:
                return _softmax(fast_margin(x).reshape(x.shape[0], -1))
            margins = booster.inplace_predict(x, validate_features=False, predict_type="margin")
            return _softmax(_as_rows(margins, x.shape[0]))

        return Forest(model_type, "xgboost", n_features, 1, num_class, "multiclass", predict, softmax_proba, True, contributions)
    if objective.startswith("multi:"):
        return Forest(model_type, "xgboost", n_features, num_class, num_class, "multiclass", predict, contributions=contributions)
    task = "binary" if objective.startswith("binary:") else "regression"
    return Forest(model_type, "xgboost", n_features, max(num_target, 1), 1, task, predict, contributions=contributions)


def _load_xgboost_legacy_with_treelite(path: Path, threads: int, xgb_error: Exception) -> Forest:
    try:
        import treelite
    except ImportError:
        raise ConfigError(
            f"unable to load legacy XGBoost binary model '{path}' with this XGBoost ({xgb_error}); "
            "install treelite (pip install 'naiad[fil]') to read the old binary format"
        ) from None
    try:
        model = treelite.frontend.load_xgboost_model_legacy_binary(str(path))
    except Exception as exc:
        raise ConfigError(f"unable to load XGBoost model '{path}': {xgb_error}; treelite: {exc}") from None
    return _forest_from_treelite(model, "xgboost", threads)


def _lightgbm_task(booster) -> tuple[str, int]:
    objective = str(booster.dump_model(num_iteration=0).get("objective", "")).split(" ")[0]
    per_iteration = booster.num_model_per_iteration()
    if objective in ("multiclass", "softmax", "multiclassova", "multiclass_ova", "ova", "ovr"):
        return "multiclass", per_iteration
    if objective == "binary":
        return "binary", 1
    return "regression", per_iteration


def _load_lightgbm(path: Path, threads: int) -> Forest:
    import lightgbm as lgb

    try:
        booster = lgb.Booster(model_file=str(path))
    except lgb.basic.LightGBMError as exc:
        raise ConfigError(f"unable to load LightGBM model '{path}': {exc}") from None
    task, outputs = _lightgbm_task(booster)
    kwargs = {"num_threads": threads} if threads > 0 else {}

    def predict(x: np.ndarray) -> np.ndarray:
        return _as_rows(booster.predict(x, **kwargs), x.shape[0])

    n_features = booster.num_feature()

    def contributions(x: np.ndarray) -> np.ndarray:
        # LightGBM lays classes side by side in one row: (rows, classes * (features + 1)).
        values = np.asarray(booster.predict(x, pred_contrib=True, **kwargs), dtype=np.float32)
        return values.reshape(x.shape[0], -1, n_features + 1) if outputs > 1 else values.reshape(x.shape[0], n_features + 1)

    classes = outputs if task == "multiclass" else 1
    return Forest("lightgbm", "lightgbm", n_features, outputs, classes, task, predict, contributions=contributions)


def _load_treelite(path: Path, threads: int) -> Forest:
    import treelite

    try:
        model = treelite.Model.deserialize(str(path))
    except Exception as exc:  # treelite raises TreeliteError, or a C++ error for a foreign file
        raise ConfigError(f"unable to load Treelite checkpoint '{path}': {exc}") from None
    return _forest_from_treelite(model, "treelite_checkpoint", threads)


def _forest_from_treelite(model, model_type: str, threads: int) -> Forest:
    import treelite

    header = model.get_header_accessor()
    n_features = int(header.get_field("num_feature")[0])
    num_target = int(header.get_field("num_target")[0])
    num_class = [int(c) for c in header.get_field("num_class")]
    postprocessor = header.get_field("postprocessor")
    nthread = threads if threads > 0 else -1
    multiclass = num_target == 1 and num_class[0] > 1
    if multiclass:
        task, outputs = "multiclass", num_class[0]
    else:
        task = "binary" if postprocessor in ("sigmoid", "exponential_standard_ratio") else "regression"
        outputs = max(num_target, 1)

    def predict(x: np.ndarray) -> np.ndarray:
        return _as_rows(treelite.gtil.predict(model, x, nthread=nthread), x.shape[0])

    classes = outputs if task == "multiclass" else 1
    return Forest(model_type, "treelite", n_features, outputs, classes, task, predict)
