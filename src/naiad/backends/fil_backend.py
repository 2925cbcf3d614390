"""FIL backend (`backend: "fil"`): XGBoost, LightGBM and Treelite forests with Triton FIL's I/O and parameters."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import ExecutionBatch, InstanceSpec, ModelSource
from naiad.backends.fil_loaders import Forest, load_forest, resolve_model_file
from naiad.config.model_config import ConfigError, parameter, parse_bool

log = logging.getLogger(__name__)

INPUT_NAME = "input__0"
OUTPUT_NAME = "output__0"
SHAP_OUTPUT_NAME = "treeshap_output"
# Accepted for compatibility; they tune RAPIDS FIL's GPU kernels and change nothing on the CPU.
_NO_EFFECT_ON_CPU = (
    "layout", "algo", "chunk_size", "threads_per_tree", "transfer_threshold", "use_experimental_optimizations",
    "xgboost_allow_unknown_field",
)
_REMOVED = ("storage_type", "blocks_per_sm")
# Auto-completed FIL models batch this many rows (spec: FIL's max_batch_size is large; a client sends a whole
# table in one request). A larger --backend-config default-max-batch-size wins.
FIL_MAX_BATCH_SIZE = 32768


@dataclass(frozen=True)
class FilParameters:
    """The FIL parameters of one model config, parsed and checked."""

    model_type: str | None
    is_classifier: bool
    predict_proba: bool
    threshold: float
    threads: int

    @classmethod
    def from_config(cls, config: mc.ModelConfig, warn: bool = False) -> FilParameters:
        name = config.name
        is_classifier_text = parameter(config, "is_classifier")
        if is_classifier_text is None and parameter(config, "output_class") is not None:
            is_classifier_text = parameter(config, "output_class")
            if warn:
                log.warning("model '%s': parameter 'output_class' is deprecated, use 'is_classifier'", name)
        if warn:
            for key in _REMOVED:
                if key in config.parameters:
                    log.warning("model '%s': parameter '%s' was removed from FIL and is ignored", name, key)
            for key in _NO_EFFECT_ON_CPU:
                if key in config.parameters:
                    log.info("model '%s': parameter '%s' only tunes GPU execution; ignored on CPU", name, key)
        threshold_text = parameter(config, "threshold", "") or "0.5"
        try:
            threshold = float(threshold_text)
        except ValueError:
            raise ConfigError(f"model '{name}': parameter 'threshold' must be a number, got '{threshold_text}'") from None
        threads_text = parameter(config, "cpu_nthread", "") or "0"
        try:
            threads = int(threads_text)
        except ValueError:
            raise ConfigError(f"model '{name}': parameter 'cpu_nthread' must be an integer, got '{threads_text}'") from None
        return cls(
            model_type=(parameter(config, "model_type") or "").strip() or None,
            is_classifier=parse_bool(is_classifier_text),
            predict_proba=parse_bool(parameter(config, "predict_proba")),
            threshold=threshold,
            threads=threads,
        )


def output_width(forest: Forest, params: FilParameters, declared: int | None = None) -> int:
    """Values per row in output__0, by Triton FIL's rules (binary predict_proba: 1 or 2 as declared)."""
    if not params.is_classifier:
        return forest.n_outputs
    if not params.predict_proba:
        return 1
    if forest.n_classes == 1:
        return 1 if declared == 1 else 2
    return forest.n_classes


def predict_rows(forest: Forest, params: FilParameters, x: np.ndarray, width: int) -> np.ndarray:
    """(rows, n_features) float32 -> (rows, width) float32, FIL's output semantics."""
    if not params.is_classifier:
        return forest.predict(x)
    if params.predict_proba:
        proba = forest.predict_proba(x) if forest.predict_proba is not None else forest.predict(x)
        if proba.shape[1] == 1 and width == 2:
            p = proba[:, 0]
            return np.stack([1.0 - p, p], axis=1).astype(np.float32, copy=False)
        return proba
    if forest.class_index_output:
        return forest.predict(x)
    scores = forest.predict(x)
    if scores.shape[1] == 1:
        return (scores > params.threshold).astype(np.float32)
    return np.argmax(scores, axis=1).astype(np.float32).reshape(-1, 1)


