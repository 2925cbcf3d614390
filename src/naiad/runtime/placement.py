"""Where each instance runs: on a thread of its own, on the event loop, or in a worker process.

The one place that reads a backend's `kind`: everything above sees only Instances (and asks here
for auto-completion, which runs model code and frameworks of worker-process models in a throw-away
worker, never in the server).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path
from typing import Literal

from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Backend, InstanceSpec, ModelSource, PoolInstance
from naiad.backends.registry import BackendRegistry
from naiad.config.model_config import ConfigError, parameter
from naiad.runtime.process.auto_complete import auto_complete_backend_model, auto_complete_python_model
from naiad.runtime.process.instance import start_process_instance
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


class WorkerHostedBackend:
    """The server's side of a backend whose model asks for worker-process instances: its name only.

    Its workers import the framework and load the model (`naiad.runtime.process.backend_host`), and a
    throw-away worker auto-completes the config, so the server process never imports the framework.
    """

    kind: Literal["process"] = "process"
    host: Literal["python", "backend"] = "backend"
    shared_model_file: Path | None = None

    def __init__(self, name: str) -> None:
        self.name = name


def backend_for(registry: BackendRegistry, config: mc.ModelConfig, backend_directory: str | None) -> Backend:
    """The backend the server uses for the model: the registry's, or for a framework model with worker-process
    instances, a WorkerHostedBackend (the registry would import the framework)."""
    if runs_in_processes(config) and not registry.runs_python_models(config.backend, backend_directory):
        return WorkerHostedBackend(config.backend)
    return registry.get(config.backend, backend_directory)


def shared_model_file(backend: Backend) -> Path | None:
    """The model.py a Python-based backend runs for all its models (None for other backends)."""
    return backend.shared_model_file if backend.kind == "process" else None


def auto_complete_config(backend: Backend, config: mc.ModelConfig, model_file: Path, default_max_batch_size: int) -> None:
    """Fill what the model file tells into the config: by the backend, in a throw-away worker for one that runs
    only in workers (a Python model's own code, or a worker-hosted framework)."""
    if backend.kind != "process":
        backend.auto_complete_config(config, model_file, default_max_batch_size)
    elif backend.host == "python":
        auto_complete_python_model(config, model_file, backend.shared_model_file)
    else:
        auto_complete_backend_model(config, model_file, default_max_batch_size)


async def start_instance(backend: Backend, source: ModelSource, spec: InstanceSpec,
                         executor: concurrent.futures.Executor | None = None) -> PoolInstance:
    """Create one instance where its backend and model say it runs."""
    if backend.kind == "process":
        return await start_process_instance(source, spec, backend.host)
    if backend.kind == "request":
        return await backend.create_instance(source, spec)
    loop = asyncio.get_running_loop()
    return ThreadInstance(await loop.run_in_executor(executor, backend.create_instance, source, spec))
