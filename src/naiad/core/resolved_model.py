"""The handle `InferenceAPI.resolve` gives a frontend: one looked-up model version, read-only views of it."""

from __future__ import annotations

from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from naiad.core.facade import TensorMetadata
from naiad.core.model_version import ModelVersion


class ResolvedVersion:
    """`ResolvedModel` over a ModelVersion; infer and stream run on `current()` when it is not None.

    `version_model` is the version it was resolved to, public so that the request path can read it
    without the property calls (see inference_service._current)."""

    __slots__ = ("version_model",)

    def __init__(self, model: ModelVersion) -> None:
        self.version_model = model

    def current(self) -> ModelVersion | None:
        """The version, unless it stopped serving since it was resolved (then infer looks up again)."""
        return None if self.version_model.retired else self.version_model

    @property
    def name(self) -> str:
        return self.version_model.name

    @property
    def version(self) -> str:
        return self.version_model.version_str

    @property
    def decoupled(self) -> bool:
        return self.version_model.decoupled

    @property
    def config(self) -> mc.ModelConfig:
        return self.version_model.config

    @property
    def inputs(self) -> tuple[TensorMetadata, ...]:
        return self.version_model.input_metadata

    @property
    def outputs(self) -> tuple[TensorMetadata, ...]:
        return self.version_model.output_metadata

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str | None:
        return self.version_model.apply_chat_template(messages, add_generation_prompt)
