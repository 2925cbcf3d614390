"""SageMaker mode (--allow-sagemaker): /ping, /invocations and the multi-model endpoint routes under /models.

Routes, as Triton's SageMaker server has them:
  GET    /ping                  200 when ready (SAGEMAKER_TRITON_PING_MODE=live: when live), else 400
  POST   /invocations           v2 infer on the default model (SAGEMAKER_TRITON_DEFAULT_MODEL_NAME);
                                SAGEMAKER_TRITON_INFERENCE_TYPE=generate|generate_stream uses the generate extension
  GET    /models                {"models": [{"modelName", "modelUrl"}]} of the models loaded through POST /models
  POST   /models                load {"model_name": <name>, "url": <dir>}; 409 if already loaded
  GET    /models/<name>         {"modelName", "modelUrl"}, 404 if not loaded here
  DELETE /models/<name>         unload (with dependents), 404 if not loaded here
  POST   /models/<name>/invoke  v2 infer on that model
  anything else                 400
Binary tensors travel with Content-Type `application/vnd.sagemaker-triton.binary+json;json-header-size=<N>`.
The header X-Amzn-SageMaker-Target-Model, when sent, names the model that load and invoke act on.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format

from naiad.config.model_config import ConfigError, parse_config_text
from naiad.frontends.cloud_common import (
    CloudInfer,
    error,
    health_reply,
    read_json_object,
    reply,
)
from naiad.frontends.http.body import Receive
from naiad.frontends.http.errors import (
    ClientDisconnected,
    HttpError,
    status_and_message,
)
from naiad.frontends.http.generate import GenerateHandler
from naiad.frontends.http.guard import HttpGuard, header_value
from naiad.frontends.http.listener import HttpListener
from naiad.frontends.http.responses import Reply, Send, empty_reply, json_reply
from naiad.frontends.security import check_model_name, header_forwarder
from naiad.protocol.errors import ErrorCode, NaiadError, invalid_arg

if TYPE_CHECKING:
    from naiad.core.facade import ServerAPI

BINARY_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="
TARGET_MODEL_HEADER = "x-amzn-sagemaker-target-model"
# A route's handler gets the match of its path pattern (the model name of /models/<name>...).
Handler = Callable[[dict[str, Any], Receive, Send, re.Match[str]], Awaitable[None]]
KEEP_FILE = ".naiad-keep"
_FORBIDDEN_ROOTS = ("/dev/", "/proc/", "/sys/")
_OUT_OF_MEMORY = (
    "CUDA out of memory", "CUDA_OUT_OF_MEMORY", "Out of memory", "Out Of Memory", "out of memory",
    "MemoryError", "OutOfMemory", "OOM", "Failed to allocate memory", "failed to allocate memory",
    "No space left on device",
)


def out_of_memory(message: str) -> bool:
    return any(marker in message for marker in _OUT_OF_MEMORY)


class SageMakerInfer(CloudInfer):
    def error_status(self, exc: Exception) -> tuple[int, str]:
        status, message = status_and_message(exc)
        return (507 if out_of_memory(message) else status), message


# ---------------------------------------------------------------- multi-model endpoint loading


@dataclass
class LoadedArchive:
    """A model loaded through POST /models: its SageMaker name, URL and the Naiad models it created."""

    url: str
    target: str  # the model invocations run on
    dependencies: list[str] = field(default_factory=list)  # composing models loaded before an ensemble


def _is_ensemble(model_dir: Path) -> bool:
    config = model_dir / "config.pbtxt"
    return config.is_file() and re.search(r'platform:\s*"ensemble"', config.read_text(errors="replace")) is not None


def plan_archive(url: str) -> tuple[Path, list[Path]]:
    """(target model directory, dependency model directories) of an unpacked SageMaker model archive.

    A config.pbtxt at the root makes the root the model; otherwise the one model directory inside,
    or, with several, the ensemble among them (the others are its composing models).
    """
    root = Path(url)
    lexical, real = os.path.normpath(os.path.abspath(url)), os.path.realpath(url)  # `..` and symlinks both count
    if any((path + "/").startswith(bad) for path in (lexical, real) for bad in _FORBIDDEN_ROOTS):
        raise invalid_arg(f"Invalid URL: {url}. \"url\" property value cannot start with /dev/, /proc/, or /sys/.")
    if not root.is_dir():
        raise invalid_arg(f"failed to load model from '{url}': not a directory")
    if (root / "config.pbtxt").is_file():
        return root, []
    subdirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not subdirs:
        raise invalid_arg(f"failed to load model from '{url}': no model directory found")
    if len(subdirs) == 1:
        return subdirs[0], []
    ensembles = [d for d in subdirs if _is_ensemble(d)]
    if len(ensembles) != 1:
        raise invalid_arg(
            f"failed to load model from '{url}': {len(subdirs)} model directories and "
            f"{len(ensembles)} ensembles among them (expected exactly one ensemble)"
        )
    return ensembles[0], [d for d in subdirs if d != ensembles[0]]


def read_model_directory(model_dir: Path, name: str) -> tuple[str, dict[str, bytes]]:
    """(config JSON named `name`, {"file:<relative path>": bytes}) for a load through the facade."""
    config_path = model_dir / "config.pbtxt"
    try:
        if config_path.is_file():
            config = parse_config_text(config_path.read_text(encoding="utf-8"), str(config_path))
            config.name = name
            config_json = json_format.MessageToJson(config)
        else:
            config_json = json_format.MessageToJson(parse_config_text(f'name: "{name}"', "generated"))
    except ConfigError as exc:
        raise invalid_arg(str(exc)) from None
    files: dict[str, bytes] = {}
    for path in sorted(model_dir.rglob("*")):
        if path.is_file() and path != config_path:
            files["file:" + path.relative_to(model_dir).as_posix()] = path.read_bytes()
        elif path.is_dir() and path.parent == model_dir and path.name.isdigit() and not any(path.iterdir()):
            # an empty version directory (an ensemble's) only exists in an override through a file in it
            files[f"file:{path.name}/{KEEP_FILE}"] = b""
    if not files:
        raise invalid_arg(f"failed to load model from '{model_dir}': the directory holds no model files")
    return config_json, files


class SageMakerApp:
    """ASGI app of the SageMaker port."""

    def __init__(self, server: ServerAPI) -> None:
        self.server = server
        config = server.config
        self.guard = HttpGuard(config.http_restricted_api)
        self.infer = SageMakerInfer(server, BINARY_MIME)
        self.generate = GenerateHandler(server)
        self.infer.forward_headers = self.generate.forward_headers = header_forwarder(config.http_header_forward_pattern)
        self.archives: dict[str, LoadedArchive] = {}
        self._archive_lock = asyncio.Lock()
        # The route table, as the module docstring lists it: (method, or None for any: the handler
        # answers another one 405; the whole path; handler). The first match answers; no match is a 400.
        self.routes: tuple[tuple[str | None, re.Pattern[str], Handler], ...] = (
            (None, re.compile(r"/invocations"), self._invocations),
            (None, re.compile(r"/ping"), self._ping),
            ("GET", re.compile(r"/models/?"), self._list),
            ("POST", re.compile(r"/models/?"), self._load_archive),
            ("GET", re.compile(r"/models/([^/]+)"), self._describe),
            ("DELETE", re.compile(r"/models/([^/]+)"), self._unload_archive),
            ("POST", re.compile(r"/models/([^/]+)/invoke"), self._invoke),
        )

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        try:
            for allowed, pattern, handler in self.routes:
                if allowed is None or allowed == method:
                    match = pattern.fullmatch(path)
                    if match is not None:
                        await handler(scope, receive, send, match)
                        return
            await error(send, 400, f"unknown SageMaker route: {method} {path}", scope)
        except ClientDisconnected:
            return
        except (NaiadError, HttpError) as exc:
            status, message = status_and_message(exc)
            if isinstance(exc, NaiadError) and out_of_memory(message):
                status = 507
            await error(send, status, message, scope)

    async def _ping(self, scope: dict[str, Any], receive: Receive, send: Send, match: re.Match[str]) -> None:
        if await self.guard.refuse(scope, send, "health"):
            return
        if scope["method"] != "GET":
            await error(send, 405, "Method Not Allowed", scope)
            return
        await reply(send, health_reply(self.server, self.server.config.sagemaker_ping_mode), scope)

    def default_model(self) -> str:
        """SAGEMAKER_TRITON_DEFAULT_MODEL_NAME, else the one model that is ready."""
        configured = self.server.config.sagemaker_default_model
        if configured:
            return configured
        names = sorted({entry["name"] for entry in self.server.control.repository_index(ready_only=True)})
        if len(names) != 1:
            raise invalid_arg(
                "no default model for /invocations: set SAGEMAKER_TRITON_DEFAULT_MODEL_NAME "
                f"({len(names)} models are ready: {', '.join(names) or 'none'})"
            )
        return names[0]

    async def _invocations(self, scope: dict[str, Any], receive: Receive, send: Send, match: re.Match[str]) -> None:
        if await self.guard.refuse(scope, send, "inference"):
            return
        if scope["method"] != "POST":
            await error(send, 405, "Method Not Allowed", scope)
            return
        model = self.default_model()
        kind = self.server.config.sagemaker_inference_type
        if kind == "infer":
            await self.infer.handle(scope, receive, send, model, "")
        else:
            await self.generate.handle(scope, receive, send, model, "", kind == "generate_stream")

    async def _invoke(self, scope: dict[str, Any], receive: Receive, send: Send, match: re.Match[str]) -> None:
        name = match[1]
        check_model_name(name)
        if await self.guard.refuse(scope, send, "inference"):
            return
        archive = self.archives.get(name)
        if archive is None:
            await error(send, 404, f"model '{name}' is not loaded", scope)
            return
        target = header_value(scope, TARGET_MODEL_HEADER) or archive.target
        await self.infer.handle(scope, receive, send, target, "")

    async def _list(self, scope: dict[str, Any], receive: Receive, send: Send, match: re.Match[str]) -> None:
        if not await self.guard.refuse(scope, send, "model-repository"):
            await reply(send, self._get(""), scope)

    async def _describe(self, scope: dict[str, Any], receive: Receive, send: Send, match: re.Match[str]) -> None:
        name = match[1]
        check_model_name(name)
        if not await self.guard.refuse(scope, send, "model-repository"):
            await reply(send, self._get(name), scope)

    async def _load_archive(self, scope: dict[str, Any], receive: Receive, send: Send, match: re.Match[str]) -> None:
        if not await self.guard.refuse(scope, send, "model-repository"):
            await reply(send, await self._load(scope, receive), scope)

    async def _unload_archive(self, scope: dict[str, Any], receive: Receive, send: Send, match: re.Match[str]) -> None:
        name = match[1]
        check_model_name(name)
        if not await self.guard.refuse(scope, send, "model-repository"):
            await reply(send, await self._unload(name), scope)

    def _get(self, name: str) -> Reply:
        if not name:
            models = []
            for hashed, archive in sorted(self.archives.items()):
                try:
                    ready = self.server.control.model_ready(archive.target)
                except NaiadError:
                    ready = False
                if ready:
                    models.append({"modelName": hashed, "modelUrl": archive.url})
            return json_reply({"models": models})
        archive = self.archives.get(name)
        if archive is None:
            return json_reply({"error": f"model '{name}' is not loaded"}, 404)
        return json_reply({"modelName": name, "modelUrl": archive.url})

    async def _load(self, scope: dict[str, Any], receive: Receive) -> Reply:
        doc = await read_json_object(scope, receive, self.server)
        name, url = doc.get("model_name", ""), doc.get("url", "")
        if not isinstance(name, str) or not name or not isinstance(url, str) or not url:
            raise invalid_arg("load request must give 'model_name' and 'url' strings")
        target = header_value(scope, TARGET_MODEL_HEADER) or name
        for value in (name, target):
            check_model_name(value)
        async with self._archive_lock:
            if name in self.archives or any(a.target == target for a in self.archives.values()):
                return json_reply({"error": f"model '{name}' is already loaded"}, 409)
            loop = asyncio.get_running_loop()
            target_dir, dependency_dirs = await loop.run_in_executor(None, plan_archive, url)
            archive = LoadedArchive(url=url, target=target)
            try:
                for directory in dependency_dirs:
                    check_model_name(directory.name)
                    await self._load_directory(directory, directory.name)
                    archive.dependencies.append(directory.name)
                await self._load_directory(target_dir, target)
            except NaiadError:
                await self._unload_quietly(archive.dependencies)
                raise
            self.archives[name] = archive
        return empty_reply(200)

    async def _load_directory(self, directory: Path, name: str) -> None:
        loop = asyncio.get_running_loop()
        config_json, files = await loop.run_in_executor(None, read_model_directory, directory, name)
        try:
            await self.server.control.load_model(name, config_json=config_json, files=files)
        except NaiadError as exc:
            # The repository API answers an unreadable model 500 (Triton's poll failure); for SageMaker the
            # archive is the client's: a load failure is a 400 (507 when memory ran out, in error_status).
            if exc.code is ErrorCode.INTERNAL:
                raise invalid_arg(exc.message) from None
            raise

    async def _unload_quietly(self, names: list[str]) -> None:
        for name in reversed(names):
            try:
                await self.server.control.unload_model(name)
            except NaiadError:
                pass

    async def _unload(self, name: str) -> Reply:
        async with self._archive_lock:
            archive = self.archives.get(name)
            if archive is None:
                return json_reply({"error": f"model '{name}' is not loaded"}, 404)
            try:
                await self.server.control.unload_model(archive.target, unload_dependents=True)
            except NaiadError as exc:
                if exc.code != ErrorCode.NOT_FOUND:
                    raise
            await self._unload_quietly(archive.dependencies)
            del self.archives[name]
        return empty_reply(200)


class SageMakerFrontend:
    """The SageMaker listener (port --sagemaker-port, address --http-address)."""

    def __init__(self, server: ServerAPI, host: str, port: int) -> None:
        self.app = SageMakerApp(server)
        self._listener = HttpListener.for_server(self.app, server.config, host, port, "naiad-sagemaker")

    async def start(self) -> int:
        return await self._listener.start()

    async def stop(self) -> None:
        await self._listener.stop()
