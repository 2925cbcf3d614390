"""Deployment safety shared by the frontends: restricted API groups, header forwarding, model-name checks."""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from naiad.protocol.model_names import check_model_name, model_name_problem  # noqa: F401 (used by the guards)

API_GROUPS = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)

GRPC_HEADER_PREFIX = "triton-grpc-protocol-"

# Request parameters a forwarded header may never set: the ones the protocol itself interprets.
RESERVED_PARAMETERS = frozenset((
    "sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers",
    "binary_data_output", "binary_data", "binary_data_size", "classification",
    "shared_memory_region", "shared_memory_byte_size", "shared_memory_offset",
))
_CASE_SENSITIVE_PREFIX = "(?-i)"


# ---------------------------------------------------------------- restricted API groups


@dataclass(frozen=True)
class Restriction:
    """The header (name, value) a caller must send to use one API group."""

    key: str
    value: str

    def allows(self, sent: str | None) -> bool:
        return sent is not None and hmac.compare_digest(sent.encode(), self.value.encode())


def parse_restrictions(entries: Iterable[str], option: str, key_prefix: str = "") -> dict[str, Restriction]:
    """`<group>[,<group>...]:<key>=<value>` entries -> {group: Restriction}; ValueError names the bad entry.

    A group may appear in one entry only (as tritonserver requires); `key_prefix` is prepended
    to the key (gRPC metadata carries `triton-grpc-protocol-<key>`). Keys are matched
    case-insensitively, so they are kept lower-case.
    """
    result: dict[str, Restriction] = {}
    for entry in entries:
        groups, colon, setting = entry.partition(":")
        key, equals, value = setting.partition("=")
        if not colon or not equals or not groups or not key or not value:
            raise ValueError(f"--{option} option format is '<api>[,<api>...]:<key>=<value>'. Got {entry}")
        for group in (g.strip() for g in groups.split(",")):
            if group not in API_GROUPS:
                raise ValueError(f"--{option}: unknown restricted API '{group}' (known: {', '.join(API_GROUPS)})")
            if group in result:
                raise ValueError(f"--{option}: restricted API '{group}' can not be specified in multiple config groups")
            result[group] = Restriction((key_prefix + key).lower(), value)
    return result


def http_restriction_message(key: str) -> str:
    return f"This API is restricted, expecting header '{key}'"


def grpc_restriction_message(key: str) -> str:
    return f"This protocol is restricted, expecting header '{key}'"


def _model_route_group(rest: list[str]) -> str | None:
    """Group of `/v2/models/<m>[/versions/<v>]<rest>` given the segments after the model name."""
    if len(rest) >= 2 and rest[0] == "versions":
        rest = rest[2:]
    suffix = "/".join(rest)
    return {
        "": "metadata",
        "ready": "health",
        "config": "model-config",
        "infer": "inference",
        "generate": "inference",
        "generate_stream": "inference",
        "stats": "statistics",
        "trace/setting": "trace",
    }.get(suffix)


def http_api_group(path: str) -> str | None:
    """The restricted-API group of an HTTP path, or None for paths outside every group (e.g. 404s)."""
    if path == "/v2":
        return "metadata"
    parts = path.split("/")
    if len(parts) < 3 or parts[0] or parts[1] != "v2":
        return None
    head = parts[2]
    if head == "health":
        return "health"
    if head == "models":
        if len(parts) == 4 and parts[3] == "stats":
            return "statistics"
        return _model_route_group(parts[4:]) if len(parts) >= 4 else None
    return {
        "repository": "model-repository",
        "systemsharedmemory": "shared-memory",
        "cudasharedmemory": "shared-memory",
        "trace": "trace",
        "logging": "logging",
    }.get(head)


GRPC_RPC_GROUPS = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "Check": "health",  # grpc.health.v1.Health/Check
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelInfer": "inference",
    "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory",
    "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory",
    "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory",
    "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace",
    "LogSettings": "logging",
}


# ---------------------------------------------------------------- header forwarding


class HeaderForwarder:
    """`--http/grpc-header-forward-pattern`: matching headers become string request parameters.

    Matching is a regex search over the (lower-case) header name, case-insensitive unless the
    pattern starts with `(?-i)`. Headers named `triton_*` or like a parameter the protocol
    interprets (sequence_id, priority, ...) are never forwarded, and a forwarded header never
    replaces a parameter the request body already set.
    """

    def __init__(self, pattern: str) -> None:
        flags = re.IGNORECASE
        if pattern.startswith(_CASE_SENSITIVE_PREFIX):
            pattern = pattern[len(_CASE_SENSITIVE_PREFIX):]
            flags = 0
        try:
            self._regex = re.compile(pattern, flags)
        except re.error as exc:
            raise ValueError(f"invalid header forward pattern '{pattern}': {exc}") from None

    def matches(self, name: str) -> bool:
        lowered = name.lower()
        if lowered.startswith("triton_") or lowered in RESERVED_PARAMETERS:
            return False
        return self._regex.search(name) is not None

    def forwarded(self, headers: Iterable[tuple[Any, Any]]) -> dict[str, str]:
        """{name: value} of the matching headers; bytes are decoded as latin-1, binary gRPC metadata is skipped."""
        found: dict[str, str] = {}
        for name, value in headers:
            if isinstance(name, bytes):
                name = name.decode("latin-1")
            if isinstance(value, bytes):
                if name.endswith("-bin"):
                    continue
                value = value.decode("latin-1")
            if self.matches(name):
                found[name] = value
        return found

    def apply(self, headers: Iterable[tuple[Any, Any]], parameters: dict[str, Any]) -> None:
        """Add the forwarded headers to a request's parameters (existing keys win)."""
        for name, value in self.forwarded(headers).items():
            parameters.setdefault(name, value)


def header_forwarder(pattern: str) -> HeaderForwarder | None:
    return HeaderForwarder(pattern) if pattern else None


# ---------------------------------------------------------------- model names


def http_model_name(raw_path: bytes) -> str | None:
    """The (percent-decoded) model segment of a v2 model or repository path, or None for other paths.

    Taken from the raw path so an encoded '/' (%2F) is seen before routing hides it as a 404.
    """
    parts = raw_path.split(b"/")
    if len(parts) < 4 or parts[0] or parts[1] != b"v2":
        return None
    index: int | None = None
    if parts[2] == b"models":
        index = None if (len(parts) == 4 and parts[3] == b"stats") else 3
    elif parts[2] == b"repository":
        if parts[3] == b"models":
            index = 4
        elif len(parts) > 5 and parts[4] == b"models":
            index = 5
    if index is None or index >= len(parts):
        return None
    return unquote(parts[index].decode("ascii", "replace"))


# gRPC RPCs whose `name` / `model_name` field names a model (shared-memory RPCs name regions).
GRPC_MODEL_NAME_FIELDS = {
    "ModelReady": "name",
    "ModelMetadata": "name",
    "ModelConfig": "name",
    "ModelStatistics": "name",
    "ModelInfer": "model_name",
    "RepositoryModelLoad": "model_name",
    "RepositoryModelUnload": "model_name",
    "TraceSetting": "model_name",
}


def metadata_value(metadata: Iterable[tuple[str, Any]] | Mapping[str, Any] | None, key: str) -> str | None:
    """The first value of a (lower-case) metadata key, as text."""
    if metadata is None:
        return None
    items = metadata.items() if isinstance(metadata, Mapping) else metadata
    for name, value in items:
        if name.lower() == key:
            return value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return None
