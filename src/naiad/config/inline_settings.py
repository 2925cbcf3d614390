"""The inline execution settings of a model: two `parameters` of its config (the rule they feed is
InlinePolicy in naiad/scheduling/execution_policy.py)."""

from __future__ import annotations

from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from naiad.config.model_config import parameter

THRESHOLD_PARAMETER = "inline_threshold_us"
CAP_PARAMETER = "inline_cap_us"
# Measured: a round trip to an instance thread costs the event loop 31-37 us on a 2-core x86 host,
# more on a busy loop, so an execution averaging under 100 us is cheaper inline.
DEFAULT_THRESHOLD_US = 100
DEFAULT_CAP_US = 5_000


class InlineSettingError(ValueError):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class InlineSettings:
    """Executions averaging under `threshold_ns` run inline; one inline execution over `cap_ns` suspends that."""

    threshold_ns: int = DEFAULT_THRESHOLD_US * 1000
    cap_ns: int = DEFAULT_CAP_US * 1000


def inline_settings(config: mc.ModelConfig) -> InlineSettings:
    """The model's settings; InlineSettingError for a value that is not a whole number of microseconds."""
    return InlineSettings(_microseconds(config, THRESHOLD_PARAMETER, DEFAULT_THRESHOLD_US, minimum=0) * 1000,
                          _microseconds(config, CAP_PARAMETER, DEFAULT_CAP_US, minimum=1) * 1000)


def _microseconds(config: mc.ModelConfig, key: str, default: int, minimum: int) -> int:
    text = parameter(config, key)
    if text is None:
        return default
    try:
        value = int(text.strip())
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise InlineSettingError(key, f"parameter '{key}' must be a whole number of microseconds >= {minimum}, got '{text}'")
    return value
