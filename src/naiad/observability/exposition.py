"""Prometheus text exposition for metric families whose names must match Triton's exactly.

prometheus-client renames counters to `<name>_total` in HELP/TYPE lines; Triton's dashboards
use the bare names, so families are rendered here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Family:
    """One metric family: `samples` are (suffix, labels, value); suffix is '' or e.g. '_bucket'."""

    name: str
    kind: str  # counter | gauge | histogram | summary
    help: str
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    def add(self, labels: dict[str, str], value: float, suffix: str = "") -> None:
        self.samples.append((suffix, labels, value))


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format_value(value: float) -> str:
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def render(families: list[Family]) -> str:
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for suffix, labels, value in family.samples:
            label_text = ",".join(f'{k}="{_escape_label(str(v))}"' for k, v in sorted(labels.items()))
            name = family.name + suffix
            lines.append(f"{name}{{{label_text}}} {_format_value(value)}" if label_text else f"{name} {_format_value(value)}")
    return "\n".join(lines) + "\n"


CONTENT_TYPE = "text/plain; charset=utf-8"  # what Triton sends (Prometheus reads it as format 0.0.4)
