"""Builds a model's effective config and its instances (blocking work, run off the event loop)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Backend, Instance, InstanceSpec, ModelSource, ServerServices
from naiad.backends.registry import BackendRegistry, BackendUnavailable
from naiad.config.completion import (
    default_model_filename,
    fill_defaults,
    fill_instance_groups,
    resolve_backend,
)
from naiad.config.ensemble import check_ensemble_graph
from naiad.config.model_config import (
    ConfigError,
    ConfigReadError,
    load_config_file,
    parse_config_json,
)
from naiad.config.server_config import ServerConfig
from naiad.config.validation import validate_config, validate_read
from naiad.repository.local import config_file, version_directories
from naiad.runtime.devices import gpu_count
from naiad.runtime.placement import auto_complete_config, backend_for, shared_model_file

log = logging.getLogger(__name__)


@dataclass
class PreparedModel:
    """A model's effective config and the versions its policy selects."""

    config: mc.ModelConfig
    model_dir: Path
    versions: dict[int, Path]  # selected version -> directory (missing specific versions absent)
    missing_versions: list[int]


def select_versions(config: mc.ModelConfig, available: dict[int, Path]) -> tuple[dict[int, Path], list[int]]:
    """Apply version_policy: latest N (default 1), all, or specific (missing ones reported)."""
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return dict(available), []
    if which == "specific":
        wanted = list(dict.fromkeys(policy.specific.versions))
        return {v: available[v] for v in wanted if v in available}, [v for v in wanted if v not in available]
    count = policy.latest.num_versions if which == "latest" and policy.latest.num_versions > 0 else 1
    chosen = sorted(available)[-count:]
    return {v: available[v] for v in chosen}, []


def read_config(
    name: str, model_dir: Path, settings: ServerConfig, config_override: str | None = None
) -> tuple[mc.ModelConfig, str, str]:
    """(config, source, text): the config as written or overridden, named, with its backend known.

    What Triton checks when it polls the repository; a failure here raises ConfigReadError.
    """
    text = ""
    try:
        if config_override is not None:
            source = f"config override for '{name}'"
            config = parse_config_json(config_override, source)
        else:
            path = config_file(model_dir, settings.model_config_name)
            if path is None:
                source = str(model_dir / "config.pbtxt")
                config = mc.ModelConfig()
            else:
                source = str(path)
                text = path.read_text(encoding="utf-8", errors="replace")
                config = load_config_file(path)
        if config.name and config.name != name:
            raise ConfigError(f"{source}: field 'name': '{config.name}' does not match the model directory name '{name}'")
        validate_read(config, source, text)
        config.name = name
        available = version_directories(model_dir)
        resolve_backend(config, available[max(available)] if available else None)
    except ConfigReadError:
        raise
    except ConfigError as exc:
        raise ConfigReadError(str(exc)) from None
    return config, source, text


def prepare_model(
    name: str,
    model_dir: Path,
    settings: ServerConfig,
    backends: BackendRegistry,
    config_override: str | None = None,
) -> PreparedModel:
    """Read (or take) the config, auto-complete it from the model file, fill defaults, validate."""
    config, source, text = read_config(name, model_dir, settings, config_override)
    available = version_directories(model_dir)
    highest = available[max(available)] if available else None
    if not available:
        raise ConfigError(f"model '{name}' has no version directory (e.g. {model_dir}/1/)")
    if not config.default_model_filename and config.platform != "ensemble":
        config.default_model_filename = default_model_filename(config)
    if not settings.strict_model_config and config.platform != "ensemble":
        backend = _backend(config, settings, backends)
        default_mbs = int(settings.backend_setting(config.backend, "default-max-batch-size", "4") or 4)
        model_file = _model_file(config, model_dir, highest)
        if model_file.exists() or shared_model_file(backend) is not None:
            auto_complete_config(backend, config, model_file, default_mbs)
    fill_defaults(config)
    fill_instance_groups(config, gpu_count())
    validate_config(config, source, text)
    if config.platform == "ensemble":
        check_ensemble_graph(config, source)
    versions, missing = select_versions(config, available)
    return PreparedModel(config, model_dir, versions, missing)


def _backend(config: mc.ModelConfig, settings: ServerConfig, backends: BackendRegistry) -> Backend:
    try:
        return backend_for(backends, config, settings.backend_directory)
    except BackendUnavailable as exc:
        raise ConfigError(str(exc)) from None


def _model_file(config: mc.ModelConfig, model_dir: Path, version_dir: Path | None) -> Path:
    assert version_dir is not None
    filename: str = config.default_model_filename
    return version_dir / filename


def instance_specs(config: mc.ModelConfig) -> list[InstanceSpec]:
    """One spec per instance: `count` per group, per GPU for KIND_GPU groups."""
    specs: list[InstanceSpec] = []
    for group in config.instance_group:
        devices = list(group.gpus) if group.kind == mc.ModelInstanceGroup.KIND_GPU else [0]
        for device in devices:
            for k in range(group.count):
                specs.append(InstanceSpec(f"{group.name}_{k}", group, group.kind, device))
    return specs


def instance_source(
    prepared: PreparedModel, version: int, settings: ServerConfig, backends: BackendRegistry, server: ServerServices | None
) -> tuple[Backend, ModelSource]:
    """The backend and the ModelSource its instances are created from."""
    config = prepared.config
    version_dir = prepared.versions[version]
    backend = _backend(config, settings, backends)
    backend_settings = settings.backend_config.get(config.backend, {})
    shared = shared_model_file(backend)
    if shared is not None:
        # A Python-based backend: its shared model.py runs; the version directory only holds data
        # files, and the Python backend's own --backend-config settings apply under the backend's.
        model_file = shared
        backend_settings = {**settings.backend_config.get("python", {}), **backend_settings}
    else:
        model_file = version_dir / config.default_model_filename
        if not model_file.exists():
            raise ConfigError(f"unable to find '{model_file}' for model '{config.name}' version {version}")
    source = ModelSource(config, version, prepared.model_dir, version_dir, model_file, backend_settings, server)
    return backend, source


def instances_memory_bytes(instances: Sequence[Instance]) -> int:
    """Memory instances hold outside this process (their worker processes' RSS)."""
    return sum(instance.memory_bytes() for instance in instances)
