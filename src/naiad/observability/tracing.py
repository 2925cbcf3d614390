"""Request tracing: sampling and settings shared by both modes; Triton's mode writes timestamp (and
tensor) records as a JSON array, OpenTelemetry's mode (otel.py) exports spans."""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field, replace
from typing import Any

from naiad.observability.otel import OtelExporter, OtelSettings
from naiad.observability.trace_context import enable_propagation
from naiad.protocol.errors import invalid_arg, unsupported
from naiad.protocol.request_json import json_preview

log = logging.getLogger("naiad.tracing")

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
MODES = ("triton", "opentelemetry")


@dataclass
class TraceConfig:
    level: tuple[str, ...] = ("OFF",)
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    mode: str = "triton"
    otel: OtelSettings = field(default_factory=OtelSettings)

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
        raise invalid_arg(f"Unable to parse '{key}', expecting a string value, got: {json_preview(value)}")
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
                raise invalid_arg(f"Unable to parse 'trace_level', got: {json_preview(value)}")
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
        if config.mode not in MODES:
            raise ValueError(f"unknown trace mode '{config.mode}' (triton or opentelemetry)")
        # OpenTelemetry mode: spans go to this exporter (OtelUnavailable when the extra is missing)
        self.otel = OtelExporter(config.otel) if config.mode == "opentelemetry" else None
        if self.otel is not None:
            enable_propagation()
        self.global_config = config
        self._models: dict[str, TraceConfig] = {}
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self._next_id = 1
        self._pending: list[dict] = []
        self._completed = 0
        self._file_index = 0
        # No request can be traced until the settings change: a trace count only runs down, so
        # settings that trace nothing stay so until update(). An attribute, read before `active`
        # per request: what a request pays while tracing is off.
        self.off = self._traces_nothing()

    def _traces_nothing(self) -> bool:
        return self.otel is None and not self.global_config.enabled and not self.has_overrides

    @property
    def has_overrides(self) -> bool:
        return any(c.enabled for c in self._models.values())

    def settings(self, model: str = "") -> dict:
        return self._models.get(model, self.global_config).as_dict() if model else self.global_config.as_dict()

    def update(self, model: str, changes: dict) -> dict:
        try:
            return self._update(model, changes)
        finally:
            self.off = self._traces_nothing()

    def _update(self, model: str, changes: dict) -> dict:
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

    def decide(self, model: str, force: bool = False) -> tuple[int, TraceConfig] | None:
        """(trace id, settings) when this request of `model` is traced: 1 in `rate` (never when rate is
        0), or always when `force`d (a propagated trace context), while the level and count allow."""
        config = self._models.get(model, self.global_config)
        if not config.enabled:
            return None
        with self._lock:
            seen = self._seen.get(model, 0) + 1
            self._seen[model] = seen
            if not force and (config.rate <= 0 or seen % config.rate != 0):
                return None
            if config.count > 0:
                config.count -= 1
            trace_id = self._next_id
            self._next_id += 1
        return trace_id, config

    def next_id(self) -> int:
        """A trace id for a request traced because the request that made it is."""
        with self._lock:
            trace_id = self._next_id
            self._next_id += 1
        return trace_id

    @property
    def active(self) -> bool:
        """Whether any request may be traced now (checked per request, so kept cheap when off)."""
        return not self.off and (self.otel is not None or self.global_config.enabled or self.has_overrides)

    def sample(self, model: str, version: str, request_id: str, parent: Trace | None = None) -> Trace | None:
        """A Triton-mode trace for this request: always when the request that made it is traced
        (`parent`: an ensemble's step gets its own id and the ensemble's as parent_id), else by rate."""
        if parent is not None:
            trace = Trace(self.next_id(), parent.tensors)
        else:
            decided = self.decide(model)
            if decided is None:
                return None
            trace = Trace(decided[0], "TENSORS" in decided[1].level)
        trace.records.append({"id": trace.id, "model_name": model, "model_version": int(version), "request_id": request_id,
                              "parent_id": parent.id if parent is not None else 0})
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
        """At shutdown: write what has not been written yet (export queued spans in OpenTelemetry mode)."""
        if self.otel is not None:
            self.otel.shutdown()
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
    """--trace-config [mode,]key=value entries: rate, level, count, mode; triton,file and
    triton,log-frequency; opentelemetry,url / resource / bsp_max_queue_size / bsp_schedule_delay /
    bsp_max_export_batch_size."""
    config = TraceConfig()
    levels: list[str] = []
    for entry in entries:
        scope, _, setting = entry.rpartition(",")
        key, sep, value = setting.partition("=")
        if not sep:
            raise ValueError(f"--trace-config expects [<mode>,]<key>=<value>, got '{entry}'")
        if scope not in ("", *MODES):
            raise ValueError(f"--trace-config {entry}: unknown trace mode '{scope}' (triton or opentelemetry)")
        try:
            if scope == "opentelemetry":
                config.otel.set(key, value)
            elif key == "rate":
                config.rate = int(value)
                if config.rate < 0:
                    raise ValueError("rate must be >= 0 (0: only requests with a propagated trace context)")
            elif key == "level":
                if value.upper() not in LEVELS:
                    raise ValueError(f"unknown trace level '{value}'")
                levels.append(value.upper())
            elif key == "count":
                config.count = int(value)
            elif key == "mode":
                if value not in MODES:
                    raise ValueError(f"unknown trace mode '{value}' (triton or opentelemetry)")
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
        config.level = tuple(level for level in levels if level != "OFF") or ("OFF",)
    if config.mode == "opentelemetry":
        config.otel.check()
    return config
