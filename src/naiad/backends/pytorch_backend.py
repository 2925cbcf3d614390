"""PyTorch backend: TorchScript `model.pt` (and `model.pt2` export/AOTInductor packages) with Triton's naming rules."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import ExecutionBatch, InstanceSpec, ModelSource
from naiad.config.model_config import ConfigError, parameter, parse_bool

log = logging.getLogger(__name__)

# Request tensors decoded from a wire buffer are read-only; torch only warns about it (the model gets
# its own view of the request's data, which nothing else reads afterwards).
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
# TorchScript is what Triton's PyTorch backend serves; torch's deprecation notice is not the user's concern here.
warnings.filterwarnings("ignore", message="`torch.jit.load` is deprecated", category=DeprecationWarning)

_INDEXED_NAME = re.compile(r"^.+__(\d+)$")

CONFIG_TO_TORCH = {
    mc.TYPE_BOOL: torch.bool,
    mc.TYPE_UINT8: torch.uint8,
    mc.TYPE_UINT16: torch.uint16,
    mc.TYPE_UINT32: torch.uint32,
    mc.TYPE_UINT64: torch.uint64,
    mc.TYPE_INT8: torch.int8,
    mc.TYPE_INT16: torch.int16,
    mc.TYPE_INT32: torch.int32,
    mc.TYPE_INT64: torch.int64,
    mc.TYPE_FP16: torch.float16,
    mc.TYPE_FP32: torch.float32,
    mc.TYPE_FP64: torch.float64,
}
TORCH_TO_CONFIG = {v: k for k, v in CONFIG_TO_TORCH.items()}


class _ProcessSettings:
    """torch's thread pools and JIT modes are process-wide: the first model that sets one wins, later ones are logged."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owners: dict[str, tuple[str, Any]] = {}

    def apply(self, key: str, value: Any, model: str, setter) -> None:
        with self._lock:
            owner = self._owners.get(key)
            if owner is not None:
                if owner[1] != value:
                    log.warning(
                        "model '%s': %s=%s ignored: torch's setting is process-wide and model '%s' already set it to %s",
                        model, key, value, owner[0], owner[1],
                    )
                return
            try:
                setter(value)
            except RuntimeError as exc:  # e.g. inter-op threads after torch started its pool
                log.warning("model '%s': cannot apply %s=%s: %s", model, key, value, exc)
                return
            self._owners[key] = (model, value)
            log.info("torch %s set to %s by model '%s' (process-wide)", key, value, model)


PROCESS_SETTINGS = _ProcessSettings()


def _int_parameter(config: mc.ModelConfig, key: str) -> int | None:
    text = parameter(config, key)
    if text is None or text.strip() == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"model '{config.name}': parameter '{key}' must be an integer, got '{text}'") from None


def _apply_process_settings(config: mc.ModelConfig) -> None:
    name = config.name
    intra = _int_parameter(config, "INTRA_OP_THREAD_COUNT")
    if intra is None:
        intra = _int_parameter(config, "NUM_THREADS")
    if intra is not None and intra > 0:
        PROCESS_SETTINGS.apply("INTRA_OP_THREAD_COUNT", intra, name, torch.set_num_threads)
    inter = _int_parameter(config, "INTER_OP_THREAD_COUNT")
    if inter is not None and inter > 0:
        PROCESS_SETTINGS.apply("INTER_OP_THREAD_COUNT", inter, name, torch.set_num_interop_threads)
    if parameter(config, "ENABLE_JIT_EXECUTOR") is not None:
        PROCESS_SETTINGS.apply(
            "ENABLE_JIT_EXECUTOR", parse_bool(parameter(config, "ENABLE_JIT_EXECUTOR")), name, torch._C._jit_set_profiling_executor
        )
    if parameter(config, "ENABLE_JIT_PROFILING") is not None:
        PROCESS_SETTINGS.apply(
            "ENABLE_JIT_PROFILING", parse_bool(parameter(config, "ENABLE_JIT_PROFILING")), name, torch._C._jit_set_profiling_mode
        )
    if parse_bool(parameter(config, "DISABLE_CUDNN")):
        PROCESS_SETTINGS.apply("DISABLE_CUDNN", True, name, lambda _: setattr(torch.backends.cudnn, "enabled", False))


