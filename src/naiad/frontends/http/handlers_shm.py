"""System and CUDA shared-memory region endpoints (status / register / unregister)."""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any

from naiad.frontends.http.endpoint import RouteRequest
from naiad.frontends.http.infer_params import is_uint
from naiad.frontends.http.responses import Reply, empty_reply, json_reply
from naiad.protocol.errors import invalid_arg
from naiad.protocol.request_json import json_preview

if TYPE_CHECKING:
    from naiad.core.facade import ServerAPI


def _uint_field(doc: dict[str, Any], key: str, required: bool, default: int = 0) -> int:
    if key not in doc:
        if required:
            raise invalid_arg(f"Shared memory register request has no '{key}' field")
        return default
    value = doc[key]
    if not is_uint(value):
        raise invalid_arg(f"Unable to parse '{key}': expected a non-negative integer, got {json_preview(value)}")
    return value


class SharedMemoryHandlers:
    """Region management through the facade's shared-memory interface (system regions; CUDA ones are refused)."""

    def __init__(self, server: ServerAPI) -> None:
        self.server = server

    async def system_status(self, request: RouteRequest) -> Reply:
        return json_reply(self.server.shared_memory.status(request.param("region")))

    async def system_register(self, request: RouteRequest) -> Reply:
        region = request.param("region")
        if not region:
            raise invalid_arg("'region name' is necessary to register system shared memory region")
        doc = await request.json_object(required=True)
        if "key" not in doc:
            raise invalid_arg("Shared memory register request has no 'key' field")
        key = doc["key"]
        if not isinstance(key, str):
            raise invalid_arg("Unable to parse 'key': expected a string")
        offset = _uint_field(doc, "offset", required=False)
        byte_size = _uint_field(doc, "byte_size", required=True)
        self.server.shared_memory.register(region, key, offset, byte_size)
        return empty_reply(200)

    async def system_unregister(self, request: RouteRequest) -> Reply:
        self.server.shared_memory.unregister(request.param("region"))
        return empty_reply(200)

    async def cuda_status(self, request: RouteRequest) -> Reply:
        return json_reply(self.server.shared_memory.cuda_status(request.param("region")))

    async def cuda_register(self, request: RouteRequest) -> Reply:
        region = request.param("region")
        if not region:
            raise invalid_arg("'region name' is necessary to register cuda shared memory region")
        doc = await request.json_object(required=True)
        handle = doc.get("raw_handle")
        if not isinstance(handle, dict):
            raise invalid_arg("Shared memory register request has no 'raw_handle' field")
        b64 = handle.get("b64")
        if not isinstance(b64, str):
            raise invalid_arg("Unable to parse 'raw_handle': expected {\"b64\": \"<base64>\"}")
        try:
            raw_handle = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise invalid_arg(f"Unable to decode base64 content of 'raw_handle': {exc}") from None
        byte_size = _uint_field(doc, "byte_size", required=True)
        device_id = _uint_field(doc, "device_id", required=True)
        self.server.shared_memory.cuda_register(region, raw_handle, device_id, byte_size)
        return empty_reply(200)

    async def cuda_unregister(self, request: RouteRequest) -> Reply:
        self.server.shared_memory.cuda_unregister(request.param("region"))
        return empty_reply(200)
