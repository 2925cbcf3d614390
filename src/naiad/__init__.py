"""Naiad: a Python inference server for Triton model repositories (KServe v2 over HTTP and gRPC)."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["Server", "ServerConfig", "NaiadError", "ErrorCode", "__version__"]

# Imported lazily so `naiad.tools` (and `naiad --help`) do not load the server internals.
_EXPORTS = {
    "Server": ("naiad.core.server", "Server"),
    "ServerConfig": ("naiad.config.server_config", "ServerConfig"),
    "NaiadError": ("naiad.protocol.errors", "NaiadError"),
    "ErrorCode": ("naiad.protocol.errors", "ErrorCode"),
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        module, attr = _EXPORTS[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'naiad' has no attribute {name!r}")