@dataclass
class _Loaded:
    """A loaded program plus what it tells about its arguments."""

    module: Any
    arg_names: list[str] | None  # forward() argument names, when the format keeps them
    dict_input: bool = False
    optional_args: int = 0  # trailing arguments with defaults


def _load_pt2(path: Path, device: str | None) -> _Loaded:
    """`model.pt2`: a torch.export archive (run through its module) or an AOTInductor package."""
    export_error: Exception | None = None
    try:
        program = torch.export.load(str(path))
    except Exception as exc:  # not an ExportedProgram archive: maybe an AOTInductor package
        export_error = exc
    else:
        module = program.module()
        if device is not None:
            module = module.to(device)
        names = [str(n) for n in program.graph_signature.user_inputs]
        return _Loaded(module, names)
    try:
        from torch._inductor import aoti_load_package

        module = aoti_load_package(str(path))
    except Exception as exc:
        raise ConfigError(
            f"unable to load '{path}': it is neither a torch.export program ({export_error}) nor an "
            f"AOTInductor package compiled for this machine ({exc})"
        ) from None
    return _Loaded(module, None)


def _load_torchscript(path: Path, device: str | None) -> _Loaded:
    try:
        module = torch.jit.load(str(path), map_location=device)
    except Exception as exc:  # torch raises RuntimeError/ValueError for foreign or broken files
        raise ConfigError(f"unable to load TorchScript model '{path}' (expects torch.jit.save output): {exc}") from None
    module.eval()
    arguments = list(module.forward.schema.arguments)[1:]  # drop self
    names = [a.name for a in arguments]
    dict_input = len(arguments) == 1 and str(arguments[0].type).startswith("Dict[str, Tensor]")
    optional = sum(1 for a in arguments if a.has_default_value())
    return _Loaded(module, names, dict_input, optional)


def _load(source: ModelSource, device: str | None) -> _Loaded:
    path = source.model_file
    if source.config.platform == "torch_aoti" or path.suffix == ".pt2":
        return _load_pt2(path, device)
    return _load_torchscript(path, device)


def _model_inputs(config: mc.ModelConfig) -> list[mc.ModelInput]:
    """The config's inputs, then the tensors the sequence batcher adds: control inputs, implicit-state inputs."""
    inputs = list(config.input)
    sequence = config.sequence_batching
    for control_input in sequence.control_input:
        controls = list(control_input.control)
        corrid = [c for c in controls if c.kind == mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID]
        data_type = corrid[0].data_type if corrid else mc.TYPE_FP32  # a flag's dtype matters to the model only
        inputs.append(mc.ModelInput(name=control_input.name, data_type=data_type))
    inputs += [mc.ModelInput(name=s.input_name, data_type=s.data_type, dims=s.dims) for s in sequence.state]
    return inputs


def _model_outputs(config: mc.ModelConfig) -> list[mc.ModelOutput]:
    """The config's outputs, then the implicit-state outputs the sequence batcher asks for."""
    states = [mc.ModelOutput(name=s.output_name, data_type=s.data_type, dims=s.dims)
              for s in config.sequence_batching.state]
    return list(config.output) + states


def _input_order(config: mc.ModelConfig, loaded: _Loaded) -> list[str]:
    """Input names in forward() argument order, by Triton's rules (names, `__<i>`, config order)."""
    names = [t.name for t in _model_inputs(config)]
    args = loaded.arg_names
    if args is not None and set(names) <= set(args):
        positions = {name: args.index(name) for name in names}
        rule = "forward() argument names"
    elif all(_INDEXED_NAME.match(n) for n in names):
        positions = {n: int(_INDEXED_NAME.match(n).group(1)) for n in names}  # type: ignore[union-attr]
        rule = "the <name>__<index> convention"
    else:
        positions = {n: i for i, n in enumerate(names)}
        rule = "config order"
    ordered: list[str | None] = [None] * (max(positions.values()) + 1 if positions else 0)
    for name, index in positions.items():
        if ordered[index] is not None:
            raise ConfigError(f"model '{config.name}': inputs '{ordered[index]}' and '{name}' map to the same forward() argument {index}")
        ordered[index] = name
    if args is not None:
        required = len(args) - loaded.optional_args
        if len(ordered) > len(args):
            raise ConfigError(
                f"model '{config.name}': the config maps inputs to {len(ordered)} forward() arguments ({rule}) "
                f"but the model's forward() takes {len(args)}: {args}"
            )
        if len(ordered) < required:
            raise ConfigError(
                f"model '{config.name}': forward() needs {required} arguments {args[:required]} but the config "
                f"provides {len(names)} input(s) {names}"
            )
    gaps = [i for i, n in enumerate(ordered) if n is None]
    if gaps:
        raise ConfigError(f"model '{config.name}': no config input maps to forward() argument(s) {gaps} ({rule})")
    return [n for n in ordered if n is not None]


