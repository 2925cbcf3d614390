"""The handle `InferenceAPI.resolve` gives a frontend: one looked-up model version, read-only views of it."""

from __future__ import annotations

from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from naiad.core.facade import TensorMetadata
from naiad.core.model_version import ModelVersion


class ResolvedVersion:
    """`ResolvedModel` over a ModelVersion; infer and stream run on `current()` when it is not None."""

    __slots__ = ("_model",)

    def __init__(self, model: ModelVersion) -> None:
        self._model = model

    def current(self) -> ModelVersion | None:
        """The version, unless it stopped serving since it was resolved (then infer looks up again)."""
        return None if self._model.retired else self._model

    @property
    def name(self) -> str:
        return self._model.name

    @property
    def version(self) -> str:
        return self._model.version_str

    @property
    def decoupled(self) -> bool:
        return self._model.decoupled

    @property
    def config(self) -> mc.ModelConfig:
        return self._model.config

    @property
    def inputs(self) -> tuple[TensorMetadata, ...]:
        return self._model.input_metadata

    @property
    def outputs(self) -> tuple[TensorMetadata, ...]:
        return self._model.output_metadata

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str | None:
        return self._model.apply_chat_template(messages, add_generation_prompt)
