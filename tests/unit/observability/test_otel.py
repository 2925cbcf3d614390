"""OpenTelemetry mode: its settings, W3C traceparent handling, and the explanation when the extra is missing."""

import argparse
import sys

import pytest

from naiad.cli.flags import add_serve_flags, config_from_args
from naiad.observability.otel import DEFAULT_URL, OtelUnavailable, require_sdk
from naiad.observability.trace_context import find_traceparent, valid_traceparent
from naiad.observability.tracing import TraceConfig, Tracer, parse_trace_config


def test_opentelemetry_settings_and_defaults():
    config = parse_trace_config(["mode=opentelemetry", "rate=0", "level=TIMESTAMPS"])
    assert config.mode == "opentelemetry" and config.rate == 0
    assert config.otel.url == DEFAULT_URL == "http://localhost:4318/v1/traces"
    assert config.otel.resource == {"service.name": "triton-inference-server"}
    assert (config.otel.bsp_max_queue_size, config.otel.bsp_schedule_delay, config.otel.bsp_max_export_batch_size) == (2048, 5000, 512)
    config = parse_trace_config([
        "mode=opentelemetry", "opentelemetry,url=collector:4318/v1/traces", "opentelemetry,resource=service.name=naiad",
        "opentelemetry,resource=deployment.environment=test=1", "opentelemetry,bsp_max_queue_size=64",
        "opentelemetry,bsp_schedule_delay=100", "opentelemetry,bsp_max_export_batch_size=32",
    ])
    assert config.otel.url == "http://collector:4318/v1/traces"
    assert config.otel.resource == {"service.name": "naiad", "deployment.environment": "test=1"}
    assert (config.otel.bsp_max_queue_size, config.otel.bsp_schedule_delay, config.otel.bsp_max_export_batch_size) == (64, 100, 32)
    for bad, text in [
        (["opentelemetry,colour=red"], "unknown opentelemetry trace setting 'colour'"),
        (["opentelemetry,bsp_max_queue_size=lots"], "expects an integer"),
        (["opentelemetry,bsp_schedule_delay=0"], "must be > 0"),
        (["opentelemetry,resource=novalue"], "expects <key>=<value>"),
        (["mode=opentelemetry", "opentelemetry,bsp_max_queue_size=8", "opentelemetry,bsp_max_export_batch_size=9"], "<= bsp_max_queue_size"),
    ]:
        with pytest.raises(ValueError, match=text):
            parse_trace_config(bad)


def test_traceparent_validation_and_lookup():
    good = "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01"
    assert valid_traceparent(good) and valid_traceparent(good.upper())
    for bad in ("", "garbage", "ff-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01",
                "00-00000000000000000000000000000000-b7ad6b7169242424-01", "00-0af7651916cd43dd8448eb211c12666c-0000000000000000-01",
                "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01-extra", "00-0af7651916cd43dd8448eb211c1266-b7ad6b7169242424-01"):
        assert not valid_traceparent(bad), bad
    assert find_traceparent([(b"content-type", b"x"), (b"traceparent", good.encode())]) == good
    assert find_traceparent([("traceparent", good)]) == good
    assert find_traceparent([("tracestate", "a=b")]) == ""


@pytest.fixture()
def without_otel(monkeypatch):
    """Make the SDK and the exporter unimportable, as when `naiad[otel]` is not installed."""
    for name in list(sys.modules):
        if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter")):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk", None)
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter", None)


def test_missing_extra_is_explained(without_otel):
    with pytest.raises(OtelUnavailable) as err:
        require_sdk()
    message = str(err.value)
    assert "--trace-config mode=opentelemetry" in message and "pip install 'naiad[otel]'" in message
    with pytest.raises(OtelUnavailable, match=r"naiad\[otel\]"):
        Tracer(TraceConfig(mode="opentelemetry"))
    Tracer(TraceConfig(mode="triton"))  # Triton mode never needs the extra


def test_missing_extra_stops_the_command_line_with_the_explanation(without_otel):
    parser = argparse.ArgumentParser()
    add_serve_flags(parser)
    args = parser.parse_args(["--model-repository", "/tmp", "--trace-config", "mode=opentelemetry"])
    with pytest.raises(SystemExit) as err:
        config_from_args(args)
    assert "pip install 'naiad[otel]'" in str(err.value.code)


def test_incoming_traceparent_is_scoped_to_its_block(monkeypatch):
    from naiad.observability import trace_context

    good = "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01"
    headers = [(b"content-type", b"application/json"), (b"traceparent", good.encode())]
    monkeypatch.setattr(trace_context, "_PROPAGATING", False)
    with trace_context.incoming_traceparent(headers):
        assert trace_context.REMOTE_TRACEPARENT.get() == ""  # no OpenTelemetry server: headers are not read
    monkeypatch.setattr(trace_context, "_PROPAGATING", True)
    with trace_context.incoming_traceparent(headers):
        assert trace_context.REMOTE_TRACEPARENT.get() == good
        with trace_context.incoming_traceparent([(b"host", b"x")]):
            assert trace_context.REMOTE_TRACEPARENT.get() == good  # nothing new: the outer value stays
    assert trace_context.REMOTE_TRACEPARENT.get() == ""  # nothing leaks to the next request
