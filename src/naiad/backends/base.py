"""The Backend and ModelInstance protocols every framework module implements."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.protocol.errors import NaiadError
from naiad.protocol.types import InferenceRequest, InferenceResponse


class ServerServices(Protocol):
    """What a backend may ask of the server it runs in (BLS, model control from model code)."""

    async def infer_async(self, request: InferenceRequest) -> InferenceResponse: ...

    def infer_stream(
        self, request: InferenceRequest, errors_inline: bool = False
    ) -> AsyncIterator[tuple[InferenceResponse | NaiadError | None, bool]]: ...

    async def load_model(self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None) -> None: ...

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None: ...

    def model_ready(self, name: str, version: str = "") -> bool: ...


@dataclass
class ModelSource:
    """What a backend needs to build a model version: its config and where its files are."""

    config: mc.ModelConfig
    version: int
    model_dir: Path
    version_dir: Path
    model_file: Path
    backend_settings: dict[str, str] = field(default_factory=dict)
    server: ServerServices | None = None


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


@dataclass
class BackendRequest:
    """One request as request-level backends (Python) see it: never concatenated with others."""

    inputs: dict[str, np.ndarray]
    requested_outputs: list[str]
    request_id: str = ""
    correlation_id: int | str = 0
    flags: int = 0
    parameters: dict[str, Any] = field(default_factory=dict)
    timeout_us: int = 0
    model_name: str = ""
    model_version: int = 0
    is_cancelled: Callable[[], bool] = lambda: False
    # Set by schedulers that can run the request again (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE):
    # the backend calls it once the execution that asked for it returned. None: not supported.
    reschedule: Callable[[], None] | None = None


@dataclass
class BackendResponse:
    """One response of a request; `final` completes the request. Flag-only final: outputs None."""

    outputs: dict[str, np.ndarray] | None
    parameters: dict[str, Any] = field(default_factory=dict)
    error: NaiadError | None = None
    final: bool = True
    # Triton counts a model's error *response* as a successful request and a raised exception
    # (or an execution failure) as a failed one.
    counts_as_failure: bool = True
    # (start, end) in time.perf_counter_ns() of the execution that produced it, when the backend
    # measured it itself (a worker process may start a batch well after it was handed over).
    execution_ns: tuple[int, int] | None = None


ResponseCallback = Callable[[int, BackendResponse], None]
ExecutionTiming = tuple[int, int]
ExecutionOutcome = ExecutionTiming | asyncio.Future | None


class RequestModelInstance(Protocol):
    """An instance that executes requests individually and may respond several times (decoupled).

    `execute_requests` returns when the instance is free for the next batch, usually once the
    model's execute returned; `respond(index, response)` may still be called afterwards, on the
    event loop, until each request got a final response. It may return the execution's
    (start, end) in time.perf_counter_ns(), or a future of them when it returns before the
    execution ended (the statistics then count the execution when it did); None: the caller times it.
    """

    name: str

    async def execute_requests(self, requests: list[BackendRequest], respond: ResponseCallback) -> ExecutionOutcome: ...

    def healthy(self) -> bool: ...

    async def aclose(self) -> None: ...


# What a backend's create_instance(_async) returns: a tensor instance or a request-level one.
BackendInstance = ModelInstance | RequestModelInstance