def _output_indices(config: mc.ModelConfig) -> dict[str, int]:
    names = [t.name for t in _model_outputs(config)]
    if names and all(_INDEXED_NAME.match(n) for n in names):
        return {n: int(_INDEXED_NAME.match(n).group(1)) for n in names}  # type: ignore[union-attr]
    return {n: i for i, n in enumerate(names)}


def _device(spec: InstanceSpec, config: mc.ModelConfig) -> str | None:
    if spec.kind == mc.ModelInstanceGroup.KIND_GPU:
        if not torch.cuda.is_available():
            raise ConfigError(
                f"model '{config.name}': instance '{spec.name}' is KIND_GPU but torch.cuda.is_available() is False "
                "(this torch build has no CUDA, or no GPU is visible); use KIND_CPU"
            )
        return f"cuda:{spec.device_id}"
    if spec.kind == mc.ModelInstanceGroup.KIND_MODEL:
        return None  # the model keeps the placement it was saved with
    return "cpu"


def _require_io(config: mc.ModelConfig) -> None:
    missing = [kind for kind, field in (("inputs", config.input), ("outputs", config.output)) if not field]
    if missing:
        raise ConfigError(
            f"model '{config.name}': PyTorch models must list their {' and '.join(missing)} in config.pbtxt "
            "(name, data_type, dims): TorchScript does not record tensor names or shapes, so Triton and Naiad "
            "cannot auto-complete them"
        )


class PyTorchBackend:
    """`backend: "pytorch"` / `platform: "pytorch_libtorch"` / `platform: "torch_aoti"`."""

    name = "pytorch"
    kind = "tensor"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shared: dict[tuple[str, float, str | None], list] = {}  # ENABLE_WEIGHT_SHARING: key -> [loaded, users]

    def auto_complete_config(self, config: mc.ModelConfig, model_file: Path, default_max_batch_size: int) -> None:
        _require_io(config)

    def create_instance(self, source: ModelSource, spec: InstanceSpec) -> PyTorchInstance:
        _require_io(source.config)
        _apply_process_settings(source.config)
        device = _device(spec, source.config)
        if parse_bool(parameter(source.config, "ENABLE_WEIGHT_SHARING")):
            loaded, release = self._acquire_shared(source, device)
        else:
            loaded, release = _load(source, device), None
        return PyTorchInstance(source, spec, loaded, device, release)

    def _acquire_shared(self, source: ModelSource, device: str | None):
        key = (str(source.model_file), source.model_file.stat().st_mtime, device)
        with self._lock:
            entry = self._shared.get(key)
            if entry is None:
                entry = [_load(source, device), 0]
                self._shared[key] = entry
            entry[1] += 1

        def release() -> None:
            with self._lock:
                entry[1] -= 1
                if entry[1] == 0 and self._shared.get(key) is entry:
                    del self._shared[key]

        return entry[0], release


