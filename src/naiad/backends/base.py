"""The Backend protocols every framework module implements, and the Instance protocol the server runs them through."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.protocol.errors import NaiadError
from naiad.protocol.types import InferenceRequest, InferenceResponse


class MetricsRegistry(Protocol):
    """The server's /metrics, as a backend sees it: providers of extra metric families."""

    # Each provider returns its current families (prometheus_client metric families) when /metrics is read.
    extra_families: list[Callable[[], list[Any]]]


class CustomMetricsRegistry(Protocol):
    """The metric families model code creates (pb_utils.MetricFamily), updated from worker processes."""

    def update(self, op: str, *args: Any) -> None: ...


class ServerServices(Protocol):
    """What a backend may ask of the server it runs in (BLS, model control from model code, metrics)."""

    metrics: MetricsRegistry
    custom_metrics: CustomMetricsRegistry

    async def infer_async(self, request: InferenceRequest) -> InferenceResponse: ...

    def infer_stream(
        self, request: InferenceRequest, errors_inline: bool = False
    ) -> AsyncIterator[tuple[InferenceResponse | NaiadError | None, bool]]: ...

    async def load_model(self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None) -> None: ...

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None: ...

    def model_ready(self, name: str, version: str = "") -> bool: ...

    @property
    def inflight_requests(self) -> int: ...


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


# A tokenizer's chat template: (messages, add_generation_prompt) -> prompt.
ChatTemplate = Callable[[list[dict[str, Any]], bool], str]


class Instance(Protocol):
    """What an InstancePool hands out: schedulers, health, memory accounting and unload use only this.

    Every capability is declared here (a default where most instances need nothing), never probed.
    How an instance executes is declared too: `executes` says which of the two execution protocols
    below it follows, `TensorInstance` (batches of tensors) or `RequestModelInstance` (whole requests),
    and is the only thing a scheduler reads to choose the path. The adapters are `ThreadInstance`
    (a ModelInstance on its own thread: a TensorInstance) and `ProcessInstance` (an instance in a
    worker process: a RequestModelInstance); the LLM engines' instances are RequestModelInstances too.
    """

    name: str
    # True: after a cancelled execution, take_unfinished() names the work still running, so the caller
    # can release the instance once it ended. False: the pool runs each execution shielded in a task.
    tracks_unfinished: bool
    # True: the instance runs in a worker process of its own (`pid`), outside the server's memory.
    in_worker_process: bool

    @property
    def executes(self) -> Literal["tensors", "requests"]:
        """Which execution protocol the instance follows: TensorInstance or RequestModelInstance."""
        ...

    @property
    def pid(self) -> int:
        """Process id of the worker running the instance; 0 in the server process or while restarting."""
        ...

    def take_unfinished(self) -> asyncio.Future[Any] | concurrent.futures.Future[Any] | None:
        """After a cancelled execution: what still runs (only meaningful when tracks_unfinished)."""
        ...

    def queued(self) -> int:
        """Executions handed over ahead that have not started yet (a worker's pipeline); 0 for most."""
        ...

    def takes_at_once(self) -> int:
        """Executions the instance would take now, one after another, without any waiting for room: more
        than 1 only for a worker with room in its pipeline. The pool hands the instance to that many
        waiting callers in one go (see InstancePool.release); 1 for most."""
        ...

    def restarts(self) -> int:
        """How many times the instance lost all it held because its worker process died (and was replaced).

        0 for most. A sequence that started on the instance before it lost what it held cannot go on:
        the sequence batcher ends it with an error.
        """
        ...

    def memory_bytes(self) -> int:
        """Memory the instance holds outside the server process (its worker's RSS); 0 for most."""
        ...

    def chat_template(self) -> ChatTemplate | None:
        """The tokenizer's chat template of an LLM instance (OpenAI chat completions); None for others."""
        ...

    def healthy(self) -> bool: ...

    async def aclose(self) -> None: ...