def _is_batching(config: mc.ModelConfig) -> bool:
    return config.max_batch_size > 0


def shap_dims(forest: Forest) -> list[int]:
    """treeshap_output dims per row, as Triton FIL declares them: [n_features + 1], per class for multiclass."""
    if forest.shap_groups > 1:
        return [forest.shap_groups, forest.n_features + 1]
    return [forest.n_features + 1]


def _check_shap_output(name: str, tensor: mc.ModelOutput, forest: Forest, batching: bool) -> None:
    if forest.contributions is None:
        raise ConfigError(
            f"model '{name}': output '{SHAP_OUTPUT_NAME}' needs the framework's TreeSHAP, which Naiad takes from "
            f"XGBoost (model_type xgboost_json, xgboost_ubj, xgboost) and LightGBM (model_type lightgbm); this "
            f"model is a {forest.model_type} predicted with {forest.engine}, which has none: remove the output"
        )
    if tensor.data_type != mc.TYPE_FP32:
        raise ConfigError(
            f"model '{name}': FIL tensor '{SHAP_OUTPUT_NAME}' must be TYPE_FP32, not {mc.DataType.Name(tensor.data_type)}"
        )
    expected = ([] if batching else [-1]) + shap_dims(forest)
    dims = list(tensor.dims)
    if len(dims) != len(expected) or any(d not in (-1, e) for d, e in zip(dims, expected)):
        raise ConfigError(
            f"model '{name}': output '{SHAP_OUTPUT_NAME}' dims {dims} do not match the model: expected "
            f"{expected} (n_features + 1 = {forest.n_features + 1} values, bias last"
            + (f", for each of {forest.shap_groups} classes" if forest.shap_groups > 1 else "") + ")"
        )


class FilBackend:
    """`backend: "fil"`: the tree model is loaded by its own framework, outputs follow RAPIDS FIL."""

    name = "fil"
    kind = "tensor"

    def auto_complete_config(self, config: mc.ModelConfig, model_file: Path, default_max_batch_size: int) -> None:
        params = FilParameters.from_config(config)
        path, model_type = resolve_model_file(model_file, params.model_type)
        forest = load_forest(path, model_type, threads=1)
        declared_inputs = {t.name: t for t in config.input}
        if config.max_batch_size == 0:
            full_rank = any(len(t.dims) >= 2 for t in declared_inputs.values())
            if not full_rank:
                config.max_batch_size = max(default_max_batch_size, FIL_MAX_BATCH_SIZE)
                if config.max_batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
                    config.dynamic_batching.SetInParent()
        lead = [] if _is_batching(config) else [-1]
        if not config.input:
            entry = config.input.add()
            entry.name, entry.data_type = INPUT_NAME, mc.TYPE_FP32
            entry.dims.extend(lead + [forest.n_features])
        for tensor in config.input:
            if tensor.data_type == mc.TYPE_INVALID:
                tensor.data_type = mc.TYPE_FP32
            if not tensor.dims:
                tensor.dims.extend(lead + [forest.n_features])
        if not config.output:
            entry = config.output.add()
            entry.name, entry.data_type = OUTPUT_NAME, mc.TYPE_FP32
            entry.dims.extend(lead + [output_width(forest, params)])
        # treeshap_output is only served when the config declares it (it costs far more than predict).
        for tensor in config.output:
            if tensor.data_type == mc.TYPE_INVALID:
                tensor.data_type = mc.TYPE_FP32
            if not tensor.dims and tensor.name == OUTPUT_NAME:
                tensor.dims.extend(lead + [output_width(forest, params)])
            if not tensor.dims and tensor.name == SHAP_OUTPUT_NAME:
                tensor.dims.extend(lead + shap_dims(forest))
        _check_io(config, forest, params)

    def create_instance(self, source: ModelSource, spec: InstanceSpec) -> FilInstance:
        return FilInstance(source, spec)


