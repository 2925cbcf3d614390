"""Mistakes caught before any model loads: a model directory given as the repository, ports already taken."""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from naiad.config.completion import DEFAULT_FILENAMES, PLATFORM_FILENAMES
from naiad.config.server_config import ServerConfig


class StartupError(Exception):
    """A setting that cannot work; the message says what to do instead."""


@dataclass(frozen=True)
class Listener:
    """One endpoint the server will open: the flags that set it and where it binds."""

    key: str  # the name in the NAIAD_READY line, e.g. "http_port"
    label: str  # Triton's name for the service, e.g. "HTTPService"
    port_flag: str
    address_flag: str
    host: str
    port: int


def listeners(config: ServerConfig) -> list[Listener]:
    """The endpoints this configuration opens, in start order."""
    candidates = [
        (config.allow_http, Listener("http_port", "HTTPService", "--http-port", "--http-address",
                                     config.http_address, config.http_port)),
        (config.allow_grpc, Listener("grpc_port", "GRPCInferenceService", "--grpc-port", "--grpc-address",
                                     config.grpc_address, config.grpc_port)),
        (config.allow_metrics, Listener("metrics_port", "Metrics Service", "--metrics-port", "--metrics-address",
                                        config.metrics_address, config.metrics_port)),
        (config.allow_sagemaker, Listener("sagemaker_port", "Sagemaker HTTPService", "--sagemaker-port",
                                          "--http-address", config.http_address, config.sagemaker_port)),
        (config.allow_vertex_ai, Listener("vertex_ai_port", "Vertex AI HTTPService", "--vertex-ai-port",
                                          "--http-address", config.http_address, config.vertex_ai_port)),
        (config.openai_port is not None, Listener("openai_port", "OpenAI HTTPService", "--openai-port",
                                                  "--http-address", config.http_address, config.openai_port or 0)),
    ]
    return [listener for enabled, listener in candidates if enabled]


def _model_directory_signs(path: Path) -> list[str]:
    """What makes `path` look like one model's directory rather than a repository of them."""
    signs = []
    if (path / "config.pbtxt").is_file():
        signs.append("config.pbtxt")
    try:
        versions = sorted(e.name for e in os.scandir(path) if e.is_dir() and e.name.isdigit())
    except OSError:
        versions = []
    if versions:
        signs.append("version folder" + ("s " if len(versions) > 1 else " ") + ", ".join(versions[:3]))
    return signs


def _model_files(path: Path) -> list[str]:
    """Model files Triton looks for in a version directory (model.onnx, model.py, ...) found directly in `path`."""
    names = set(DEFAULT_FILENAMES.values()) | set(PLATFORM_FILENAMES.values())
    return sorted(name for name in names if (path / name).exists())


def _check_local(text: str, path: Path) -> str | None:
    """Raise for a path that cannot be a repository; a warning for one that holds no model."""
    if not path.exists():
        where = "" if path.is_absolute() else f" (relative to the current directory, {os.getcwd()})"
        raise StartupError(f"--model-repository {text}: unable to read model repository '{text}': "
                           f"no such directory{where}")
    if not path.is_dir():
        raise StartupError(f"--model-repository {text} is a file: pass the directory that holds your model directories")
    signs = _model_directory_signs(path)
    if signs:
        parent = os.path.dirname(os.path.normpath(str(path))) or "."
        raise StartupError(
            f"--model-repository {text} is a model directory (it contains {' and '.join(signs)}), not a "
            f"model repository: pass the directory that holds your model directories, e.g. "
            f"--model-repository {parent}")
    files = _model_files(path)
    if files:
        repository = os.path.dirname(os.path.dirname(os.path.normpath(os.path.abspath(path))))
        raise StartupError(
            f"--model-repository {text} is a model version directory (it contains {', '.join(files)}): the layout "
            f"is <repository>/<model>/<version>/{files[0]}, so pass the repository, e.g. --model-repository {repository}")
    try:
        has_model = any(e.is_dir() and not e.name.startswith(".") for e in os.scandir(path))
    except OSError:
        return None  # the server's own check says why it cannot be read
    if not has_model:
        return (f"model repository '{text}' has no model directories: "
                "expected <repository>/<model>/config.pbtxt and <repository>/<model>/1/<model file>")
    return None


def check_repositories(paths: list[str]) -> list[str]:
    """Refuse what cannot be a repository (missing, a model or version directory); returns warnings."""
    warnings = []
    for text in paths:
        if "://" in text and not text.startswith("file://"):
            continue  # object storage is listed when the server starts
        warning = _check_local(text, Path(text[len("file://"):] if text.startswith("file://") else text))
        if warning:
            warnings.append(warning)
    return warnings


def _probe(host: str, port: int) -> None:
    """Bind (as the frontends will, SO_REUSEADDR) and release at once; raises OSError when that fails."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, socktype, proto, _, address = infos[0]
    with socket.socket(family, socktype, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)


def check_ports(config: ServerConfig) -> None:
    """Every endpoint's port must be free (and distinct) before models load: loading can take minutes."""
    taken: dict[int, Listener] = {}
    for listener in listeners(config):
        if listener.port == 0:
            continue  # any free port
        same = taken.get(listener.port)
        if same is not None:
            raise StartupError(f"{listener.port_flag} {listener.port} is also {same.port_flag}: "
                               "give each endpoint its own port")
        taken[listener.port] = listener
        try:
            _probe(listener.host, listener.port)
        except socket.gaierror as exc:
            raise StartupError(f"{listener.address_flag} {listener.host} is not an address: {exc.strerror}") from None
        except OSError as exc:
            raise StartupError(describe_bind_error(listener, exc)) from None


def describe_bind_error(listener: Listener, exc: OSError) -> str:
    """A failed bind in terms of the flags that chose the address."""
    if exc.errno == errno.EADDRINUSE:
        return (f"{listener.port_flag} {listener.port} is in use by another process: stop that process or choose "
                f"another port ({listener.port_flag} 0 picks a free one)")
    if exc.errno == errno.EACCES:
        return f"{listener.port_flag} {listener.port}: permission denied (ports below 1024 need privileges)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{listener.address_flag} {listener.host} is not an address of this host: use 0.0.0.0 or 127.0.0.1"
    return f"{listener.port_flag} {listener.port} on {listener.address_flag} {listener.host}: {exc.strerror or exc}"
