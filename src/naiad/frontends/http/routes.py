"""The route table: every path the HTTP/REST port answers, tried in this order by HttpApp.

1. fast entries: POST infer and generate, the paths every inference takes. Each is a substring
   test and one regex, so an inference does not try the Router's patterns one by one, and what a
   path led to is remembered, so the same few paths are matched once; a wrong method on their paths
   is a JSON 405 here.
2. mounts: whole sub-APIs by path prefix (/v1/ -> the OpenAI-compatible app).
3. the Router: every other v2 / Triton-extension path (wrong method -> JSON 405, unknown -> JSON 404).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.convertors import Convertor, register_url_convertor
from starlette.routing import Router

from naiad.frontends.http.body import Receive
from naiad.frontends.http.endpoint import Endpoint, Handler, JsonRoute, not_found
from naiad.frontends.http.generate import GenerateHandler
from naiad.frontends.http.handlers_model import ModelHandlers
from naiad.frontends.http.handlers_repository import RepositoryHandlers
from naiad.frontends.http.handlers_settings import SettingsHandlers
from naiad.frontends.http.handlers_shm import SharedMemoryHandlers
from naiad.frontends.http.infer_handler import InferHandler
from naiad.frontends.http.responses import Send

if TYPE_CHECKING:
    from naiad.core.facade import ServerAPI


class _VersionConvertor(Convertor[str]):
    """`/versions/<n>`: digits only (anything else does not match, hence 404), kept as a string."""

    regex = "[0-9]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return str(value)


register_url_convertor("naiad_version", _VersionConvertor())

_MODEL = "/v2/models/{model}"
_MODEL_VERSION = "/v2/models/{model}/versions/{version:naiad_version}"


AsgiApp = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]


FastHandler = Callable[..., Awaitable[None]]
Target = tuple[FastHandler, tuple[Any, ...]]  # awaited as handler(scope, receive, send, *arguments)

PATHS_KEPT = 1024  # paths whose fast target is remembered (then forgotten all at once)
PATH_CHARS_KEPT = 256  # longer paths are matched each time (the memory stays bounded)


@dataclass(frozen=True, slots=True)
class FastRoute:
    """POST on `pattern` awaits `handler(scope, receive, send, *arguments(match))`; `marker` is a
    substring every matching path holds, checked before the regex."""

    marker: str
    pattern: re.Pattern[str]
    handler: FastHandler
    arguments: Callable[[re.Match[str]], tuple[Any, ...]]


class FastRoutes:
    """The fast entries, and the target each path asked for so far led to (None: not a fast path)."""

    def __init__(self, routes: tuple[FastRoute, ...]) -> None:
        self.routes = routes
        self.known: dict[str, Target | None] = {}  # read directly by HttpApp, then `target` on a miss

    def target(self, path: str) -> Target | None:
        """The handler and its arguments for `path`, or None when no fast entry matches it."""
        found: Target | None = None
        for route in self.routes:
            if route.marker in path:
                match = route.pattern.fullmatch(path)
                if match is not None:
                    found = (route.handler, route.arguments(match))
                    break
        if len(path) <= PATH_CHARS_KEPT:
            if len(self.known) >= PATHS_KEPT:
                self.known.clear()
            self.known[path] = found
        return found


@dataclass(frozen=True)
class RouteTable:
    fast: FastRoutes
    mounts: tuple[tuple[str, AsgiApp], ...]
    router: Router


_VERSIONED = r"/v2/models/([^/]+)(?:/versions/([0-9]+))?"
# POST infer: groups (model, version or None). Also what a frontend worker answers itself (workers/worker_app.py).
INFER_PATH = re.compile(_VERSIONED + "/infer")


def build_routes(server: ServerAPI, infer: InferHandler, generate: GenerateHandler, openai: AsgiApp) -> RouteTable:
    """The HTTP/REST port's whole table (see the module docstring for the order)."""
    fast = FastRoutes((
        FastRoute("/infer", INFER_PATH, infer.handle,
                  lambda match: (match.group(1), match.group(2) or "")),
        FastRoute("/generate", re.compile(_VERSIONED + "/generate(_stream)?"), generate.handle,
                  lambda match: (match.group(1), match.group(2) or "", bool(match.group(3)))),
    ))
    return RouteTable(fast, (("/v1/", openai),), build_router(server))


def build_router(server: ServerAPI) -> Router:
    """The Router's routes; wrong method on a known path -> JSON 405, unknown path -> JSON 404."""
    models = ModelHandlers(server)
    repository = RepositoryHandlers(server)
    shm = SharedMemoryHandlers(server)
    settings = SettingsHandlers(server)

    def limit() -> int:
        return server.config.http_max_input_size

    def timeout() -> float:
        return server.config.http_body_timeout_secs

    routes: list[JsonRoute] = []

    def add(path: str, method: str | list[str], handler: Handler) -> None:
        methods = [method] if isinstance(method, str) else method
        routes.append(JsonRoute(path, Endpoint(handler, limit, timeout), methods=methods))

    def add_model(suffix: str, method: str, handler: Handler) -> None:
        for base in (_MODEL, _MODEL_VERSION):
            add(base + suffix, method, handler)

    add("/v2/health/live", "GET", models.live)
    add("/v2/health/ready", "GET", models.ready)
    add("/v2", "GET", models.server_metadata)
    add("/v2/models/stats", "GET", models.model_stats)
    add_model("", "GET", models.model_metadata)
    add_model("/ready", "GET", models.model_ready)
    add_model("/config", "GET", models.model_config)
    add_model("/stats", "GET", models.model_stats)
    add("/v2/logging", ["GET", "POST"], settings.logging)
    add("/v2/trace/setting", ["GET", "POST"], settings.trace)
    add(_MODEL + "/trace/setting", ["GET", "POST"], settings.trace)

    for prefix in ("/v2/repository", "/v2/repository/{repository}"):
        add(prefix + "/index", "POST", repository.index)
        add(prefix + "/models/{model}/load", "POST", repository.load)
        add(prefix + "/models/{model}/unload", "POST", repository.unload)

    for base, status, register, unregister in (
        ("/v2/systemsharedmemory", shm.system_status, shm.system_register, shm.system_unregister),
        ("/v2/cudasharedmemory", shm.cuda_status, shm.cuda_register, shm.cuda_unregister),
    ):
        for prefix in (base, base + "/region/{region}"):
            add(prefix + "/status", "GET", status)
            add(prefix + "/register", "POST", register)
            add(prefix + "/unregister", "POST", unregister)

    return Router(routes=routes, redirect_slashes=False, default=not_found)