def _check_io(config: mc.ModelConfig, forest: Forest, params: FilParameters) -> int:
    """FIL's fixed tensor names and types; returns the output width the config declares."""
    name = config.name
    inputs = {t.name: t for t in config.input}
    outputs = {t.name: t for t in config.output}
    if set(inputs) != {INPUT_NAME}:
        raise ConfigError(
            f"model '{name}': a FIL model has exactly one input named '{INPUT_NAME}' (TYPE_FP32, dims "
            f"[{forest.n_features}]); the config has {sorted(inputs)}"
        )
    if OUTPUT_NAME not in outputs:
        raise ConfigError(f"model '{name}': a FIL model's output must be named '{OUTPUT_NAME}'; the config has {sorted(outputs)}")
    extra = sorted(set(outputs) - {OUTPUT_NAME, SHAP_OUTPUT_NAME})
    if extra:
        raise ConfigError(
            f"model '{name}': unsupported FIL outputs {extra}; a FIL model has '{OUTPUT_NAME}' and optionally '{SHAP_OUTPUT_NAME}'"
        )
    if SHAP_OUTPUT_NAME in outputs:
        _check_shap_output(name, outputs[SHAP_OUTPUT_NAME], forest, _is_batching(config))
    for tensor in (inputs[INPUT_NAME], outputs[OUTPUT_NAME]):
        if tensor.data_type != mc.TYPE_FP32:
            raise ConfigError(
                f"model '{name}': FIL tensor '{tensor.name}' must be TYPE_FP32, not {mc.DataType.Name(tensor.data_type)}"
            )
    features = inputs[INPUT_NAME].dims[-1] if inputs[INPUT_NAME].dims else -1
    if features not in (-1, forest.n_features):
        raise ConfigError(
            f"model '{name}': input '{INPUT_NAME}' has {features} features in the config but the model "
            f"was trained on {forest.n_features}"
        )
    dims = outputs[OUTPUT_NAME].dims
    declared = dims[-1] if dims else -1
    width = output_width(forest, params, declared if declared > 0 else None)
    if declared not in (-1, width):
        raise ConfigError(
            f"model '{name}': output '{OUTPUT_NAME}' dims {list(dims)} do not match the model: a "
            f"{forest.describe().split(',')[0]} with is_classifier={str(params.is_classifier).lower()}, "
            f"predict_proba={str(params.predict_proba).lower()} gives {width} value(s) per row"
        )
    return width


class FilInstance:
    """One loaded forest; XGBoost, LightGBM and Treelite predict without the GIL, so instances run in parallel."""

    def __init__(self, source: ModelSource, spec: InstanceSpec) -> None:
        self.name = spec.name
        config = source.config
        self._params = FilParameters.from_config(config, warn=spec.name.endswith("_0"))
        path, model_type = resolve_model_file(source.model_file, self._params.model_type)
        threads = self._params.threads if self._params.threads > 0 else 1
        self._forest = load_forest(path, model_type, threads)
        if spec.kind == mc.ModelInstanceGroup.KIND_GPU:
            log.warning("FIL instance '%s' asked for GPU %d; Naiad's FIL backend runs on the CPU", spec.name, spec.device_id)
        self._width = _check_io(config, self._forest, self._params)
        self._batching = _is_batching(config)
        self._n_features = self._forest.n_features
        log.info("FIL instance '%s': %s", spec.name, self._forest.describe())

    def execute(self, batch: ExecutionBatch) -> dict[str, np.ndarray]:
        x = batch.inputs[INPUT_NAME]
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2:
            x = x.reshape(-1, self._n_features)
        outputs: dict[str, np.ndarray] = {}
        # Each output only when a request of the batch asked for it: SHAP costs many predicts.
        if OUTPUT_NAME in batch.output_names or not batch.output_names:
            outputs[OUTPUT_NAME] = predict_rows(self._forest, self._params, x, self._width)
        if SHAP_OUTPUT_NAME in batch.output_names:
            outputs[SHAP_OUTPUT_NAME] = self._forest.contributions(x)  # type: ignore[misc]  # checked at load
        return outputs

    def close(self) -> None:
        self._forest = None  # type: ignore[assignment]
