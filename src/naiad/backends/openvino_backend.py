"""OpenVINO backend (optional extra): `model.xml`/`model.bin` IRs, or ONNX through OpenVINO, compiled for the CPU."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import ExecutionBatch, InstanceSpec, ModelSource
from naiad.config.completion import complete_tensor
from naiad.config.model_config import ConfigError, parameter, parse_bool

try:
    import openvino as ov
except ImportError as exc:  # the registry turns this into the model's UNAVAILABLE reason
    raise ImportError(f"the OpenVINO backend needs the 'openvino' package ({exc}): pip install 'naiad[openvino]'") from exc

log = logging.getLogger(__name__)

_NUMPY_TO_CONFIG = {
    np.dtype(np.bool_): mc.TYPE_BOOL,
    np.dtype(np.uint8): mc.TYPE_UINT8,
    np.dtype(np.uint16): mc.TYPE_UINT16,
    np.dtype(np.uint32): mc.TYPE_UINT32,
    np.dtype(np.uint64): mc.TYPE_UINT64,
    np.dtype(np.int8): mc.TYPE_INT8,
    np.dtype(np.int16): mc.TYPE_INT16,
    np.dtype(np.int32): mc.TYPE_INT32,
    np.dtype(np.int64): mc.TYPE_INT64,
    np.dtype(np.float16): mc.TYPE_FP16,
    np.dtype(np.float32): mc.TYPE_FP32,
    np.dtype(np.float64): mc.TYPE_FP64,
}
# Model config parameters -> OpenVINO CPU plugin properties.
_PROPERTIES = {
    "NUM_STREAMS": "NUM_STREAMS",
    "INFERENCE_NUM_THREADS": "INFERENCE_NUM_THREADS",
    "PERFORMANCE_HINT": "PERFORMANCE_HINT",
    "COMPILED_MODEL_CACHE_DIR": "CACHE_DIR",
    "INFERENCE_PRECISION_HINT": "INFERENCE_PRECISION_HINT",
}
# Like Triton, OpenVINO's defaults apply otherwise: note that its CPU plugin computes FP32 models in bf16 on
# CPUs with AVX512-BF16/AMX; INFERENCE_PRECISION_HINT "f32" asks for full precision.


def _config_type(port) -> int:
    element = port.get_element_type()
    if element == ov.Type.string:
        return mc.TYPE_STRING
    try:
        return _NUMPY_TO_CONFIG[np.dtype(element.to_dtype())]
    except (KeyError, TypeError, RuntimeError):
        raise ConfigError(f"OpenVINO tensor '{port.get_any_name()}' has unsupported element type {element}") from None


def _dims(partial_shape) -> list[int]:
    return [d.get_length() if d.is_static else -1 for d in partial_shape]


def _first_dim_dynamic(port) -> bool:
    shape = port.get_partial_shape()
    return shape.rank.is_static and len(shape) >= 1 and shape[0].is_dynamic


def _port_name(port, wanted: set[str]) -> str:
    """The name the config uses for a port (ports may carry several names)."""
    for name in port.get_names():
        if name in wanted:
            return name
    return port.get_any_name()


class OpenVinoBackend:
    """`backend: "openvino"`: one compiled model and infer request per instance."""

    name = "openvino"
    kind = "tensor"

    def __init__(self) -> None:
        self._core = ov.Core()

    def _read(self, path: Path):
        try:
            return self._core.read_model(str(path))
        except Exception as exc:  # OpenVINO raises RuntimeError subclasses for unreadable files
            raise ConfigError(f"unable to read OpenVINO model '{path}': {exc}") from None

    def auto_complete_config(self, config: mc.ModelConfig, model_file: Path, default_max_batch_size: int) -> None:
        model = self._read(model_file)
        inputs, outputs = list(model.inputs), list(model.outputs)
        ports = inputs + outputs
        batchable = bool(ports) and all(_first_dim_dynamic(p) for p in ports)
        if config.max_batch_size == 0 and batchable:
            full_rank = any(
                len(c.dims) == len(p.get_partial_shape()) for c in config.input for p in inputs if c.name in p.get_names()
            )
            if not full_rank:
                config.max_batch_size = max(default_max_batch_size, 0)
                if config.max_batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
                    config.dynamic_batching.SetInParent()
        strip = 1 if config.max_batch_size > 0 else 0
        for field, model_ports in ((config.input, inputs), (config.output, outputs)):
            declared = {t.name: t for t in field}
            for port in model_ports:
                name = _port_name(port, set(declared))
                dims = _dims(port.get_partial_shape())[strip:]
                complete_tensor(config, declared, field, name, _config_type(port), dims, "OpenVINO model")
        known = {n for p in ports for n in p.get_names()}
        for tensor in list(config.input) + list(config.output):
            if tensor.name not in known:
                raise ConfigError(
                    f"unable to load model '{config.name}': '{tensor.name}' is not an input or output of the "
                    f"OpenVINO model (it has {sorted(known)})"
                )

    def create_instance(self, source: ModelSource, spec: InstanceSpec) -> OpenVinoInstance:
        if spec.kind == mc.ModelInstanceGroup.KIND_GPU:
            log.warning("OpenVINO instance '%s' asked for GPU %d; Naiad's OpenVINO backend compiles for the CPU", spec.name, spec.device_id)
        model = self._read(source.model_file)
        config = source.config
        padding_batch = _prepare_batch_dims(model, config)
        properties: dict = {}
        for key, prop in _PROPERTIES.items():
            value = parameter(config, key)
            if value:
                properties[prop] = int(value) if prop == "INFERENCE_NUM_THREADS" and value.isdigit() else value
        try:
            compiled = self._core.compile_model(model, "CPU", properties)
        except Exception as exc:
            raise ConfigError(f"unable to compile OpenVINO model '{source.model_file}' for the CPU: {exc}") from None
        return OpenVinoInstance(spec.name, config, compiled, padding_batch)


def _prepare_batch_dims(model, config: mc.ModelConfig) -> int:
    """Reshape the model for the config's batching; returns the static batch to pad to (0 = no padding)."""
    batching = config.max_batch_size > 0
    declared = {t.name: t for t in config.input}
    if parse_bool(parameter(config, "RESHAPE_IO_LAYERS")):
        shapes = {}
        for port in model.inputs:
            tensor = declared.get(_port_name(port, set(declared)))
            if tensor is not None:
                dims = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
                shapes[port] = ov.PartialShape(([-1] if batching else []) + dims)
        _reshape(model, shapes, config)
        return 0
    if not batching:
        return 0
    static = [p for p in model.inputs if p.get_partial_shape().rank.is_static and len(p.get_partial_shape()) >= 1
              and p.get_partial_shape()[0].is_static]
    if not static:
        return 0
    if parse_bool(parameter(config, "SKIP_OV_DYNAMIC_BATCHSIZE")):
        if parse_bool(parameter(config, "ENABLE_BATCH_PADDING")):
            return static[0].get_partial_shape()[0].get_length()
        return 0
    shapes = {}
    for port in static:
        shape = port.get_partial_shape()
        shapes[port] = ov.PartialShape([-1] + [d for d in _dims(shape)[1:]])
    _reshape(model, shapes, config)
    return 0


