"""Naiad: a Python inference server for Triton model repositories (KServe v2 over HTTP and gRPC)."""

from __future__ import annotations

__version__ = "0.1.0"

from naiad.config.server_config import ServerConfig  # noqa: E402
from naiad.core.server import Server  # noqa: E402
from naiad.protocol.errors import ErrorCode, NaiadError  # noqa: E402

__all__ = ["Server", "ServerConfig", "NaiadError", "ErrorCode", "__version__"]
