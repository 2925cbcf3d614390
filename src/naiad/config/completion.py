"""Fill what Triton fills in every effective config: backend/platform, file name, instance groups, defaults."""

from __future__ import annotations

from pathlib import Path

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer
from tritonclient.grpc import model_config_pb2 as mc

from naiad.config.model_config import ConfigError

PLATFORM_TO_BACKEND = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "libtorch": "pytorch",
    "torch_aoti": "pytorch",
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
    "tensorrt_plan": "tensorrt",
}
BACKEND_TO_PLATFORM = {
    "onnxruntime": "onnxruntime_onnx",
    "pytorch": "pytorch_libtorch",
    "tensorrt": "tensorrt_plan",
}
DEFAULT_FILENAMES = {
    "onnxruntime": "model.onnx",
    "pytorch": "model.pt",
    "tensorflow": "model.savedmodel",
    "tensorrt": "model.plan",
    "openvino": "model.xml",
    "python": "model.py",
    "dali": "model.dali",
    "vllm": "model.json",
}
PLATFORM_FILENAMES = {
    "torch_aoti": "model.pt2",
    "tensorflow_graphdef": "model.graphdef",
}
# Backends whose KIND_CPU groups default to two instances.
TWO_CPU_INSTANCE_BACKENDS = {"onnxruntime", "tensorflow"}

# File or directory in a version directory -> (backend, platform), checked in Triton's order.
_DETECTION = [
    ("model.savedmodel", "tensorflow", "tensorflow_savedmodel"),
    ("model.graphdef", "tensorflow", "tensorflow_graphdef"),
    ("model.plan", "tensorrt", "tensorrt_plan"),
    ("model.onnx", "onnxruntime", "onnxruntime_onnx"),
    ("model.xml", "openvino", ""),
    ("model.pt", "pytorch", "pytorch_libtorch"),
    ("model.pt2", "pytorch", "torch_aoti"),
    ("model.py", "python", ""),
    # FIL's default file names (model_type picks one; the backend reads it from the file name otherwise).
    ("xgboost.ubj", "fil", ""),
    ("xgboost.json", "fil", ""),
    ("xgboost.model", "fil", ""),
    ("checkpoint.tl", "fil", ""),
    ("model.txt", "fil", ""),
]


def resolve_backend(config: mc.ModelConfig, version_dir: Path | None) -> None:
    """Fill backend from platform, platform from backend, or both from the model file present."""
    if not config.backend and not config.platform:
        for filename, backend, platform in _DETECTION:
            # A default_model_filename names the file; otherwise the version directory shows it.
            if config.default_model_filename:
                found = config.default_model_filename == filename
            else:
                found = version_dir is not None and (version_dir / filename).exists()
            if found:
                config.backend, config.platform = backend, platform
                break
    if config.platform and not config.backend:
        from_platform = PLATFORM_TO_BACKEND.get(config.platform)
        if from_platform:
            config.backend = from_platform
    if config.backend and not config.platform:
        from_backend = BACKEND_TO_PLATFORM.get(config.backend)
        if from_backend:
            config.platform = from_backend
    if not config.backend and config.platform != "ensemble":
        raise ConfigError(
            f"unable to determine the backend for model '{config.name}': set 'backend' or 'platform' "
            "in config.pbtxt or provide a model file with a default name (model.onnx, model.pt, model.py, ...)"
        )


def default_model_filename(config: mc.ModelConfig) -> str:
    """The model file the backend loads from a version directory."""
    named: str = config.default_model_filename
    if named:
        return named
    return PLATFORM_FILENAMES.get(config.platform) or DEFAULT_FILENAMES.get(config.backend, "")


def fill_instance_groups(config: mc.ModelConfig, gpu_count: int) -> None:
    """Triton's default instance groups: names, kinds (AUTO resolved), counts."""
    if config.platform == "ensemble":
        return
    if not config.instance_group:
        group = config.instance_group.add()
        group.name = config.name
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            group.kind = mc.ModelInstanceGroup.KIND_GPU if gpu_count > 0 and config.backend != "python" else mc.ModelInstanceGroup.KIND_CPU
        if group.kind == mc.ModelInstanceGroup.KIND_GPU:
            if gpu_count == 0:
                raise ConfigError(
                    f"instance group '{group.name}' of model '{config.name}' asks for KIND_GPU but no GPU "
                    "is available on this machine (use KIND_CPU or KIND_AUTO)"
                )
            if not group.gpus:
                group.gpus.extend(range(gpu_count))
            for gpu in group.gpus:
                if gpu >= gpu_count:
                    raise ConfigError(
                        f"instance group '{group.name}' of model '{config.name}' names GPU {gpu}, "
                        f"but only {gpu_count} GPU(s) are available"
                    )
        if group.count == 0:
            two = group.kind == mc.ModelInstanceGroup.KIND_CPU and config.backend in TWO_CPU_INSTANCE_BACKENDS
            group.count = 2 if two else 1


def fill_defaults(config: mc.ModelConfig) -> None:
    """Normalisations visible in Triton's effective config."""
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    elif config.version_policy.HasField("latest") and config.version_policy.latest.num_versions == 0:
        config.version_policy.latest.num_versions = 1
    kind = config.WhichOneof("scheduling_choice")
    if kind == "dynamic_batching" and config.max_batch_size > 0:
        if not config.dynamic_batching.preferred_batch_size:
            config.dynamic_batching.preferred_batch_size.append(config.max_batch_size)
    if kind == "sequence_batching" and config.sequence_batching.max_sequence_idle_microseconds == 0:
        config.sequence_batching.max_sequence_idle_microseconds = 1_000_000
    if not config.HasField("optimization"):
        config.optimization.input_pinned_memory.enable = True
        config.optimization.output_pinned_memory.enable = True


def complete_tensor(config: mc.ModelConfig, declared: dict[str, mc.ModelInput | mc.ModelOutput],
                    field: RepeatedCompositeFieldContainer[mc.ModelInput] | RepeatedCompositeFieldContainer[mc.ModelOutput],
                    name: str, data_type: int, dims: list[int], source: str) -> None:
    """Add a tensor the model file declares to config inputs/outputs, or check and fill the one listed.

    A config value always wins; a datatype that disagrees with the model file is a load error.
    A rank-0 tensor becomes dims [1] with an empty reshape, as Triton writes scalars.
    """
    existing = declared.get(name)
    if existing is None:
        entry = field.add()
        entry.name, entry.data_type = name, data_type
        if dims:
            entry.dims.extend(dims)
        else:
            entry.dims.append(1)
            entry.reshape.SetInParent()
        return
    if existing.data_type not in (mc.TYPE_INVALID, data_type):
        raise ConfigError(
            f"unable to load model '{config.name}': configuration expects datatype "
            f"{mc.DataType.Name(existing.data_type)} for '{name}' but the {source} has {mc.DataType.Name(data_type)}"
        )
    if existing.data_type == mc.TYPE_INVALID:
        existing.data_type = data_type
    if not existing.dims and dims:
        existing.dims.extend(dims)
