"""A loaded model version: its config tables, instances, scheduler and statistics."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import ChatTemplate, PoolInstance, ServerServices
from naiad.config.inline_settings import inline_settings
from naiad.config.model_config import datatype_name, scheduler_kind
from naiad.core.facade import TensorMetadata
from naiad.core.model_loader import instance_specs
from naiad.observability.statistics import (
    DEFAULT_FIRST_RESPONSE_BUCKETS_MS,
    ModelStatistics,
)
from naiad.protocol.datatypes import numpy_dtype
from naiad.runtime.thread_instance import InstancePool
from naiad.scheduling.base import Scheduler
from naiad.scheduling.direct import DirectScheduler
from naiad.scheduling.dynamic_batcher import DynamicBatcher
from naiad.scheduling.ensemble import EnsembleScheduler
from naiad.scheduling.execution_policy import InlinePolicy
from naiad.scheduling.rate_limiter import InstanceLimits, RateLimiter
from naiad.scheduling.sequence_batcher import SequenceBatcher

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TensorSpec:
    """A config input/output as the request path needs it."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None
    optional: bool = False
    labels: tuple[str, ...] = ()


def _reshape(tensor: mc.ModelInput | mc.ModelOutput) -> tuple[int, ...] | None:
    return tuple(tensor.reshape.shape) if tensor.HasField("reshape") else None


def _labels(model_dir: Path, filename: str) -> tuple[str, ...]:
    if not filename:
        return ()
    path = model_dir / filename
    try:
        return tuple(line.rstrip("\r\n") for line in path.read_text(encoding="utf-8").splitlines())
    except OSError as exc:
        raise ValueError(f"unable to read label file '{path}': {exc}") from None


def _first_response_buckets(config: mc.ModelConfig) -> tuple[float, ...]:
    """Per-model histogram buckets from model_metrics, else Triton's defaults."""
    for control in config.model_metrics.metric_control:
        if control.metric_identifier.family == "nv_inference_first_response_histogram_ms" and control.histogram_options.buckets:
            return tuple(control.histogram_options.buckets)
    return DEFAULT_FIRST_RESPONSE_BUCKETS_MS


def _chat_template(instances: Sequence[PoolInstance]) -> ChatTemplate | None:
    """The first instance's chat template, offered by the LLM backends (transformers, vLLM)."""
    for instance in instances:
        template = instance.chat_template()
        if template is not None:
            return template
    return None


class ModelVersion:
    """Everything needed to serve one version; created on the event loop after instances exist."""

    def __init__(
        self, config: mc.ModelConfig, version: int, model_dir: Path, instances: Sequence[PoolInstance], services: ServerServices | None = None,
        rate_limiter: RateLimiter | None = None, summary_quantiles: tuple[tuple[float, float], ...] | None = None,
    ) -> None:
        self.config = config
        self.name: str = config.name
        self.version = version
        self.version_str = str(version)
        self.max_batch_size = config.max_batch_size
        self.decoupled: bool = config.model_transaction_policy.decoupled
        self.inputs = {
            t.name: TensorSpec(t.name, datatype_name(t.data_type), tuple(t.dims), _reshape(t), t.optional)
            for t in config.input
        }
        self.outputs = {
            t.name: TensorSpec(
                t.name, datatype_name(t.data_type), tuple(t.dims), _reshape(t), labels=_labels(model_dir, t.label_filename)
            )
            for t in config.output
        }
        # (name, spec, numpy dtype or None for BYTES) of every output: an output the model produced
        # in exactly this dtype, without `reshape`, goes into the response as it is.
        self.output_plan = tuple(
            (t.name, t, None if t.datatype == "BYTES" else numpy_dtype(t.datatype)) for t in self.outputs.values()
        )
        self.required_inputs = sum(1 for t in self.inputs.values() if not t.optional)
        # What model metadata reports and frontends decode against (-1 leads the shape of a batching model).
        batch = (-1,) if config.max_batch_size > 0 else ()
        self.input_metadata = tuple(TensorMetadata(t.name, t.datatype, batch + t.dims) for t in self.inputs.values())
        self.output_metadata = tuple(TensorMetadata(t.name, t.datatype, batch + t.dims) for t in self.outputs.values())
        # The shape each input must match (-1: any size), looked up once per input of each request.
        self.input_shapes = {t.name: batch + t.dims for t in self.inputs.values()}
        # Request shapes each input accepted (dims and batch limits checked), filled by request validation.
        self.accepted_shapes: dict[str, set[tuple[int, ...]]] = {name: set() for name in self.inputs}
        # Set (on the loop) the moment routing stops sending requests here: unloaded, replaced or evicted.
        self.retired = False
        self._model_dir = model_dir
        self.memory_bytes = 0  # measured at load time
        self.stats = ModelStatistics(
            self.name, self.version_str, _first_response_buckets(config), summary_quantiles
        )
        self._chat_template = _chat_template(instances)  # found once, at load
        pooled = list(instances)
        if rate_limiter is not None and rate_limiter.enabled and pooled:
            limits = [InstanceLimits.from_group(spec.group, spec.device_id) for spec in instance_specs(config)]
            self.pool: InstancePool = rate_limiter.pool(pooled, limits)
        else:
            self.pool = InstancePool(pooled)
        self.scheduler = self._make_scheduler(services)

    def _make_scheduler(self, services: ServerServices | None) -> Scheduler:
        if self.config.platform == "ensemble":
            if services is None:
                raise ValueError(f"ensemble '{self.name}' needs a server to run its steps")
            return EnsembleScheduler(self.config, services, self.stats)
        inline = InlinePolicy(inline_settings(self.config), self.name)  # checked when the config was read
        if scheduler_kind(self.config) == "sequence_batching":
            return SequenceBatcher(self.pool, self.stats, self.config, self._model_dir, inline)
        if scheduler_kind(self.config) == "dynamic_batching":
            return DynamicBatcher(self.pool, self.stats, self.max_batch_size, self.config.dynamic_batching, inline=inline)
        return DirectScheduler(self.pool, self.stats, self.max_batch_size > 0, inline)

    async def close(self) -> None:
        """Stop the scheduler (waits for running batches) and release the instances."""
        await self.scheduler.stop()
        await self.pool.close()

    def healthy(self) -> bool:
        return self.pool.healthy()

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str | None:
        """The prompt the model's tokenizer template makes of `messages`; None when it has no template."""
        if self._chat_template is None:
            return None
        return self._chat_template(messages, add_generation_prompt)
