"""Where each instance runs: on a thread of its own, on the event loop, or in a worker process.

The one place that reads a backend's `kind`: everything above sees only Instances (and asks here
for auto-completion, which runs a Python model's code in a throw-away worker, never in the server).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Backend, InstanceSpec, ModelSource, PoolInstance
from naiad.config.model_config import ConfigError, parameter
from naiad.runtime.process.auto_complete import auto_complete_python_model
from naiad.runtime.process.instance import BACKEND_HOST, PYTHON_HOST, start_process_instance
from naiad.runtime.thread_instance import ThreadInstance

# The model parameter that runs a tensor backend's instances in worker processes (crash isolation).
INSTANCE_PROCESS = "INSTANCE_PROCESS"


def runs_in_processes(config: mc.ModelConfig) -> bool:
    """Whether the model asks for worker-process instances: parameters { key: "INSTANCE_PROCESS" ... "true" }."""
    value = (parameter(config, INSTANCE_PROCESS) or "").strip().lower()
    if value in ("", "false", "no", "off", "0"):
        return False
    if value in ("true", "yes", "on", "1"):
        return True
    raise ConfigError(f"model '{config.name}': parameter {INSTANCE_PROCESS} must be true or false, got '{value}'")


def shared_model_file(backend: Backend) -> Path | None:
    """The model.py a Python-based backend runs for all its models (None for other backends)."""
    return backend.shared_model_file if backend.kind == "process" else None


def auto_complete_config(backend: Backend, config: mc.ModelConfig, model_file: Path, default_max_batch_size: int) -> None:
    """Fill what the model file tells into the config: by the backend, or by a Python model's own code in a worker."""
    if backend.kind == "process":
        auto_complete_python_model(config, model_file, backend.shared_model_file)
    else:
        backend.auto_complete_config(config, model_file, default_max_batch_size)


async def start_instance(backend: Backend, source: ModelSource, spec: InstanceSpec,
                         executor: concurrent.futures.Executor | None = None) -> PoolInstance:
    """Create one instance where its backend and model say it runs."""
    if backend.kind == "process":
        return await start_process_instance(source, spec, PYTHON_HOST)
    if backend.kind == "request":
        if runs_in_processes(source.config):
            raise ConfigError(f"model '{source.config.name}': backend '{backend.name}' cannot run its instances "
                              f"in worker processes ({INSTANCE_PROCESS})")
        return await backend.create_instance(source, spec)
    if runs_in_processes(source.config):
        return await start_process_instance(source, spec, BACKEND_HOST)
    loop = asyncio.get_running_loop()
    return ThreadInstance(await loop.run_in_executor(executor, backend.create_instance, source, spec))