class PyTorchInstance:
    """One module on one device; torch releases the GIL in its kernels, so instances run in parallel."""

    def __init__(self, source: ModelSource, spec: InstanceSpec, loaded: _Loaded, device: str | None, release=None) -> None:
        config = source.config
        self.name = spec.name
        self._model = config.name
        self._module = loaded.module
        self._release = release
        self._input_device = device if device is not None else "cpu"
        self._dict_input = loaded.dict_input
        inputs = _model_inputs(config)
        self._inputs = [t.name for t in inputs] if loaded.dict_input else _input_order(config, loaded)
        self._string_inputs = {t.name for t in inputs if t.data_type == mc.TYPE_STRING}
        self._output_index = _output_indices(config)
        self._outputs = {t.name: t for t in _model_outputs(config)}
        self._batching = config.max_batch_size > 0
        self._inference_mode = parse_bool(parameter(config, "INFERENCE_MODE"), default=True)
        self._optimize = not parse_bool(parameter(config, "DISABLE_OPTIMIZED_EXECUTION"))
        self._clean_cache = parse_bool(parameter(config, "ENABLE_CACHE_CLEANING")) and self._input_device.startswith("cuda")
        self._torchscript = isinstance(loaded.module, torch.jit.ScriptModule)

    def _to_torch(self, name: str, array: np.ndarray) -> Any:
        if name in self._string_inputs:
            return [x.decode("utf-8", errors="replace") if isinstance(x, bytes) else str(x) for x in array.reshape(-1)]
        tensor = torch.from_numpy(array if array.flags.c_contiguous else np.ascontiguousarray(array))
        if self._input_device != "cpu":
            tensor = tensor.to(self._input_device, non_blocking=True)
        return tensor

    def execute(self, batch: ExecutionBatch) -> dict[str, np.ndarray]:
        grad = torch.inference_mode() if self._inference_mode else torch.no_grad()
        jit = torch.jit.optimized_execution(self._optimize) if self._torchscript else contextlib.nullcontext()
        with grad, jit:
            if self._dict_input:
                result = self._module({n: self._to_torch(n, batch.inputs[n]) for n in self._inputs})
            else:
                result = self._module(*[self._to_torch(n, batch.inputs[n]) for n in self._inputs])
            values = _result_list(result)
            outputs = {name: self._convert(name, values, batch.batch_size) for name in batch.output_names}
        if self._clean_cache:
            torch.cuda.empty_cache()
        return outputs

    def _convert(self, name: str, values: list, batch_size: int) -> np.ndarray:
        index = self._output_index.get(name)
        if index is None or index >= len(values):
            raise RuntimeError(
                f"model '{self._model}' returned {len(values)} output(s); output '{name}' maps to index {index}"
            )
        value = values[index]
        spec = self._outputs[name]
        if isinstance(value, torch.Tensor):
            expected = CONFIG_TO_TORCH.get(spec.data_type)
            if expected is not None and value.dtype != expected:
                actual = TORCH_TO_CONFIG.get(value.dtype)
                actual_name = mc.DataType.Name(actual) if actual is not None else str(value.dtype)
                raise RuntimeError(
                    f"unexpected datatype {actual_name} for inference output '{name}', expecting "
                    f"{mc.DataType.Name(spec.data_type)}"
                )
            return value.detach().cpu().numpy()
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            if spec.data_type != mc.TYPE_STRING:
                raise RuntimeError(f"model '{self._model}' returned a list of strings for output '{name}', which is not TYPE_STRING")
            array = np.array([v.encode("utf-8") for v in value], dtype=object)
            return _shape_strings(array, list(spec.dims), batch_size if self._batching else None)
        raise RuntimeError(
            f"model '{self._model}' returned {type(value).__name__} for output '{name}'; expected a tensor or a list of strings"
        )

    def close(self) -> None:
        if self._release is not None:
            self._release()
        self._module = None


def _result_list(result: Any) -> list:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (list, tuple)):
        if result and all(isinstance(v, str) for v in result):
            return [list(result)]
        return list(result)
    raise RuntimeError(f"model returned {type(result).__name__}; expected a tensor, a tuple/list of tensors or a list of strings")


def _shape_strings(array: np.ndarray, dims: list[int], batch_size: int | None) -> np.ndarray:
    """A flat list of strings shaped as the config says ([batch] + dims for batching models)."""
    shape = ([batch_size] if batch_size is not None else []) + dims
    if shape and shape.count(-1) <= 1:
        known = int(np.prod([d for d in shape if d != -1])) if shape else 1
        if known and array.size % known == 0 and (-1 in shape or known == array.size):
            return array.reshape([d if d != -1 else array.size // known for d in shape])
    return array
