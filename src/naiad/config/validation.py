"""Semantic checks of a completed ModelConfig; errors name the file, line and field."""

from __future__ import annotations

from collections.abc import Sequence

from tritonclient.grpc import model_config_pb2 as mc

from naiad.config.inline_settings import InlineSettingError, inline_settings
from naiad.config.model_config import ConfigError
from naiad.protocol.tensor_codec import element_count


def _line_of(text: str, needle: str) -> int | None:
    """First line of the config text that mentions `needle` (positions are lost after parsing)."""
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return number
    return None


class _Reporter:
    def __init__(self, source: str, text: str) -> None:
        self.source = source
        self.text = text

    def fail(self, field: str, message: str, needle: str | None = None) -> None:
        line = _line_of(self.text, needle) if needle else None
        where = f"{self.source}:{line}" if line else self.source
        raise ConfigError(f"{where}: field '{field}': {message}")


def _check_dims(report: _Reporter, field: str, name: str, dims: Sequence[int], allow_empty: bool) -> None:
    if not dims and not allow_empty:
        report.fail(field, f"'{name}' must have at least one dimension (use dims: [1] with reshape: {{ shape: [] }} for scalars)", f'"{name}"')
    for dim in dims:
        if dim == 0 or dim < -1:
            report.fail(field, f"dimension {dim} of '{name}' must be >= 1 or -1", f'"{name}"')


def _check_reshape(report: _Reporter, field: str, tensor: mc.ModelInput | mc.ModelOutput) -> None:
    if not tensor.HasField("reshape"):
        return
    dims, shape = list(tensor.dims), list(tensor.reshape.shape)
    for dim in shape:
        if dim == 0 or dim < -1:
            report.fail(f"{field}.reshape", f"dimension {dim} of '{tensor.name}' must be >= 1 or -1", f'"{tensor.name}"')
    if -1 not in dims and -1 not in shape and element_count(dims) != element_count(shape):
        report.fail(
            f"{field}.reshape",
            f"reshape {shape} of '{tensor.name}' has a different element count than dims {dims}",
            f'"{tensor.name}"',
        )


def validate_read(config: mc.ModelConfig, source: str, text: str = "") -> None:
    """Raise ConfigError for what Triton refuses when it reads a config, before any backend sees it."""
    if config.max_batch_size < 0:
        _Reporter(source, text).fail("max_batch_size", f"must be >= 0, got {config.max_batch_size}", "max_batch_size")


def validate_config(config: mc.ModelConfig, source: str, text: str = "") -> None:
    """Raise ConfigError for what Triton refuses at load time."""
    report = _Reporter(source, text)
    validate_read(config, source, text)
    for field, tensors in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for tensor in tensors:
            if not tensor.name:
                report.fail(field, "every entry needs a non-empty 'name'")
            if tensor.name in seen:
                report.fail(field, f"'{tensor.name}' is listed more than once", f'"{tensor.name}"')
            seen.add(tensor.name)
            if tensor.data_type == mc.TYPE_INVALID:
                report.fail(f"{field}.data_type", f"'{tensor.name}' needs a data_type (TYPE_FP32, TYPE_STRING, ...)", f'"{tensor.name}"')
            allow_empty = tensor.HasField("reshape") and not list(tensor.reshape.shape)
            _check_dims(report, f"{field}.dims", tensor.name, tensor.dims, allow_empty)
            _check_reshape(report, field, tensor)
    kind = config.WhichOneof("scheduling_choice")
    if kind == "dynamic_batching":
        batching = config.dynamic_batching
        for size in batching.preferred_batch_size:
            if size < 1 or (config.max_batch_size > 0 and size > config.max_batch_size):
                report.fail(
                    "dynamic_batching.preferred_batch_size",
                    f"{size} must be in [1, max_batch_size={config.max_batch_size}]",
                    "preferred_batch_size",
                )
        if batching.priority_levels and not (1 <= batching.default_priority_level <= batching.priority_levels):
            report.fail(
                "dynamic_batching.default_priority_level",
                f"must be in [1, {batching.priority_levels}], got {batching.default_priority_level}",
                "default_priority_level",
            )
    policy = config.version_policy
    if policy.HasField("latest") and policy.latest.num_versions < 0:
        report.fail("version_policy.latest.num_versions", "must be >= 1", "num_versions")
    for group in config.instance_group:
        if group.count < 0:
            report.fail("instance_group.count", f"must be >= 1, got {group.count}", "count")
    try:
        inline_settings(config)
    except InlineSettingError as exc:
        report.fail("parameters", str(exc), f'"{exc.key}"')
