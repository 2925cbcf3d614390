"""TensorFlow backend (optional extra): SavedModel signatures (auto-completed) and frozen GraphDefs."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import ExecutionBatch, InstanceSpec, ModelSource
from naiad.config.completion import complete_tensor
from naiad.config.model_config import ConfigError, parameter

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter, unless the user asks for it
try:
    import tensorflow as tf
except ImportError as exc:  # the registry turns this into the model's UNAVAILABLE reason
    raise ImportError(f"the TensorFlow backend needs the 'tensorflow' package ({exc}): pip install 'naiad[tensorflow]'") from exc

log = logging.getLogger(__name__)

DEFAULT_SIGNATURE = "serving_default"


def _config_type(dtype) -> int:
    if dtype == tf.string:
        return mc.TYPE_STRING
    if dtype == tf.bfloat16:
        return mc.TYPE_BF16
    name = {
        tf.bool: mc.TYPE_BOOL, tf.uint8: mc.TYPE_UINT8, tf.uint16: mc.TYPE_UINT16, tf.uint32: mc.TYPE_UINT32,
        tf.uint64: mc.TYPE_UINT64, tf.int8: mc.TYPE_INT8, tf.int16: mc.TYPE_INT16, tf.int32: mc.TYPE_INT32,
        tf.int64: mc.TYPE_INT64, tf.float16: mc.TYPE_FP16, tf.float32: mc.TYPE_FP32, tf.float64: mc.TYPE_FP64,
    }.get(dtype)
    if name is None:
        raise ConfigError(f"TensorFlow dtype {dtype.name} has no Triton datatype")
    return name


def _dims(shape) -> list[int]:
    return [-1 if d is None else int(d) for d in shape.as_list()] if shape.rank is not None else [-1]


def _signature(path: Path, config: mc.ModelConfig):
    """The SavedModel's signature function (TF_SIGNATURE_DEF parameter, else serving_default)."""
    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as exc:  # TF raises OSError / its own errors for broken directories
        raise ConfigError(f"unable to load TensorFlow SavedModel '{path}': {exc}") from None
    wanted = parameter(config, "TF_SIGNATURE_DEF") or DEFAULT_SIGNATURE
    signatures = dict(loaded.signatures)
    if wanted not in signatures:
        raise ConfigError(f"SavedModel '{path}' has no signature '{wanted}' (it has {sorted(signatures)})")
    return loaded, signatures[wanted]


def _signature_io(fn) -> tuple[dict, dict]:
    _, inputs = fn.structured_input_signature
    return dict(inputs), dict(fn.structured_outputs)


def _sequence_tensors(config: mc.ModelConfig) -> tuple[list[str], list[str]]:
    """What the sequence batcher feeds (control inputs such as START/READY/CORRID, implicit state) and
    fetches (implicit state): tensors of the model that clients never send nor see."""
    sequence = config.sequence_batching
    feeds = [c.name for c in sequence.control_input] + [s.input_name for s in sequence.state]
    return feeds, [s.output_name for s in sequence.state]


def _feeds_and_fetches(config: mc.ModelConfig) -> tuple[list[str], list[str]]:
    """Every tensor the model is fed and asked for: the config's inputs and outputs, then the sequence batcher's."""
    feeds, fetches = _sequence_tensors(config)
    feeds = [t.name for t in config.input] + feeds
    fetches = [t.name for t in config.output] + fetches
    return list(dict.fromkeys(feeds)), list(dict.fromkeys(fetches))


