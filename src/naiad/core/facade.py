"""The server facade as frontends see it: four narrow protocols over plain request and response values.

Frontends (HTTP, gRPC, OpenAI, SageMaker, Vertex AI, metrics) and the in-process API depend on
these protocols only, never on the `Server` class or the modules behind it (an import-linter
contract in pyproject.toml holds that seam). Arguments and results are protocol types
(`InferenceRequest`, `InferenceResponse`, `NaiadError`), dicts, lists and strings, which pickle,
and the `ModelConfig` protobuf, which crosses a process boundary as its serialized bytes: values a
frontend in another process can be handed as well. The one exception is a `ResolvedModel`, a
handle on a loaded model that stays in the process that resolved it.

- `InferenceAPI`: run requests. Shared-memory references in a request are resolved by the core,
  inputs and outputs alike: a frontend only decodes the reference. A frontend that must know the
  model to decode a request (generate, a raw binary body, the OpenAI API) resolves it first and
  hands the `ResolvedModel` to `infer`/`stream`: one model lookup per request on every path.
- `ModelControlAPI`: health and readiness, the repository index, load and unload.
- `ServerInfoAPI`: server and model metadata, model configs, statistics, metrics, log and trace settings.
- `SharedMemoryAPI`: the regions clients register for tensors (their own API group in Triton).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tritonclient.grpc import model_config_pb2 as mc

from naiad.config.server_config import ServerConfig
from naiad.protocol.errors import NaiadError
from naiad.protocol.types import InferenceRequest, InferenceResponse

# One item of a response stream: (response, is_final); (None, True) is a flag-only final and a
# NaiadError is an error response that did not end the stream (errors_inline).
StreamItem = tuple[InferenceResponse | NaiadError | None, bool]


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    """An input or output as model metadata reports it: the shape holds -1 for the batch dimension."""

    name: str
    datatype: str
    shape: tuple[int, ...]


class ResolvedModel(Protocol):
    """The model version one request runs on, looked up once (`InferenceAPI.resolve`).

    A frontend decodes the request against these views, then passes the handle to `infer` or
    `stream`, which run on that version without looking it up again. A handle whose version was
    unloaded or replaced in between is looked up again there, so the request gets the answer it
    would have got without one (NOT_FOUND, or a load with --load-on-demand). A handle belongs to
    the process that resolved it: it does not cross to a frontend worker.
    """

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str:
        """The version number resolved (the newest ready one when the request named none)."""
        ...

    @property
    def decoupled(self) -> bool: ...

    @property
    def config(self) -> mc.ModelConfig: ...

    @property
    def inputs(self) -> Sequence[TensorMetadata]: ...

    @property
    def outputs(self) -> Sequence[TensorMetadata]: ...

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str | None:
        """The prompt the model's tokenizer template makes of `messages`; None when it has no template."""
        ...


class InferenceAPI(Protocol):
    """Runs inference requests on loaded models."""

    async def resolve(self, name: str, version: str = "") -> ResolvedModel:
        """The model (version) a request names, for a frontend that decodes against it; raises what
        `infer` would (server not ready, unknown model). With --load-on-demand it loads the model."""
        ...

    async def infer(self, request: InferenceRequest, resolved: ResolvedModel | None = None) -> InferenceResponse:
        """One request, one response; a decoupled model raises DecoupledModelError (use `stream`).
        `resolved`: the handle `resolve` gave for this request's model, to run on without a second lookup."""
        ...

    def stream(self, request: InferenceRequest, errors_inline: bool = False,
               resolved: ResolvedModel | None = None) -> AsyncIterator[StreamItem]:
        """Every response of a request, decoupled or not. An error response raises and ends the
        stream, unless `errors_inline`: then it is yielded and later responses follow."""
        ...

    def check_servable(self, name: str, version: str = "") -> None:
        """Raise what `infer` would for a model (version) it cannot serve (unknown: NOT_FOUND).
        Frontends call it when a request fails to decode, so that an unknown model is a 404 whatever
        the body holds, without a second model lookup on requests that decode."""
        ...


class ModelControlAPI(Protocol):
    """Health, readiness and the model repository (index, load, unload)."""

    def is_live(self) -> bool: ...

    def is_ready(self) -> bool: ...

    def model_ready(self, name: str, version: str = "") -> bool:
        """True when servable; False when loaded but an instance is unhealthy; NOT_FOUND otherwise."""
        ...

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]: ...

    def unreadable_models(self) -> dict[str, str]:
        """{model: reason} for models whose config.pbtxt could not be read."""
        ...

    async def load_model(self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None) -> None: ...

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None: ...


class ServerInfoAPI(Protocol):
    """What the server and its models are, how they have been doing, and how they log and trace."""

    def metadata(self) -> dict[str, Any]: ...

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]: ...

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig: ...

    def model_config_dict(self, name: str, version: str = "") -> dict[str, Any]: ...

    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]: ...

    def metrics_text(self) -> str:
        """Every metric family in Prometheus text format."""
        ...

    def get_log_settings(self) -> dict[str, Any]: ...

    def update_log_settings(self, changes: dict[str, Any]) -> dict[str, Any]: ...

    def get_trace_settings(self, model: str = "") -> dict[str, Any]: ...

    def update_trace_settings(self, model: str, changes: dict[str, Any]) -> dict[str, Any]: ...


class SharedMemoryAPI(Protocol):
    """Client-registered shared-memory regions that requests name for their inputs and outputs."""

    def status(self, name: str = "") -> list[dict[str, Any]]: ...

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None: ...

    def unregister(self, name: str = "") -> None: ...

    def cuda_status(self, name: str = "") -> list[dict[str, Any]]: ...

    def cuda_register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None: ...

    def cuda_unregister(self, name: str = "") -> None: ...


class ServerAPI(Protocol):
    """What a frontend is given: the server's settings and the four interfaces."""

    @property
    def config(self) -> ServerConfig: ...

    @property
    def inference(self) -> InferenceAPI: ...

    @property
    def control(self) -> ModelControlAPI: ...

    @property
    def info(self) -> ServerInfoAPI: ...

    @property
    def shared_memory(self) -> SharedMemoryAPI: ...
