"""Model repository extension: index, load (config + base64 `file:` overrides), unload."""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any

from naiad.frontends.http.endpoint import RouteRequest
from naiad.frontends.http.responses import Reply, empty_reply, json_reply
from naiad.protocol.errors import invalid_arg, unsupported

if TYPE_CHECKING:
    from naiad.core.facade import ServerAPI

REPOSITORY_NAME_UNSUPPORTED = "'repository_name' specification is not supported"


def _check_repository_name(request: RouteRequest) -> None:
    if request.param("repository"):
        raise unsupported(REPOSITORY_NAME_UNSUPPORTED)


def decode_load_parameters(params: Any) -> tuple[str | None, dict[str, bytes] | None]:
    """(config JSON text, {"file:<path>": bytes}) from a load request's parameters object.

    Whether `config` is present when files are given is the core's rule (same for every protocol).
    """
    if params is None:
        return None, None
    if not isinstance(params, dict):
        raise invalid_arg("Unable to parse 'parameters'")
    config: str | None = None
    files: dict[str, bytes] = {}
    for key, value in params.items():
        if not isinstance(value, str):
            raise invalid_arg(f"Unable to parse parameter '{key}' of load request: expected a string")
        if key == "config":
            config = value
        elif key.startswith("file:"):
            try:
                files[key] = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise invalid_arg(f"Unable to decode base64 content of '{key}': {exc}") from None
    return config, (files or None)


class RepositoryHandlers:
    """Repository control through the facade; the control-mode rules live in the core."""

    def __init__(self, server: ServerAPI) -> None:
        self.server = server

    async def index(self, request: RouteRequest) -> Reply:
        _check_repository_name(request)
        doc = await request.json_object()
        ready = doc.get("ready", False)
        if not isinstance(ready, bool):
            raise invalid_arg("Unable to parse 'ready': expected a boolean")
        return json_reply(self.server.control.repository_index(ready_only=ready))

    async def load(self, request: RouteRequest) -> Reply:
        _check_repository_name(request)
        name = request.param("model")
        doc = await request.json_object()
        config, files = decode_load_parameters(doc.get("parameters"))
        await self.server.control.load_model(name, config_json=config, files=files)
        return empty_reply(200)

    async def unload(self, request: RouteRequest) -> Reply:
        _check_repository_name(request)
        name = request.param("model")
        doc = await request.json_object()
        params = doc.get("parameters") or {}
        if not isinstance(params, dict):
            raise invalid_arg("Unable to parse 'parameters'")
        dependents = params.get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise invalid_arg(f"Unable to parse 'unload_dependents': expected a boolean, got {dependents!r}")
        await self.server.control.unload_model(name, unload_dependents=dependents)
        return empty_reply(200)