class TensorFlowBackend:
    """`backend: "tensorflow"`, platforms `tensorflow_savedmodel` and `tensorflow_graphdef`."""

    name = "tensorflow"
    kind = "tensor"

    def auto_complete_config(self, config: mc.ModelConfig, model_file: Path, default_max_batch_size: int) -> None:
        if _is_graphdef(config, model_file):
            if not config.input or not config.output:
                raise ConfigError(
                    f"model '{config.name}': TensorFlow GraphDef models must list inputs and outputs in config.pbtxt "
                    "(a frozen graph has no signature to auto-complete from)"
                )
            return
        _, fn = _signature(model_file, config)
        inputs, outputs = _signature_io(fn)
        # Control inputs and implicit state are the sequence batcher's, not the clients' tensors.
        batcher_feeds, batcher_fetches = _sequence_tensors(config)
        inputs = {k: v for k, v in inputs.items() if k not in batcher_feeds}
        outputs = {k: v for k, v in outputs.items() if k not in batcher_fetches}
        specs = list(inputs.values()) + list(outputs.values())
        batchable = bool(specs) and all(s.shape.rank and s.shape[0] is None for s in specs)
        if config.max_batch_size == 0 and batchable:
            full_rank = any(len(c.dims) == s.shape.rank for c in config.input for k, s in inputs.items() if c.name == k)
            if not full_rank:
                config.max_batch_size = max(default_max_batch_size, 0)
                if config.max_batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
                    config.dynamic_batching.SetInParent()
        if config.max_batch_size > 0 and not batchable:
            raise ConfigError(
                f"model '{config.name}' has max_batch_size {config.max_batch_size} but the first dimension of its "
                "signature's tensors is not variable, so it cannot batch (set max_batch_size: 0)"
            )
        strip = 1 if config.max_batch_size > 0 else 0
        for field, tensors in ((config.input, inputs), (config.output, outputs)):
            declared = {t.name: t for t in field}
            for key, spec in tensors.items():
                data_type = _config_type(spec.dtype)
                dims = _dims(spec.shape)[strip:]
                complete_tensor(config, declared, field, key, data_type, dims, "SavedModel signature")
        known = set(inputs) | set(outputs)
        for tensor in list(config.input) + list(config.output):
            if tensor.name not in known:
                raise ConfigError(
                    f"unable to load model '{config.name}': '{tensor.name}' is not a key of the SavedModel signature "
                    f"(it has inputs {sorted(inputs)}, outputs {sorted(outputs)})"
                )

    def create_instance(self, source: ModelSource, spec: InstanceSpec):
        device = "/CPU:0"
        if spec.kind == mc.ModelInstanceGroup.KIND_GPU:
            if tf.config.list_physical_devices("GPU"):
                device = f"/GPU:{spec.device_id}"
            else:
                log.warning("TensorFlow instance '%s' asked for GPU %d; this TensorFlow sees no GPU, running on the CPU", spec.name, spec.device_id)
        if _is_graphdef(source.config, source.model_file):
            return GraphDefInstance(source, spec.name, device)
        return SavedModelInstance(source, spec.name, device)


def _is_graphdef(config: mc.ModelConfig, model_file: Path) -> bool:
    return config.platform == "tensorflow_graphdef" or (model_file.is_file() and model_file.suffix == ".graphdef")


class SavedModelInstance:
    """Calls the signature function; TensorFlow runs its kernels without the GIL."""

    def __init__(self, source: ModelSource, name: str, device: str) -> None:
        self.name = name
        self._device = device
        self._loaded, self._fn = _signature(source.model_file, source.config)
        inputs, outputs = _signature_io(self._fn)
        feeds, fetches = _feeds_and_fetches(source.config)
        unknown = [name for name in feeds if name not in inputs] + [name for name in fetches if name not in outputs]
        if unknown:
            raise ConfigError(
                f"model '{source.config.name}': {unknown} are not keys of the SavedModel signature "
                f"(inputs {sorted(inputs)}, outputs {sorted(outputs)})"
            )
        self._dtypes = {k: s.dtype for k, s in inputs.items()}

    def execute(self, batch: ExecutionBatch) -> dict[str, np.ndarray]:
        with tf.device(self._device):
            feeds = {k: tf.constant(v, dtype=self._dtypes[k]) for k, v in batch.inputs.items()}
            results = self._fn(**feeds)
        return {name: results[name].numpy() for name in batch.output_names}

    def close(self) -> None:
        self._fn = None
        self._loaded = None


def _tensor_name(name: str) -> str:
    return name if ":" in name else f"{name}:0"


class GraphDefInstance:
    """A frozen GraphDef pruned to the config's inputs and outputs (names are graph node names).

    Sequence control inputs and implicit state are placeholders of the graph like any input: they are
    fed too (a graph using them cannot be pruned without them)."""

    def __init__(self, source: ModelSource, name: str, device: str) -> None:
        self.name = name
        self._device = device
        config = source.config
        graph_def = tf.compat.v1.GraphDef()
        try:
            graph_def.ParseFromString(source.model_file.read_bytes())
            wrapped = tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(graph_def, name=""), [])
            graph = wrapped.graph
            self._input_names, self._output_names = _feeds_and_fetches(config)
            feeds = [graph.get_tensor_by_name(_tensor_name(n)) for n in self._input_names]
            fetches = [graph.get_tensor_by_name(_tensor_name(n)) for n in self._output_names]
            self._fn = wrapped.prune(feeds, fetches)
        except (KeyError, ValueError, tf.errors.OpError) as exc:
            raise ConfigError(f"unable to load TensorFlow GraphDef '{source.model_file}' for model '{config.name}': {exc}") from None
        self._dtypes = [f.dtype for f in feeds]

    def execute(self, batch: ExecutionBatch) -> dict[str, np.ndarray]:
        with tf.device(self._device):
            args = [tf.constant(batch.inputs[n], dtype=d) for n, d in zip(self._input_names, self._dtypes)]
            results = self._fn(*args)
        by_name = dict(zip(self._output_names, results))
        return {name: by_name[name].numpy() for name in batch.output_names}

    def close(self) -> None:
        self._fn = None
