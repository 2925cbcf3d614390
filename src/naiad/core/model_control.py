"""The model control interface: server and model readiness, the repository index, load and unload."""

from __future__ import annotations

from naiad.config.server_config import ServerConfig
from naiad.core.model_lifecycle import ModelLifecycle
from naiad.core.serving_state import ServingState
from naiad.protocol.errors import unavailable


class ModelControlService:
    """`ModelControlAPI` over the Server's model lifecycle and serving state."""

    def __init__(self, config: ServerConfig, models: ModelLifecycle, state: ServingState) -> None:
        self._config = config
        self._models = models
        self._state = state

    def is_live(self) -> bool:
        return self._state.live

    def is_ready(self) -> bool:
        state = self._state
        if not state.live or state.exiting:
            return False
        return self._models.all_ready() if self._config.strict_readiness else True

    def model_ready(self, name: str, version: str = "") -> bool:
        """True when servable; False when loaded but an instance is unhealthy; NOT_FOUND otherwise."""
        self._state.check_serving()
        return self._models.lookup(name, version).healthy()

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        return self._models.index(ready_only)

    def unreadable_models(self) -> dict[str, str]:
        """{model: reason} for models whose config.pbtxt could not be read (Triton's index leaves them out)."""
        return dict(self._models.unreadable)

    async def load_model(self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None) -> None:
        self._check_explicit()
        await self._models.load(name, config_json, files)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self._check_explicit()
        await self._models.unload(name, unload_dependents)

    def _check_explicit(self) -> None:
        if self._config.model_control_mode != "explicit":
            raise unavailable("explicit model load / unload is not allowed if polling is enabled")