class TensorInstance(Instance, Protocol):
    """An instance that executes batches of tensors, already concatenated by the scheduler.

    `execute` runs the batch off the event loop (the instance's own thread); `execute_inline` runs it
    on the caller's thread, when the inline policy (naiad/scheduling/execution_policy.py) says so.
    """

    # CPU time the instance's thread spent in the last execute() (the inline policy's measure).
    last_thread_ns: int

    @property
    def executes(self) -> Literal["tensors"]: ...

    async def execute(self, batch: ExecutionBatch) -> dict[str, np.ndarray]: ...

    def execute_inline(self, batch: ExecutionBatch) -> dict[str, np.ndarray]: ...


class RequestModelInstance(Instance, Protocol):
    """An instance that executes requests individually and may respond several times (decoupled).

    `execute_requests` returns when the instance is free for the next batch, usually once the
    model's execute returned; `respond(index, response)` may still be called afterwards, on the
    event loop, until each request got a final response. It may return the execution's
    (start, end) in time.perf_counter_ns(), or a future of them when it returns before the
    execution ended (the statistics then count the execution when it did); None: the caller times it.
    """

    @property
    def executes(self) -> Literal["requests"]: ...

    async def execute_requests(self, requests: list[BackendRequest], respond: ResponseCallback) -> ExecutionOutcome: ...


# What an InstancePool holds and a scheduler executes on: `executes` tells the two apart.
PoolInstance = TensorInstance | RequestModelInstance


class InProcessRequestInstance:
    """Defaults of the Instance capabilities for a request-level instance running in the server process."""

    executes: Final = "requests"
    tracks_unfinished = False
    in_worker_process = False
    pid = 0

    def take_unfinished(self) -> asyncio.Future[Any] | concurrent.futures.Future[Any] | None:
        return None

    def queued(self) -> int:
        return 0

    def takes_at_once(self) -> int:
        return 1

    def restarts(self) -> int:
        return 0

    def memory_bytes(self) -> int:
        return 0

    def chat_template(self) -> ChatTemplate | None:
        return None


class TensorBackend(Protocol):
    """A framework whose instances take tensors: ONNX Runtime, PyTorch, TensorFlow, OpenVINO, FIL.

    `create_instance` blocks (it loads the model) and runs on a loader thread; each instance then runs
    on its own thread. When the model asks for worker processes (INSTANCE_PROCESS), both methods run
    in workers instead, and the server never imports the backend's module.
    """

    name: str
    kind: Literal["tensor"]

    def auto_complete_config(self, config: mc.ModelConfig, model_file: Path, default_max_batch_size: int) -> None:
        """Add what the model file tells (inputs, outputs, max_batch_size); never override config values."""
        ...

    def create_instance(self, source: ModelSource, spec: InstanceSpec) -> ModelInstance: ...


class RequestBackend(Protocol):
    """A framework whose instances take whole requests on the event loop (the LLM engines)."""

    name: str
    kind: Literal["request"]

    def auto_complete_config(self, config: mc.ModelConfig, model_file: Path, default_max_batch_size: int) -> None: ...

    async def create_instance(self, source: ModelSource, spec: InstanceSpec) -> RequestModelInstance: ...


class ProcessBackend(Protocol):
    """A backend whose code runs only in worker processes, never in the server.

    Triton's Python backend (model.py, `host` "python"): the process runtime (`naiad.runtime.process`)
    hosts the model file in each instance's worker, and runs its `auto_complete_config` in a throw-away
    worker. A Python-based backend (`<backend-directory>/<name>/model.py`) has a `shared_model_file`
    run for every model using it. And a tensor backend whose model asks for worker-process instances
    (INSTANCE_PROCESS, `host` "backend"): the server knows it only by name
    (`naiad.runtime.placement.WorkerHostedBackend`) and its workers load it, so the framework is never
    imported in the server.
    """

    name: str
    kind: Literal["process"]
    host: Literal["python", "backend"]
    shared_model_file: Path | None


# What the server uses a model's backend through; `kind` tells which of the three it is.
Backend = TensorBackend | RequestBackend | ProcessBackend
