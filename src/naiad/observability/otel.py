"""OpenTelemetry trace export (`--trace-config mode=opentelemetry`), an optional extra: `pip install 'naiad[otel]'`.

Spans follow Triton's: a root `InferRequest` span (child of the client's span when the request
carried a W3C `traceparent`), a span named after the model with the `triton.*` attributes and
REQUEST_START / QUEUE_START / REQUEST_END events, and a `compute` span with the COMPUTE_* events.
All are SERVER spans of the `triton-server` scope, exported over OTLP/HTTP (protobuf) by a batch
span processor configured with Triton's `bsp_*` settings.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("naiad.tracing")

INSTALL_HINT = "pip install 'naiad[otel]'"
DEFAULT_URL = "http://localhost:4318/v1/traces"
SCOPE = "triton-server"


class OtelUnavailable(RuntimeError):
    """OpenTelemetry mode was asked for but its packages are not installed."""


def require_sdk() -> None:
    """Raise OtelUnavailable, saying what to install, unless the SDK and the OTLP/HTTP exporter import."""
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        raise OtelUnavailable(
            "--trace-config mode=opentelemetry needs the OpenTelemetry SDK and its OTLP/HTTP exporter, "
            f"which are not installed ({exc}). Install them with: {INSTALL_HINT}"
        ) from None


@dataclass
class OtelSettings:
    """`--trace-config opentelemetry,<key>=<value>` settings, with Triton's defaults."""

    url: str = DEFAULT_URL
    resource: dict[str, str] = field(default_factory=lambda: {"service.name": "triton-inference-server"})
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay: int = 5000  # milliseconds
    bsp_max_export_batch_size: int = 512

    def set(self, key: str, value: str) -> None:
        """Apply one setting; ValueError names what is wrong."""
        if key == "url":
            if not value:
                raise ValueError("opentelemetry,url needs a value")
            self.url = value if "://" in value else f"http://{value}"
        elif key == "resource":
            name, sep, attribute = value.partition("=")
            if not sep or not name:
                raise ValueError(f"opentelemetry,resource expects <key>=<value>, got '{value}'")
            self.resource[name] = attribute
        elif key in ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size"):
            try:
                number = int(value)
            except ValueError:
                raise ValueError(f"opentelemetry,{key} expects an integer, got '{value}'") from None
            if number <= 0:
                raise ValueError(f"opentelemetry,{key} must be > 0, got '{value}'")
            setattr(self, key, number)
        else:
            raise ValueError(f"unknown opentelemetry trace setting '{key}'")

    def check(self) -> None:
        if self.bsp_max_export_batch_size > self.bsp_max_queue_size:
            raise ValueError("opentelemetry,bsp_max_export_batch_size must be <= bsp_max_queue_size")


@dataclass
class OtelRequest:
    """The spans of one traced request; timestamps are perf_counter nanoseconds until export."""

    root: Any  # the InferRequest span, or None for a request made by another traced request
    span: Any  # the model span
    trace_id: int
    compute: bool = True  # False for ensembles: their steps have their own compute spans


class OtelExporter:
    """A TracerProvider of our own (the global one is left alone) with a batch OTLP/HTTP exporter."""

    def __init__(self, settings: OtelSettings) -> None:
        require_sdk()
        settings.check()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import (
            TraceContextTextMapPropagator,
        )

        self.settings = settings
        self._provider = TracerProvider(resource=Resource.create(dict(settings.resource)), shutdown_on_exit=False)
        self._provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=settings.url),
            max_queue_size=settings.bsp_max_queue_size,
            schedule_delay_millis=settings.bsp_schedule_delay,
            max_export_batch_size=settings.bsp_max_export_batch_size,
        ))
        self._tracer = self._provider.get_tracer(SCOPE)
        self._server_kind = SpanKind.SERVER
        self._in_context = set_span_in_context
        self._propagator = TraceContextTextMapPropagator()
        # wall-clock nanoseconds = steady nanoseconds + offset (OTLP wants Unix time)
        self._offset = time.time_ns() - time.perf_counter_ns()

    def wall(self, steady_ns: int) -> int:
        return steady_ns + self._offset

    def start(
        self, model: str, version: str, request_id: str, trace_id: int, parent_trace_id: int, start_ns: int,
        parent_span: Any = None, traceparent: str = "",
    ) -> OtelRequest:
        """Open the spans of a request starting at `start_ns`: under `parent_span` (a traced request
        that made this one) or else under a new InferRequest span (child of `traceparent`, if any)."""
        root = None
        if parent_span is None:
            remote = self._propagator.extract({"traceparent": traceparent}) if traceparent else None
            root = self._tracer.start_span("InferRequest", context=remote, kind=self._server_kind, start_time=self.wall(start_ns))
            parent_span = root
        attributes: dict[str, Any] = {
            "triton.model_name": model,
            "triton.model_version": int(version) if version.lstrip("-").isdigit() else -1,
            "triton.trace_id": trace_id,
            "triton.trace_parent_id": parent_trace_id,
        }
        if request_id:
            attributes["triton.request_id"] = request_id
        span = self._tracer.start_span(
            model, context=self._in_context(parent_span), kind=self._server_kind, attributes=attributes, start_time=self.wall(start_ns)
        )
        return OtelRequest(root, span, trace_id)

    def finish(self, traced: OtelRequest, events: list[tuple[str, int]], compute: list[tuple[str, int]], end_ns: int) -> None:
        """Add the model span's events, the compute span (when it ran) and end the spans at `end_ns`."""
        span = traced.span
        for name, ns in events:
            span.add_event(name, timestamp=self.wall(ns))
        if compute and traced.compute:
            child = self._tracer.start_span(
                "compute", context=self._in_context(span), kind=self._server_kind, start_time=self.wall(compute[0][1])
            )
            for name, ns in compute:
                child.add_event(name, timestamp=self.wall(ns))
            child.end(end_time=self.wall(compute[-1][1]))
        span.add_event("REQUEST_END", timestamp=self.wall(end_ns))
        span.end(end_time=self.wall(end_ns))
        if traced.root is not None:
            traced.root.add_event("INFER_RESPONSE_COMPLETE", timestamp=self.wall(end_ns))
            traced.root.end(end_time=self.wall(end_ns))

    def shutdown(self, timeout_secs: float = 5.0) -> None:
        """Export what is queued, then stop the exporter thread; an unreachable collector (whose
        retries could take much longer) holds the server's exit up for at most `timeout_secs`."""
        done = threading.Thread(target=self._provider.shutdown, name="naiad-otel-shutdown", daemon=True)
        done.start()
        done.join(timeout_secs)
        if done.is_alive():
            log.warning("OpenTelemetry spans not exported within %.0f s of shutdown (collector at %s unreachable?)",
                        timeout_secs, self.settings.url)
