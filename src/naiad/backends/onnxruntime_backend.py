"""ONNX Runtime backend: config auto-complete from the graph, sessions per instance, CPU/CUDA providers."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import ExecutionBatch, InstanceSpec, ModelSource
from naiad.config.completion import complete_tensor
from naiad.config.model_config import ConfigError, parameter
from naiad.config.onnx_io import (
    ModelTensor,
    can_batch,
    check_model_io,
    completed_max_batch_size,
    ort_tensor,
)

log = logging.getLogger(__name__)

# Triton's mapping of optimization.graph.level onto ORT levels (not the generic proto doc).
GRAPH_LEVELS = {
    0: ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}


def _resolve_model_path(model_file: Path) -> Path:
    """`model.onnx` may be a directory holding `model.onnx` plus external data files."""
    if model_file.is_dir():
        return model_file / "model.onnx"
    return model_file


def _model_tensors(session: ort.InferenceSession) -> tuple[list[ModelTensor], list[ModelTensor]]:
    return ([ort_tensor(t.name, t.type, t.shape) for t in session.get_inputs()],
            [ort_tensor(t.name, t.type, t.shape) for t in session.get_outputs()])


class OnnxRuntimeBackend:
    """`backend: "onnxruntime"` / `platform: "onnxruntime_onnx"`."""

    name = "onnxruntime"
    kind = "tensor"

    def auto_complete_config(self, config: mc.ModelConfig, model_file: Path, default_max_batch_size: int) -> None:
        path = _resolve_model_path(model_file)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises its own exception types for bad files
            raise ConfigError(f"unable to load ONNX model '{path}': {exc}") from None
        inputs, outputs = _model_tensors(session)
        batch_size = completed_max_batch_size(config, inputs, outputs, default_max_batch_size)
        if batch_size != config.max_batch_size:
            config.max_batch_size = batch_size
            if batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
                config.dynamic_batching.SetInParent()
        strip = 1 if config.max_batch_size > 0 and can_batch(inputs, outputs) else 0
        provided = _batcher_provided(config)
        for field, graph_tensors in ((config.input, inputs), (config.output, outputs)):
            declared = {t.name: t for t in field}
            for tensor in graph_tensors:
                if tensor.name in provided and tensor.name not in declared:
                    continue  # control and state tensors come from the sequence batcher
                existing = declared.get(tensor.name)
                if existing is not None and existing.data_type not in (mc.TYPE_INVALID, tensor.data_type):
                    continue  # a contradiction: check_model_io reports it in Triton's words
                if tensor.data_type == mc.TYPE_INVALID:
                    raise ConfigError(f"ONNX tensor '{tensor.name}' of model '{config.name}' has a type with no "
                                      "Triton datatype")
                complete_tensor(config, declared, field, tensor.name, tensor.data_type, list(tensor.shape[strip:]),
                                "ONNX model")

    def create_instance(self, source: ModelSource, spec: InstanceSpec) -> OnnxRuntimeInstance:
        return OnnxRuntimeInstance(source, spec)


def _batcher_provided(config: mc.ModelConfig) -> set[str]:
    """Sequence control inputs and implicit-state tensors: the batcher feeds them, clients never do."""
    sequence = config.sequence_batching
    names = {c.name for c in sequence.control_input}
    for state in sequence.state:
        names.update((state.input_name, state.output_name))
    return names


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, e.g. `taskset` or a cpuset)."""
    return len(os.sched_getaffinity(0))


def _session_options(config: mc.ModelConfig) -> ort.SessionOptions:
    options = ort.SessionOptions()
    level = config.optimization.graph.level if config.HasField("optimization") else 0
    if level not in GRAPH_LEVELS:
        raise ConfigError(f"optimization.graph.level {level} is not one of {sorted(GRAPH_LEVELS)}")
    options.graph_optimization_level = GRAPH_LEVELS[level]
    intra = parameter(config, "intra_op_thread_count")
    inter = parameter(config, "inter_op_thread_count")
    mode = parameter(config, "execution_mode", "0")
    try:
        if intra:
            options.intra_op_num_threads = int(intra)
        elif (usable := usable_cpus()) < (os.cpu_count() or usable):
            # ONNX Runtime sizes its pool from the machine's cores, not the process's CPU affinity:
            # pinned to one core, its extra thread competed with the event loop for that core
            # (a 256-512-512-10 MLP at batch 1: 31.8 vs 20.5 us of CPU per run).
            options.intra_op_num_threads = usable
        if inter:
            options.inter_op_num_threads = int(inter)
    except ValueError:
        raise ConfigError("parameters intra_op_thread_count/inter_op_thread_count must be integers") from None
    options.execution_mode = ort.ExecutionMode.ORT_PARALLEL if mode == "1" else ort.ExecutionMode.ORT_SEQUENTIAL
    arena = parameter(config, "enable_mem_arena")
    if arena is not None:
        options.enable_cpu_mem_arena = arena == "1"
    pattern = parameter(config, "enable_mem_pattern")
    if pattern is not None:
        options.enable_mem_pattern = pattern == "1"
    for key in ("session.use_device_allocator_for_initializers", "memory.enable_memory_arena_shrinkage"):
        value = parameter(config, key)
        if value is not None:
            options.add_session_config_entry(key, value)
    return options


