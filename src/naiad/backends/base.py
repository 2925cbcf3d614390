"""The Backend and ModelInstance protocols every framework module implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc


@dataclass
class ModelSource:
    """What a backend needs to build a model version: its config and where its files are."""

    config: mc.ModelConfig
    version: int
    model_dir: Path
    version_dir: Path
    model_file: Path
    backend_settings: dict[str, str] = field(default_factory=dict)


@dataclass
class InstanceSpec:
    """One instance to create from an instance group."""

    name: str
    group: mc.ModelInstanceGroup
    kind: int
    device_id: int


@dataclass
class ExecutionBatch:
    """Inputs of the requests of one batch, already concatenated along dim 0 when batching."""

    inputs: dict[str, np.ndarray]
    output_names: list[str]
    batch_size: int


class ModelInstance(Protocol):
    """One execution context; `execute` runs on the instance's own thread, one batch at a time."""

    name: str

    def execute(self, batch: ExecutionBatch) -> dict[str, np.ndarray]:
        """Outputs by name; batching models return arrays whose dim 0 is batch.batch_size."""
        ...

    def close(self) -> None: ...


class Backend(Protocol):
    """A framework: completes configs from model files and creates instances."""

    name: str

    def auto_complete_config(self, config: mc.ModelConfig, model_file: Path, default_max_batch_size: int) -> None:
        """Add what the model file tells (inputs, outputs, max_batch_size); never override config values."""
        ...

    def create_instance(self, source: ModelSource, spec: InstanceSpec) -> ModelInstance: ...
