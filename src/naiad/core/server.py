"""The Server: owns the state (models, regions, metrics, settings), starts and stops, and exposes the facade.

Frontends and embedding programs use its four interfaces (`core/facade.py`): `inference`,
`control`, `info` and `shared_memory`. The methods below them (`infer`, `infer_async`,
`repository_index`, ...) are the in-process API: thin delegations kept for programs and tests
that call the Server directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from functools import partial
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.registry import BackendRegistry
from naiad.config.server_config import ServerConfig
from naiad.core.facade import InferenceAPI, ModelControlAPI, ServerInfoAPI, SharedMemoryAPI, StreamItem
from naiad.core.idle_spin import IdleSpin
from naiad.core.inference_service import InferenceService
from naiad.core.model_control import ModelControlService
from naiad.core.model_lifecycle import ModelLifecycle
from naiad.core.response_cache import ResponseCache
from naiad.core.server_info import ServerInfoService, model_series
from naiad.core.server_observability import metrics_settings, residency_families
from naiad.core.serving_state import ServingState
from naiad.core.shared_memory_service import SharedMemoryService
from naiad.observability.custom_metrics import CustomMetrics
from naiad.observability.log_settings import LogSettings
from naiad.observability.metrics import MetricsCollector
from naiad.observability.tracing import Tracer, parse_trace_config
from naiad.protocol.datatypes import datatype_of_array
from naiad.protocol.types import InferenceRequest, InferenceResponse, InferInput, RequestedOutput
from naiad.runtime.shared_memory import SystemSharedMemoryRegistry
from naiad.scheduling.rate_limiter import RateLimiter

log = logging.getLogger("naiad.server")


class Server:
    """Serves a model repository; async methods run on the loop that called `startup()`."""

    def __init__(self, config: ServerConfig | None = None, *, model_repository: str | list[str] | None = None, **settings: Any) -> None:
        config = copy.deepcopy(config) if config is not None else ServerConfig()  # the caller's config stays as it was
        if model_repository is not None:
            config.model_repositories = [model_repository] if isinstance(model_repository, str) else list(model_repository)
        for key, value in settings.items():
            if not hasattr(config, key):
                raise TypeError(f"unknown server setting '{key}'")
            setattr(config, key, value)
        self.config = config
        self.state = ServingState()
        self.regions = SystemSharedMemoryRegistry(enabled=config.allow_client_shm)
        self.backends = BackendRegistry()
        self.rate_limiter = RateLimiter(config.rate_limit, config.rate_limit_resources)
        metrics_config = metrics_settings(config)
        self.models = ModelLifecycle(
            config, self.backends, services=self, rate_limiter=self.rate_limiter,
            summary_quantiles=metrics_config.summary_quantiles or None,
        )
        self.response_cache = ResponseCache(config.response_cache_bytes) if config.response_cache_bytes else None
        self.log_settings = LogSettings(
            log_file=config.log_file,
            log_info=config.log_info,
            log_warning=config.log_warning,
            log_error=config.log_error,
            log_verbose_level=config.log_verbose,
            log_format=config.log_format,
        )
        self.tracer = Tracer(parse_trace_config(config.trace_config))
        self.metrics = MetricsCollector(partial(model_series, self.models, self.response_cache), metrics_config)
        self.custom_metrics = CustomMetrics()  # families created by model code (pb_utils.MetricFamily)
        self.metrics.extra_families.append(lambda: residency_families(self.models.residency))
        self.metrics.extra_families.append(self.custom_metrics.families)
        # The facade (core/facade.py): what frontends and embedding programs use.
        self.inference: InferenceAPI = InferenceService(config, self.models, self.state, self.tracer, self.response_cache, self.regions)
        self.control: ModelControlAPI = ModelControlService(config, self.models, self.state)
        self.info: ServerInfoAPI = ServerInfoService(config, self.models, self.metrics, self.log_settings, self.tracer)
        self.shared_memory: SharedMemoryAPI = SharedMemoryService(self.regions)
        self._thread: threading.Thread | None = None
        self._poller: asyncio.Task[None] | None = None
        self._metrics_sampler: asyncio.Task[None] | None = None  # refreshes the per-interval gauges
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------ lifecycle (async)

    async def startup(self) -> None:
        """Load models per the control mode. Raises if a model failed and exit_on_error is set.

        Requests are served on the event loop this runs on."""
        state = self.state
        state.loop = loop = asyncio.get_running_loop()
        if self.config.idle_spin_us:
            state.idle_spin = IdleSpin(loop, lambda: state.inflight > 0, self.config.idle_spin_us * 1e-6)
        try:
            await loop.run_in_executor(None, self.models.catalog.check)
        except OSError as exc:
            raise RuntimeError(str(exc)) from None
        mode = self.config.model_control_mode
        if mode not in ("none", "poll", "explicit"):
            raise ValueError(f"unknown model control mode '{mode}' (none, poll or explicit)")
        if mode == "explicit":
            names = self.config.load_models
            if "*" in names:
                if len(names) > 1:
                    raise ValueError("--load-model=* must be the only --load-model")
                failures = await self.models.load_all()
            else:
                failures = await self.models.load_all(list(dict.fromkeys(names)))
        else:
            failures = await self.models.load_all()
        for failure in failures:
            log.error("%s", failure.rstrip())
        self.state.live = True
        if self.config.allow_metrics:
            self._metrics_sampler = asyncio.get_running_loop().create_task(self.metrics.sample_system())
        self.models.residency.start()
        if mode == "poll":
            if self.config.repository_poll_secs <= 0:
                raise ValueError("--repository-poll-secs must be > 0")
            self._poller = asyncio.get_running_loop().create_task(self._poll_repositories())
        if failures and self.config.exit_on_error:
            raise RuntimeError("failed to load all models:\n" + "".join(failures))

    async def _poll_repositories(self) -> None:
        while True:
            await asyncio.sleep(self.config.repository_poll_secs)
            try:
                await self.models.poll_once()
            except Exception:  # a polling error must not stop later polls
                log.exception("repository poll failed")

    def begin_shutdown(self) -> None:
        """Stop being ready and refuse new requests; in-flight ones may finish."""
        self.state.exiting = True

    async def shutdown(self, timeout: float | None = None) -> None:
        """Wait (up to the exit timeout) for in-flight requests, then unload every model."""
        self.begin_shutdown()
        if self._poller is not None:
            self._poller.cancel()
        if self._metrics_sampler is not None:
            self._metrics_sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._metrics_sampler
        timeout = self.config.exit_timeout_secs if timeout is None else timeout
        if self.state.inflight:
            await self._drain(timeout)
        await self.models.unload_all()
        self.regions.close()
        self.tracer.flush()
        self.state.live = False

    async def _drain(self, timeout: float) -> None:
        """Wait for the requests in flight, saying how many, for how long, and how it ended."""
        state = self.state
        count, started = state.inflight, time.monotonic()
        log.info("draining %d request(s) (up to %g s)", count, timeout)
        try:
            await asyncio.wait_for(state.wait_idle(), timeout)
        except TimeoutError:
            log.warning("exit timeout (%g s) reached with %d of %d request(s) still in flight: they are cancelled",
                        timeout, state.inflight, count)
        else:
            log.info("drained %d request(s) in %.1f s", count, time.monotonic() - started)

    @property
    def inflight_requests(self) -> int:
        """Requests accepted and not yet answered."""
        return self.state.inflight

    # ------------------------------------------------------------ in-process API: thin delegations to the facade
    # (also what backends and ensembles call back into: naiad.backends.base.ServerServices)

    def infer_async(self, request: InferenceRequest) -> Coroutine[Any, Any, InferenceResponse]:
        """`inference.infer`: one request, one response."""
        return self.inference.infer(request)

    def infer_stream(self, request: InferenceRequest, errors_inline: bool = False) -> AsyncIterator[StreamItem]:
        """`inference.stream`: every response of a request."""
        return self.inference.stream(request, errors_inline)

    def check_servable(self, name: str, version: str = "") -> None:
        self.inference.check_servable(name, version)

    def is_live(self) -> bool:
        return self.control.is_live()

    def is_ready(self) -> bool:
        return self.control.is_ready()

    def model_ready(self, name: str, version: str = "") -> bool:
        return self.control.model_ready(name, version)

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        return self.control.repository_index(ready_only)

    def unreadable_models(self) -> dict[str, str]:
        return self.control.unreadable_models()

    def load_model(self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None) -> Coroutine[Any, Any, None]:
        return self.control.load_model(name, config_json, files)

    def unload_model(self, name: str, unload_dependents: bool = False) -> Coroutine[Any, Any, None]:
        return self.control.unload_model(name, unload_dependents)

    def metadata(self) -> dict[str, Any]:
        return self.info.metadata()

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        return self.info.model_metadata(name, version)

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        return self.info.model_config(name, version)

    def model_config_dict(self, name: str, version: str = "") -> dict[str, Any]:
        return self.info.model_config_dict(name, version)

    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        return self.info.model_statistics(name, version)

    def get_log_settings(self) -> dict[str, Any]:
        return self.info.get_log_settings()

    def update_log_settings(self, changes: dict[str, Any]) -> dict[str, Any]:
        return self.info.update_log_settings(changes)

    def get_trace_settings(self, model: str = "") -> dict[str, Any]:
        return self.info.get_trace_settings(model)

    def update_trace_settings(self, model: str, changes: dict[str, Any]) -> dict[str, Any]:
        return self.info.update_trace_settings(model, changes)

    # ------------------------------------------------------------ in-process, synchronous API

    def start(self) -> Server:
        """Start on a private event-loop thread, for notebooks and tests without sockets."""
        if self._thread is not None:
            return self
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.startup())
            except BaseException as exc:  # reported to the caller of start()
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="naiad-server", daemon=True)
        self._thread.start()
        ready.wait()
        if errors:
            self._thread = None
            raise errors[0]
        return self

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self.shutdown(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._thread = None

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def infer(
        self,
        model_name: str,
        inputs: dict[str, np.ndarray],
        *,
        model_version: str = "",
        outputs: list[str] | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> dict[str, np.ndarray]:
        """Synchronous inference on a server started with start(): numpy in, numpy out."""
        if self._loop is None:
            raise RuntimeError("call Server.start() (or use `with Server(...)`) before infer()")
        request = InferenceRequest(
            model_name=model_name,
            model_version=model_version,
            inputs=[
                InferInput(name, datatype_of_array(np.asarray(a)), tuple(np.asarray(a).shape), _normalise(np.asarray(a)))
                for name, a in inputs.items()
            ],
            outputs=[RequestedOutput(n) for n in outputs or []],
            parameters=dict(parameters or {}),
        )
        future = asyncio.run_coroutine_threadsafe(self.inference.infer(request), self._loop)
        response = future.result()
        return {out.name: out.data for out in response.outputs if out.data is not None}


def _normalise(array: np.ndarray) -> np.ndarray:
    """str/bytes numpy arrays become object arrays of bytes, as BYTES tensors are held."""
    if array.dtype.kind in ("U", "S"):
        flat = [x.encode("utf-8") if isinstance(x, str) else bytes(x) for x in array.ravel()]
        result = np.empty(len(flat), dtype=np.object_)
        result[:] = flat
        return result.reshape(array.shape)
    return array