def _providers(config: mc.ModelConfig, spec: InstanceSpec) -> list:
    available = set(ort.get_available_providers())
    providers: list = []
    accelerators = config.optimization.execution_accelerators
    if spec.kind == mc.ModelInstanceGroup.KIND_GPU:
        if "CUDAExecutionProvider" not in available:
            raise ConfigError(
                "instance kind KIND_GPU needs onnxruntime's CUDAExecutionProvider, which this onnxruntime build "
                "does not have (install onnxruntime-gpu, or use KIND_CPU)"
            )
        for acc in accelerators.gpu_execution_accelerator:
            if acc.name == "tensorrt":
                if "TensorrtExecutionProvider" not in available:
                    raise ConfigError("gpu_execution_accelerator 'tensorrt' needs onnxruntime's TensorrtExecutionProvider")
                options = {"device_id": spec.device_id}
                options.update({k: v for k, v in acc.parameters.items()})
                providers.append(("TensorrtExecutionProvider", options))
            elif acc.name != "cuda":
                raise ConfigError(f"unknown gpu_execution_accelerator '{acc.name}'")
        cuda_options = {"device_id": spec.device_id}
        for acc in accelerators.gpu_execution_accelerator:
            if acc.name == "cuda":
                cuda_options.update({k: v for k, v in acc.parameters.items()})
        providers.append(("CUDAExecutionProvider", cuda_options))
    for acc in accelerators.cpu_execution_accelerator:
        if acc.name != "openvino":
            raise ConfigError(f"unknown cpu_execution_accelerator '{acc.name}'")
        if "OpenVINOExecutionProvider" not in available:
            raise ConfigError("cpu_execution_accelerator 'openvino' needs onnxruntime-openvino installed")
        providers.append(("OpenVINOExecutionProvider", dict(acc.parameters)))
    providers.append("CPUExecutionProvider")
    return providers


class OnnxRuntimeInstance:
    """One ORT session. ORT releases the GIL in run(), so instances on threads run in parallel."""

    def __init__(self, source: ModelSource, spec: InstanceSpec) -> None:
        self.name = spec.name
        config = source.config
        path = _resolve_model_path(source.model_file)
        try:
            self._session = ort.InferenceSession(
                str(path), _session_options(config), providers=_providers(config, spec)
            )
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"unable to create ONNX Runtime session for '{path}': {exc}") from None
        problems = check_model_io(config, *_model_tensors(self._session))
        if problems:
            self._session = None
            raise ConfigError(problems[0].message)
        self._string_inputs = {
            i.name for i in self._session.get_inputs() if i.type == "tensor(string)"
        }
        self._string_outputs = {o.name for o in self._session.get_outputs() if o.type == "tensor(string)"}

    def execute(self, batch: ExecutionBatch) -> dict[str, np.ndarray]:
        feeds = {}
        for name, array in batch.inputs.items():
            if name in self._string_inputs:
                # ORT string tensors take Python str objects.
                array = np.array(
                    [x.decode("utf-8", errors="replace") if isinstance(x, bytes) else str(x) for x in array.ravel()],
                    dtype=object,
                ).reshape(array.shape)
            feeds[name] = array
        results = self._session.run(batch.output_names, feeds)
        outputs = dict(zip(batch.output_names, results))
        for name in self._string_outputs.intersection(outputs):
            # BYTES tensors are object arrays of bytes everywhere else in the server.
            array = outputs[name]
            outputs[name] = np.array([s.encode("utf-8") for s in array.ravel()] or [], dtype=object).reshape(array.shape)
        return outputs

    def close(self) -> None:
        self._session = None
