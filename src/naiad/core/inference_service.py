"""The inference interface: one lookup (or a resolved handle), validation (shared-memory inputs read here), cache, scheduler, statistics."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from functools import partial

from naiad.backends.base import BackendResponse
from naiad.config.server_config import ServerConfig
from naiad.core.facade import ResolvedModel, StreamItem
from naiad.core.model_lifecycle import ModelLifecycle
from naiad.core.model_version import ModelVersion
from naiad.core.request_validation import validate_request
from naiad.core.resolved_model import ResolvedVersion
from naiad.core.response_builder import build_response
from naiad.core.response_cache import ResponseCache, cache_key
from naiad.core.server_observability import failure_reason, start_trace
from naiad.core.serving_state import ServingState
from naiad.observability.tracing import Tracer
from naiad.protocol.errors import DecoupledModelError, ErrorCode, NaiadError, internal, unavailable
from naiad.protocol.types import InferenceRequest, InferenceResponse
from naiad.runtime.shared_memory import SystemSharedMemoryRegistry
from naiad.scheduling.base import WorkItem


class InferenceService:
    """`InferenceAPI` over the Server's models, response cache, tracer and shared-memory regions."""

    def __init__(
        self, config: ServerConfig, models: ModelLifecycle, state: ServingState, tracer: Tracer,
        response_cache: ResponseCache | None, shared_memory: SystemSharedMemoryRegistry,
    ) -> None:
        self._config = config
        self._models = models
        self._state = state
        self._tracer = tracer
        self._cache = response_cache
        self._shm = shared_memory
        # Requests mark their model in use only where that can keep it from eviction.
        self._residency = models.residency if models.residency.active else None

    # ------------------------------------------------------------ one request, one response

    async def resolve(self, name: str, version: str = "") -> ResolvedModel:
        """The version a request on `name` would run on (loaded first with --load-on-demand)."""
        self._state.check_serving()
        return ResolvedVersion(await self._serving_version(name, version, 0))

    async def infer(self, request: InferenceRequest, resolved: ResolvedModel | None = None) -> InferenceResponse:
        """One request, one response. Decoupled models are refused (use stream)."""
        state = self._state
        if state.exiting or not state.live:
            raise unavailable("Server not ready")
        model = None if resolved is None else _current(resolved, request)
        if model is None:
            try:
                model = self._models.lookup(request.model_name, request.model_version)
            except NaiadError as exc:
                model = await self._load_on_demand(exc, request.model_name, request.model_version, request.timeout_us)
        if model.decoupled:
            raise DecoupledModelError(model.name)
        item = validate_request(model, request, self._shm, state.loop)
        start = item.enqueue_ns  # taken as the work item was made, just now: no second clock read
        tracer = self._tracer
        if not tracer.off and tracer.active:
            trace = start_trace(tracer, model, request, start)
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
        cache = self._cache
        if cache is not None and model.config.response_cache.enable:
            key = cache_key(model.name, model.version_str, request.inputs)
            cached = cache.get(key)
            if cached is not None and set(item.output_names) <= cached.outputs.keys():
                response = build_response(model, request, cached.outputs, self._shm)
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
            response = build_response(model, request, result.outputs, self._shm)
            if result.parameters:  # else the response's own empty dict stands
                response.parameters = dict(result.parameters)
            if key is not None and cache is not None:
                insert_start = time.perf_counter_ns()
                cache.put(key, result.outputs, result.parameters)
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
        model.stats.record_answered(time.perf_counter_ns() - start, max(item.dispatch_ns - item.enqueue_ns, 0))
        return response

    # ------------------------------------------------------------ any number of responses

    async def stream(self, request: InferenceRequest, errors_inline: bool = False,
                     resolved: ResolvedModel | None = None) -> AsyncIterator[StreamItem]:
        """Every response of a request as (response, is_final); (None, True) is a flag-only final.

        Works for decoupled models (zero or more responses) and others (exactly one). An error
        response raises NaiadError and ends the stream, unless `errors_inline`: then it is yielded
        as (NaiadError, is_final) and later responses follow, as Triton streams them.
        """
        self._state.check_serving()
        model = _current(resolved, request)
        if model is None:
            model = await self._serving_version(request.model_name, request.model_version, request.timeout_us)
        item = validate_request(model, request, self._shm, self._state.loop)
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
                response = build_response(model, request, result.outputs, self._shm)
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

    # ------------------------------------------------------------ what a frontend asks before or beside a request

    def check_servable(self, name: str, version: str = "") -> None:
        """Raise what infer would for a model (version) it cannot serve. A repository model that
        --load-on-demand would load passes."""
        self._state.check_serving()
        try:
            self._models.lookup(name, version)
        except NaiadError as exc:
            if not (self._config.load_on_demand and exc.code is ErrorCode.NOT_FOUND and name in self._models.scan()[0]):
                raise

    # ------------------------------------------------------------ the model a request runs on

    async def _serving_version(self, name: str, version: str, timeout_us: int) -> ModelVersion:
        """The version to run; with --load-on-demand an unloaded repository model is loaded first
        (waiting at most `timeout_us`, 0: as long as the load takes)."""
        try:
            return self._models.lookup(name, version)
        except NaiadError as exc:
            return await self._load_on_demand(exc, name, version, timeout_us)

    async def _load_on_demand(self, exc: NaiadError, name: str, version: str, timeout_us: int) -> ModelVersion:
        """What _serving_version does once the lookup failed with `exc`: load the model, or raise `exc`."""
        models = self._models
        if not (self._config.load_on_demand and exc.code is ErrorCode.NOT_FOUND and name in models.scan()[0]):
            raise exc
        # The load is a task of its own: a request that times out (or is cancelled) stops waiting
        # for it, but must not cancel a load other requests and the repository index depend on.
        # The hold keeps eviction off the model until this request runs on it (no await between).
        residency = models.residency
        residency.hold(name)
        try:
            load = asyncio.ensure_future(models.load(name))
            load.add_done_callback(lambda task: task.cancelled() or task.exception())
            # asyncio.wait, not wait_for: it never cancels the load, and it needs no current task
            # (frontends run a request's first steps outside one; wait_for needs one from 3.12 on).
            done, _ = await asyncio.wait({load}, timeout=timeout_us / 1e6 if timeout_us else None)
            if not done:
                raise unavailable(f"model '{name}' did not finish loading within the request timeout")
            try:
                load.result()
            except NaiadError as exc:
                raise unavailable(f"model '{name}' failed to load on demand: {exc.message.strip()}") from None
            return models.lookup(name, version)
        finally:
            residency.release(name)

    def _begin_request(self, model_name: str) -> None:
        self._state.inflight += 1
        if self._residency is not None:
            self._residency.begin_use(model_name)

    def _end_request(self, model_name: str) -> None:
        if self._residency is not None:
            self._residency.end_use(model_name)
        self._state.request_done()


def _current(resolved: ResolvedModel | None, request: InferenceRequest) -> ModelVersion | None:
    """The version a handle holds, if it still serves; None (no handle, or a retired version): look
    the request's model up."""
    if resolved is None:
        return None
    # the handle's version read here rather than through its `name` and `current()`: two calls fewer per request
    model = resolved.version_model if isinstance(resolved, ResolvedVersion) else None
    if model is None or model.name != request.model_name:
        raise internal(f"the model handle passed with a request for '{request.model_name}' was not resolved for it")
    return None if model.retired else model


def _stream_refused(item: WorkItem, task: asyncio.Task[BackendResponse]) -> None:
    """A scheduler that refuses a request raises from enqueue: a streaming caller reads that error from its stream."""
    if task.cancelled() or item.future.done():
        return
    exc = task.exception()
    if exc is not None:
        item.fail(exc if isinstance(exc, NaiadError) else internal(str(exc) or type(exc).__name__))


class _AnsweredError(Exception):
    """Carries a model's error response past the failure accounting (it already counted as a success)."""

    def __init__(self, error: NaiadError) -> None:
        super().__init__(error.message)
        self.error = error
