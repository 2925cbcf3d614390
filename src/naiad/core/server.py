"""The Server facade: the only object frontends (and embedding programs) use, like Triton's C API."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad import __version__
from naiad.backends.base import BackendResponse
from naiad.backends.registry import BackendRegistry
from naiad.config.model_config import config_to_dict
from naiad.config.server_config import ServerConfig
from naiad.core.model_lifecycle import ModelLifecycle
from naiad.core.model_version import ModelVersion
from naiad.core.request_validation import validate_request
from naiad.core.response_builder import build_response
from naiad.core.response_cache import ResponseCache, cache_key
from naiad.core.server_observability import (
    failure_reason,
    metrics_settings,
    residency_families,
    start_trace,
)
from naiad.observability.custom_metrics import CustomMetrics
from naiad.observability.log_settings import LogSettings
from naiad.observability.metrics import MetricsCollector, ModelSeries
from naiad.observability.tracing import Tracer, parse_trace_config
from naiad.protocol.datatypes import datatype_of_array
from naiad.protocol.errors import (
    DecoupledModelError,
    ErrorCode,
    NaiadError,
    internal,
    invalid_arg,
    unavailable,
    unsupported,
)
from naiad.protocol.model_versions import parse_model_version
from naiad.protocol.types import InferenceRequest, InferenceResponse, InferInput, RequestedOutput
from naiad.runtime.shared_memory import SystemSharedMemoryRegistry
from naiad.scheduling.base import WorkItem
from naiad.scheduling.rate_limiter import RateLimiter

log = logging.getLogger("naiad.server")

EXTENSIONS = [
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
]


def _stream_refused(item: WorkItem, task: asyncio.Task[BackendResponse]) -> None:
    """A scheduler that refuses a request raises from enqueue: a streaming caller reads that error from its stream."""
    if task.cancelled() or item.future.done():
        return
    exc = task.exception()
    if exc is not None:
        item.fail(exc if isinstance(exc, NaiadError) else internal(str(exc) or type(exc).__name__))


class Server:
    """Serves a model repository; async methods run on the loop that called `startup()`."""

    def __init__(self, config: ServerConfig | None = None, *, model_repository: str | list[str] | None = None, **settings: Any) -> None:
        config = config or ServerConfig()
        if model_repository is not None:
            config.model_repositories = [model_repository] if isinstance(model_repository, str) else list(model_repository)
        for key, value in settings.items():
            if not hasattr(config, key):
                raise TypeError(f"unknown server setting '{key}'")
            setattr(config, key, value)
        self.config = config
        self.shared_memory = SystemSharedMemoryRegistry(enabled=config.allow_client_shm)
        self.backends = BackendRegistry()
        self.rate_limiter = RateLimiter(config.rate_limit, config.rate_limit_resources)
        self.models = ModelLifecycle(config, self.backends, services=self, rate_limiter=self.rate_limiter)
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
        metrics_config = metrics_settings(config)
        self.summary_quantiles = metrics_config.summary_quantiles or None  # read by each ModelVersion's statistics
        self.metrics = MetricsCollector(self._model_series, metrics_config)
        self.custom_metrics = CustomMetrics()  # families created by model code (pb_utils.MetricFamily)
        self.metrics.extra_families.append(lambda: residency_families(self.models.residency))
        self.metrics.extra_families.append(self.custom_metrics.families)
        self._live = False
        self._exiting = False
        self._inflight = 0
        self._idle = asyncio.Event()
        self._thread: threading.Thread | None = None
        self._poller: asyncio.Task[None] | None = None
        self._metrics_sampler: asyncio.Task[None] | None = None  # refreshes the per-interval gauges
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------ lifecycle (async)

    async def startup(self) -> None:
        """Load models per the control mode. Raises if a model failed and exit_on_error is set."""
        self._idle.set()
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.models.catalog.check)
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
        self._live = True
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
        self._exiting = True

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
        if self._inflight:
            await self._drain(timeout)
        await self.models.unload_all()
        self.shared_memory.close()
        self.tracer.flush()
        self._live = False

    async def _drain(self, timeout: float) -> None:
        """Wait for the requests in flight, saying how many, for how long, and how it ended."""
        count, started = self._inflight, time.monotonic()
        log.info("draining %d request(s) (up to %g s)", count, timeout)
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            log.warning("exit timeout (%g s) reached with %d of %d request(s) still in flight: they are cancelled",
                        timeout, self._inflight, count)
        else:
            log.info("drained %d request(s) in %.1f s", count, time.monotonic() - started)

    @property
    def inflight_requests(self) -> int:
        """Requests accepted and not yet answered."""
        return self._inflight

    # ------------------------------------------------------------ health and metadata

    def is_live(self) -> bool:
        return self._live

    def is_ready(self) -> bool:
        if not self._live or self._exiting:
            return False
        return self.models.all_ready() if self.config.strict_readiness else True

    def metadata(self) -> dict[str, Any]:
        return {"name": self.config.server_id, "version": __version__, "extensions": list(EXTENSIONS)}

    def _check_serving(self) -> None:
        if self._exiting or not self._live:
            raise unavailable("Server not ready")

    def model_ready(self, name: str, version: str = "") -> bool:
        """True when servable; False when loaded but an instance is unhealthy; NOT_FOUND otherwise."""
        self._check_serving()
        return self.models.lookup(name, version).healthy()

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        return self.models.lookup(name, version).config

    def model_config_dict(self, name: str, version: str = "") -> dict[str, Any]:
        return config_to_dict(self.model_config(name, version))

    def is_decoupled(self, name: str, version: str = "") -> bool:
        return self.models.lookup(name, version).decoupled

    def apply_chat_template(self, name: str, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str | None:
        """The prompt a chat model's tokenizer template makes of `messages`; None when it has no template."""
        for instance in self.models.lookup(name).pool.instances:
            template: Callable[[list[dict[str, Any]], bool], str] | None = getattr(instance, "apply_chat_template", None)
            if template is not None:
                return template(messages, add_generation_prompt)
        return None

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        model = self.models.lookup(name, version)
        config = model.config
        batch = (-1,) if config.max_batch_size > 0 else ()
        if version:
            versions = [model.version_str]
        else:
            versions = [str(v) for v in sorted(self.models.records[name].ready())]
        return {
            "name": name,
            "versions": versions,
            "platform": config.platform or config.backend,
            "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(batch + t.dims)} for t in model.inputs.values()],
            "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(batch + t.dims)} for t in model.outputs.values()],
        }

    # ------------------------------------------------------------ inference

    async def infer_async(self, request: InferenceRequest) -> InferenceResponse:
        """One request, one response. Decoupled models are refused (use infer_stream)."""
        self._check_serving()
        model = await self._serving_version(request)
        if model.decoupled:
            raise DecoupledModelError(model.name)
        item = validate_request(model, request)
        item.request = request
        start = time.perf_counter_ns()
        if self.tracer.active:
            trace = start_trace(self.tracer, model, request, start)
            if trace is not None:
                response = None
                try:
                    response = await self._run_request(model, request, item, start)
                    return response
                finally:
                    trace.finish(request, item, start, time.perf_counter_ns(), response)
        return await self._run_request(model, request, item, start)

    async def _run_request(self, model: ModelVersion, request: InferenceRequest, item: WorkItem, start: int) -> InferenceResponse:
        key = None
        if self.response_cache is not None and model.config.response_cache.enable:
            key = cache_key(model.name, model.version_str, request.inputs)
            cached = self.response_cache.get(key)
            if cached is not None and set(item.output_names) <= cached.outputs.keys():
                response = build_response(model, request, cached.outputs, self.shared_memory)
                response.parameters = dict(cached.parameters)
                elapsed = time.perf_counter_ns() - start
                model.stats.record_cache(True, elapsed)
                model.stats.record_request(True, elapsed, 0)
                return response
        self._begin_request(model.name)
        try:
            result = await model.scheduler.enqueue(item)
            if result.error is not None:
                # the model answered with an error response: a success in Triton's statistics
                model.stats.record_request(True, time.perf_counter_ns() - start, max(item.dispatch_ns - item.enqueue_ns, 0))
                raise _AnsweredError(result.error)
            if result.outputs is None:
                raise internal(f"model '{model.name}' completed the request without a response")
            response = build_response(model, request, result.outputs, self.shared_memory)
            response.parameters = dict(result.parameters)
            if key is not None and self.response_cache is not None:
                insert_start = time.perf_counter_ns()
                self.response_cache.put(key, result.outputs, result.parameters)
                model.stats.record_cache(False, time.perf_counter_ns() - insert_start)
        except _AnsweredError as answered:
            raise answered.error from None
        except NaiadError as exc:
            model.stats.record_request(False, time.perf_counter_ns() - start, None, failure_reason(exc, model))
            raise
        except asyncio.CancelledError:
            # The caller gave up (gRPC cancel or deadline, HTTP client gone, shutdown): Triton's CANCELED.
            model.stats.record_request(False, time.perf_counter_ns() - start, None, "CANCELED")
            raise
        finally:
            self._end_request(model.name)
        elapsed = time.perf_counter_ns() - start
        model.stats.record_first_response(elapsed)
        model.stats.record_request(True, elapsed, max(item.dispatch_ns - item.enqueue_ns, 0))
        return response

    async def infer_stream(
        self, request: InferenceRequest, errors_inline: bool = False
    ) -> AsyncIterator[tuple[InferenceResponse | NaiadError | None, bool]]:
        """Every response of a request as (response, is_final); (None, True) is a flag-only final.

        Works for decoupled models (zero or more responses) and others (exactly one). An error
        response raises NaiadError and ends the stream, unless `errors_inline`: then it is yielded
        as (NaiadError, is_final) and later responses follow, as Triton streams them.
        """
        self._check_serving()
        model = await self._serving_version(request)
        item = validate_request(model, request)
        item.request = request
        item.stream = asyncio.Queue()
        start = time.perf_counter_ns()
        self._begin_request(model.name)
        enqueued = asyncio.get_running_loop().create_task(model.scheduler.enqueue(item))
        enqueued.add_done_callback(partial(_stream_refused, item))
        # The outcome is settled before the final response is yielded: a caller may stop iterating there.
        success = False
        reason = "BACKEND"
        first = True
        try:
            while True:
                result = await item.stream.get()
                if first:
                    model.stats.record_first_response(time.perf_counter_ns() - start)
                    first = False
                if result.error is not None:
                    reason = failure_reason(result.error, model)
                    if not errors_inline:
                        raise result.error
                    success = result.final and not result.counts_as_failure
                    yield result.error, result.final
                    if result.final:
                        return
                    continue
                if result.outputs is None:
                    success = True
                    yield None, True
                    return
                response = build_response(model, request, result.outputs, self.shared_memory)
                response.parameters = dict(result.parameters)
                success = result.final
                yield response, result.final
                if result.final:
                    return
        except (asyncio.CancelledError, GeneratorExit):
            # The caller stopped before the final response (stream cancelled, client gone): CANCELED.
            if not success:
                reason = "CANCELED"
            raise
        finally:
            if not enqueued.done():
                item.future.cancel()
                enqueued.cancel()
            with contextlib.suppress(BaseException):
                await enqueued
            self._end_request(model.name)
            queue_ns = max(item.dispatch_ns - item.enqueue_ns, 0) if item.dispatch_ns else None
            model.stats.record_request(success, time.perf_counter_ns() - start, queue_ns, reason)

    def check_servable(self, name: str, version: str = "") -> None:
        """Raise what infer_async would for a model (version) it cannot serve, before any request is
        decoded: Triton answers an unknown model with 404 whatever the body holds. A repository model
        that --load-on-demand would load passes."""
        self._check_serving()
        try:
            self.models.lookup(name, version)
        except NaiadError as exc:
            if not (self.config.load_on_demand and exc.code is ErrorCode.NOT_FOUND and name in self.models.scan()[0]):
                raise

    async def _serving_version(self, request: InferenceRequest) -> ModelVersion:
        """The version to run; with --load-on-demand an unloaded repository model is loaded first."""
        try:
            return self.models.lookup(request.model_name, request.model_version)
        except NaiadError as exc:
            if not (self.config.load_on_demand and exc.code is ErrorCode.NOT_FOUND):
                raise
            if request.model_name not in self.models.scan()[0]:
                raise
        # The load is a task of its own: a request that times out (or is cancelled) stops waiting
        # for it, but must not cancel a load other requests and the repository index depend on.
        # The hold keeps eviction off the model until this request runs on it (no await between).
        residency = self.models.residency
        residency.hold(request.model_name)
        try:
            load = asyncio.ensure_future(self.models.load(request.model_name))
            load.add_done_callback(lambda task: task.cancelled() or task.exception())
            try:
                await asyncio.wait_for(asyncio.shield(load), request.timeout_us / 1e6 if request.timeout_us else None)
            except TimeoutError:
                raise unavailable(f"model '{request.model_name}' did not finish loading within the request timeout") from None
            except NaiadError as exc:
                raise unavailable(f"model '{request.model_name}' failed to load on demand: {exc.message.strip()}") from None
            return self.models.lookup(request.model_name, request.model_version)
        finally:
            residency.release(request.model_name)

    def _begin_request(self, model_name: str) -> None:
        self._inflight += 1
        self._idle.clear()
        self.models.residency.begin_use(model_name)

    def _end_request(self, model_name: str) -> None:
        self.models.residency.end_use(model_name)
        self._inflight -= 1
        if self._inflight == 0:
            self._idle.set()

    # ------------------------------------------------------------ repository

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        return self.models.index(ready_only)

    def unreadable_models(self) -> dict[str, str]:
        """{model: reason} for models whose config.pbtxt could not be read (Triton's index leaves them out)."""
        return dict(self.models.unreadable)

    def _check_explicit(self) -> None:
        if self.config.model_control_mode != "explicit":
            raise unavailable("explicit model load / unload is not allowed if polling is enabled")

    async def load_model(self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None) -> None:
        self._check_explicit()
        await self.models.load(name, config_json, files)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self._check_explicit()
        await self.models.unload(name, unload_dependents)

    # ------------------------------------------------------------ statistics

    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        stats = []
        if not name:
            for _, each in sorted(self.models.records.items()):
                for _, loaded in sorted(each.ready().items()):
                    stats.append(loaded.stats.as_dict())
            return {"model_stats": stats}
        number = parse_model_version(version)
        record = self.models.records.get(name)
        ready = record.ready() if record is not None else {}
        if not ready:
            raise invalid_arg(f"requested model '{name}' is not available")
        if number is not None:
            model = ready.get(number)
            if model is None:
                raise invalid_arg(f"requested model version is not available for model '{name}'")
            return {"model_stats": [model.stats.as_dict()]}
        return {"model_stats": [m.stats.as_dict() for _, m in sorted(ready.items())]}

    def _model_series(self) -> list[ModelSeries]:
        return [
            ModelSeries(m.stats, m.scheduler.pending(), dict(m.config.metric_tags), m.config.response_cache.enable and self.response_cache is not None)
            for _, record in sorted(self.models.records.items())
            for _, m in sorted(record.ready().items())
        ]

    # ------------------------------------------------------------ logging extension

    def get_log_settings(self) -> dict[str, Any]:
        return self.log_settings.as_dict()

    def update_log_settings(self, changes: dict[str, Any]) -> dict[str, Any]:
        return self.log_settings.update(changes)

    # ------------------------------------------------------------ trace extension

    def get_trace_settings(self, model: str = "") -> dict[str, Any]:
        if model and model not in self.models.records:
            raise invalid_arg(f"Request for unknown model : {model}")
        return self.tracer.settings(model)

    def update_trace_settings(self, model: str, changes: dict[str, Any]) -> dict[str, Any]:
        if model and model not in self.models.records:
            raise invalid_arg(f"Request for unknown model : {model}")
        return self.tracer.update(model, changes)

    # ------------------------------------------------------------ CUDA shared memory (no GPU path)

    def cuda_shared_memory_status(self, name: str = "") -> list[dict[str, Any]]:
        if name:
            raise invalid_arg(f"Unable to find cuda shared memory region: '{name}'")
        return []

    def cuda_shared_memory_register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        raise unsupported("CUDA shared memory is not supported: this server has no CUDA device")

    def cuda_shared_memory_unregister(self, name: str = "") -> None:
        return None

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
        future = asyncio.run_coroutine_threadsafe(self.infer_async(request), self._loop)
        response = future.result()
        return {out.name: out.data for out in response.outputs if out.data is not None}


class _AnsweredError(Exception):
    """Carries a model's error response past the failure accounting (it already counted as a success)."""

    def __init__(self, error: NaiadError) -> None:
        super().__init__(error.message)
        self.error = error


def _normalise(array: np.ndarray) -> np.ndarray:
    """str/bytes numpy arrays become object arrays of bytes, as BYTES tensors are held."""
    if array.dtype.kind in ("U", "S"):
        flat = [x.encode("utf-8") if isinstance(x, str) else bytes(x) for x in array.ravel()]
        result = np.empty(len(flat), dtype=np.object_)
        result[:] = flat
        return result.reshape(array.shape)
    return array
