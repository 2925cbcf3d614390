"""Request tracing in Triton's mode: sampled timestamp (and tensor) records written as a JSON array."""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field, replace
from typing import Any

from naiad.protocol.errors import invalid_arg, unsupported

log = logging.getLogger("naiad.tracing")

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")


@dataclass
class TraceConfig:
    level: tuple[str, ...] = ("OFF",)
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    mode: str = "triton"

    def as_dict(self) -> dict:
        return {
            "trace_level": list(self.level),
            "trace_rate": str(self.rate),
            "trace_count": str(self.count),
            "log_frequency": str(self.log_frequency),
            "trace_file": self.file,
            "trace_mode": self.mode,
        }

    @property
    def enabled(self) -> bool:
        return any(level != "OFF" for level in self.level) and self.count != 0


def _parse_int(key: str, value: Any, minimum: int) -> int:
    if not isinstance(value, str):
        raise invalid_arg(f"Unable to parse '{key}', expecting a string value, got: {json.dumps(value)}")
    try:
        number = int(value)
    except ValueError:
        raise invalid_arg(f"Unable to parse '{key}', got: {value}") from None
    if number < minimum:
        raise invalid_arg(f"Unable to parse '{key}', got: {value}")
    return number


def apply_settings(base: TraceConfig, changes: dict) -> TraceConfig:
    """A POST body applied to a config (values are strings / string arrays, as on the wire)."""
    if not isinstance(changes, dict):
        raise invalid_arg("trace settings must be a JSON object")
    updated = replace(base)
    for key, value in changes.items():
        if value is None:
            continue
        if key == "trace_file":
            raise unsupported("trace file location can not be updated through network protocol")
        if key == "trace_mode":
            raise unsupported("trace mode can not be updated through network protocol")
        if key == "trace_level":
            values = value if isinstance(value, list) else [value]
            if not values or any(v not in LEVELS for v in values):
                raise invalid_arg(f"Unable to parse 'trace_level', got: {json.dumps(value)}")
            updated.level = tuple(values)
        elif key == "trace_rate":
            updated.rate = _parse_int(key, value, 1)
        elif key == "trace_count":
            updated.count = _parse_int(key, value, -1)
        elif key == "log_frequency":
            updated.log_frequency = _parse_int(key, value, 0)
        else:
            raise invalid_arg(f"unknown trace setting '{key}'")
    return updated


@dataclass
class Trace:
    """One sampled request's records; timestamps are steady-clock nanoseconds."""

    id: int
    tensors: bool
    records: list[dict] = field(default_factory=list)

    def timestamp(self, name: str, ns: int) -> None:
        self.records.append({"id": self.id, "timestamps": [{"name": name, "ns": ns}]})

    def tensor(self, activity: str, name: str, datatype: str, shape: tuple, data: str) -> None:
        if self.tensors:
            self.records.append({
                "id": self.id, "activity": activity,
                "tensor": {"name": name, "data": data, "shape": ",".join(map(str, shape)), "dtype": datatype},
            })


class Tracer:
    """Global settings plus per-model overrides; samples 1 of every `rate` requests of a model."""

    def __init__(self, config: TraceConfig) -> None:
        if config.mode != "triton":
            raise ValueError(f"trace mode '{config.mode}' is not available (only 'triton')")
        self.global_config = config
        self._models: dict[str, TraceConfig] = {}
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self._next_id = 1
        self._pending: list[dict] = []
        self._completed = 0
        self._file_index = 0

    @property
    def has_overrides(self) -> bool:
        return any(c.enabled for c in self._models.values())

    def settings(self, model: str = "") -> dict:
        return self._models.get(model, self.global_config).as_dict() if model else self.global_config.as_dict()

    def update(self, model: str, changes: dict) -> dict:
        with self._lock:
            if model:
                cleared = [k for k, v in changes.items() if v is None]
                base = self._models.get(model, self.global_config)
                if cleared and model in self._models:
                    # null clears a model override: that key falls back to the global setting
                    defaults = self.global_config.as_dict()
                    base = apply_settings(base, {k: defaults[k] for k in cleared if k not in ("trace_file", "trace_mode")})
                self._models[model] = apply_settings(base, changes)
                return self._models[model].as_dict()
            self.global_config = apply_settings(self.global_config, changes)
            return self.global_config.as_dict()

    def sample(self, model: str, version: str, request_id: str) -> Trace | None:
        config = self._models.get(model, self.global_config)
        if not config.enabled:
            return None
        with self._lock:
            seen = self._seen.get(model, 0) + 1
            self._seen[model] = seen
            if seen % config.rate != 0 and config.rate != 1:
                return None
            if config.count > 0:
                config.count -= 1
            trace = Trace(self._next_id, "TENSORS" in config.level)
            self._next_id += 1
        trace.records.append({"id": trace.id, "model_name": model, "model_version": int(version), "request_id": request_id, "parent_id": 0})
        return trace

    def finish(self, trace: Trace, model: str) -> None:
        config = self._models.get(model, self.global_config)
        with self._lock:
            self._pending.extend(trace.records)
            self._completed += 1
            if config.log_frequency and self._completed % config.log_frequency == 0:
                self._write(f"{config.file}.{self._file_index}" if config.file else "")
                self._file_index += 1

    def flush(self) -> None:
        """At shutdown: write what has not been written yet."""
        with self._lock:
            if self._pending:
                self._write(self.global_config.file)

    def _write(self, path: str) -> None:
        records, self._pending = self._pending, []
        if not path:
            log.warning("%d trace records dropped: no trace file configured (--trace-config triton,file=PATH)", len(records))
            return
        try:
            with open(path, "w", encoding="utf-8") as handle:
                json.dump(records, handle)
        except OSError as exc:
            log.error("unable to write trace file '%s': %s", path, exc)


def parse_trace_config(entries: list[str]) -> TraceConfig:
    """--trace-config [mode,]key=value entries (rate, level, count, mode, triton,file, triton,log-frequency)."""
    config = TraceConfig()
    levels: list[str] = []
    for entry in entries:
        scope, _, setting = entry.rpartition(",")
        key, sep, value = setting.partition("=")
        if not sep:
            raise ValueError(f"--trace-config expects [<mode>,]<key>=<value>, got '{entry}'")
        if scope not in ("", "triton"):
            raise ValueError(f"trace mode '{scope}' is not available (only 'triton')")
        try:
            if key == "rate":
                config.rate = int(value)
            elif key == "level":
                if value.upper() not in LEVELS:
                    raise ValueError(f"unknown trace level '{value}'")
                levels.append(value.upper())
            elif key == "count":
                config.count = int(value)
            elif key == "mode":
                config.mode = value
            elif key == "file":
                config.file = value
            elif key == "log-frequency":
                config.log_frequency = int(value)
            else:
                raise ValueError(f"unknown trace setting '{key}'")
        except ValueError as exc:
            raise ValueError(f"--trace-config {entry}: {exc}") from None
    if levels:
        config.level = tuple(l for l in levels if l != "OFF") or ("OFF",)
    return config