def _reshape(model, shapes: dict, config: mc.ModelConfig) -> None:
    if not shapes:
        return
    try:
        model.reshape(shapes)
    except Exception as exc:
        raise ConfigError(
            f"model '{config.name}': OpenVINO cannot reshape the model for batching ({exc}); set "
            "SKIP_OV_DYNAMIC_BATCHSIZE (and ENABLE_BATCH_PADDING) or max_batch_size: 0"
        ) from None


class OpenVinoInstance:
    """A compiled model with its own infer request; OpenVINO releases the GIL while it infers."""

    def __init__(self, name: str, config: mc.ModelConfig, compiled, padding_batch: int) -> None:
        self.name = name
        self._compiled = compiled
        self._request = compiled.create_infer_request()
        self._pad_to = padding_batch
        input_names = {t.name for t in config.input}
        output_names = {t.name for t in config.output}
        self._inputs = {_port_name(p, input_names): p for p in compiled.inputs}
        self._outputs = {_port_name(p, output_names): p for p in compiled.outputs}
        self._string_inputs = {n for n, p in self._inputs.items() if p.get_element_type() == ov.Type.string}

    def execute(self, batch: ExecutionBatch) -> dict[str, np.ndarray]:
        feeds = {}
        rows = batch.batch_size
        for name, array in batch.inputs.items():
            if name in self._string_inputs:
                array = np.array([x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in array.ravel()]).reshape(array.shape)
            elif self._pad_to and array.shape[0] < self._pad_to:
                pad = np.zeros((self._pad_to - array.shape[0],) + array.shape[1:], dtype=array.dtype)
                array = np.concatenate([array, pad])
            feeds[self._inputs[name]] = array
        results = self._request.infer(feeds)
        outputs = {}
        for name in batch.output_names:
            value = np.asarray(results[self._outputs[name]])
            if self._pad_to and value.shape[:1] == (self._pad_to,):
                value = value[:rows]
            if value.dtype.kind == "U":
                value = np.array([s.encode("utf-8") for s in value.ravel()], dtype=object).reshape(value.shape)
            outputs[name] = value
        return outputs

    def close(self) -> None:
        self._request = None
        self._compiled = None
