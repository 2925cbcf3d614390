"""OpenTelemetry trace export from a real server process to an OTLP/HTTP receiver on loopback.

The receiver is a small HTTP server in the test that decodes each POST body as the protobuf
ExportTraceServiceRequest (opentelemetry-proto), so the spans checked are exactly what a collector
such as Jaeger or the OpenTelemetry Collector would receive.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

pytest.importorskip("opentelemetry.sdk", reason="the naiad[otel] extra is not installed")
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from tests.support.onnx_models import add_sub_model, ensemble_model
from tests.support.servers import start_server

CLIENT_TRACE_ID = "0af7651916cd43dd8448eb211c12666c"
CLIENT_SPAN_ID = "b7ad6b7169242424"
TRACEPARENT = f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-01"


class Receiver:
    """Collects (resource attributes, span) pairs from OTLP/HTTP protobuf exports."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict, object]] = []
        self.content_types: list[str] = []
        self.changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's naming
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                with receiver.changed:
                    receiver.content_types.append(self.headers.get("Content-Type", ""))
                    for resource_spans in request.resource_spans:
                        resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                        for scope_spans in resource_spans.scope_spans:
                            for span in scope_spans.spans:
                                receiver.spans.append((resource, span, scope_spans.scope.name))
                    receiver.changed.notify_all()
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1/traces"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def trace(self, predicate, count: int, timeout: float = 20.0) -> list:
        """Wait until `count` spans match `predicate`; returns them."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                found = [entry for entry in self.spans if predicate(entry[1])]
                if len(found) >= count or time.monotonic() > deadline:
                    return found
                self.changed.wait(max(deadline - time.monotonic(), 0.01))


@pytest.fixture(scope="module")
def receiver():
    receiver = Receiver()
    yield receiver
    receiver.http.shutdown()


@pytest.fixture(scope="module")
def server(tmp_path_factory, receiver):
    repo = tmp_path_factory.mktemp("otel_repo")
    add_sub_model(repo, "m")
    add_sub_model(repo, "sampled")
    ensemble_model(repo, "ens", [("m", {"INPUT0": "IN0", "INPUT1": "IN1"}, {"OUTPUT0": "OUT0"})],
                   inputs=[("IN0", "FP32", [16]), ("IN1", "FP32", [16])], outputs=[("OUT0", "FP32", [16])])
    with start_server(
        repo, "--trace-config", "mode=opentelemetry", "--trace-config", "rate=1", "--trace-config", "level=TIMESTAMPS",
        "--trace-config", f"opentelemetry,url={receiver.url}", "--trace-config", "opentelemetry,resource=service.name=naiad-test",
        "--trace-config", "opentelemetry,resource=test.key=test.value", "--trace-config", "opentelemetry,bsp_schedule_delay=50",
    ) as running:
        yield running


def _hex(raw: bytes) -> str:
    return raw.hex()


def _attributes(span) -> dict:
    result = {}
    for attribute in span.attributes:
        value = attribute.value
        result[attribute.key] = value.string_value if value.HasField("string_value") else value.int_value
    return result


def _family(receiver: Receiver, request_id: str, expected: int) -> dict[str, list]:
    """The spans of one request, by name: the tree under the InferRequest span above the model span
    whose `triton.request_id` is `request_id` (several tests share the client's trace id)."""
    heads = receiver.trace(lambda s: _attributes(s).get("triton.request_id") == request_id, 1)
    assert heads, f"no span for request {request_id}"
    head = heads[0][1]
    deadline = time.monotonic() + 20
    while True:
        tree = _tree(receiver.trace(lambda s: s.trace_id == head.trace_id, 1), head)
        if len(tree) >= expected or time.monotonic() > deadline:
            break
        with receiver.changed:
            receiver.changed.wait(0.1)
    by_name: dict[str, list] = {}
    for resource, span, scope in tree:
        by_name.setdefault(span.name, []).append((resource, span, scope))
    return by_name


def _tree(entries: list, head) -> list:
    """The entries under the topmost received ancestor of `head`."""
    by_id = {span.span_id: (resource, span, scope) for resource, span, scope in entries}
    root = head
    while root.parent_span_id in by_id:
        root = by_id[root.parent_span_id][1]
    tree, frontier = [by_id[root.span_id]], {root.span_id}
    while frontier:
        children = [entry for entry in entries if entry[1].parent_span_id in frontier]
        tree += children
        frontier = {entry[1].span_id for entry in children}
    return tree


def _inputs(module):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    return inputs


def _events(span) -> list[str]:
    return [event.name for event in span.events]


def test_http_request_spans_follow_triton_and_the_client_traceparent(server, receiver):
    before = time.time_ns()
    with httpclient.InferenceServerClient(server.http_url) as client:
        client.infer("m", _inputs(httpclient), request_id="http-1", headers={"traceparent": TRACEPARENT})
    after = time.time_ns()
    spans = _family(receiver, "http-1", 3)
    assert sorted(spans) == ["InferRequest", "compute", "m"] and all(len(v) == 1 for v in spans.values())
    (resource, root, scope), (_, model, _), (_, compute, _) = spans["InferRequest"][0], spans["m"][0], spans["compute"][0]
    assert scope == "triton-server"
    assert resource["service.name"] == "naiad-test" and resource["test.key"] == "test.value"
    # the server's root span is a child of the client's span, in the client's trace
    assert _hex(root.trace_id) == CLIENT_TRACE_ID and _hex(root.parent_span_id) == CLIENT_SPAN_ID
    assert model.parent_span_id == root.span_id and compute.parent_span_id == model.span_id
    assert {root.kind, model.kind, compute.kind} == {2}  # SPAN_KIND_SERVER, as Triton
    attributes = _attributes(model)
    assert attributes["triton.model_name"] == "m" and attributes["triton.model_version"] == 1
    assert attributes["triton.trace_parent_id"] == 0 and attributes["triton.trace_id"] > 0
    assert _events(model) == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert _events(compute) == ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]
    assert _events(root) == ["INFER_RESPONSE_COMPLETE"]
    # wall-clock timestamps, in order, inside the time the client waited
    stamps = [e.time_unix_nano for e in model.events[:2]] + [e.time_unix_nano for e in compute.events] + [model.events[2].time_unix_nano]
    assert stamps == sorted(stamps) and before <= stamps[0] and stamps[-1] <= after
    assert root.start_time_unix_nano <= model.start_time_unix_nano <= compute.start_time_unix_nano
    assert compute.end_time_unix_nano <= model.end_time_unix_nano <= root.end_time_unix_nano


def test_request_without_traceparent_starts_its_own_trace(server, receiver):
    with httpclient.InferenceServerClient(server.http_url) as client:
        client.infer("m", _inputs(httpclient), request_id="http-2")
    spans = _family(receiver, "http-2", 3)
    root = spans["InferRequest"][0][1]
    assert root.parent_span_id == b"" and _hex(root.trace_id) != CLIENT_TRACE_ID


def test_grpc_metadata_traceparent(server, receiver):
    traceparent = f"00-{CLIENT_TRACE_ID}-00f067aa0ba902b7-01"
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.infer("m", _inputs(grpcclient), request_id="grpc-1", headers={"traceparent": traceparent})
    spans = _family(receiver, "grpc-1", 3)
    root = spans["InferRequest"][0][1]
    assert _hex(root.trace_id) == CLIENT_TRACE_ID and _hex(root.parent_span_id) == "00f067aa0ba902b7"
    assert spans["m"][0][1].parent_span_id == root.span_id


def test_ensemble_steps_are_child_spans(server, receiver):
    with httpclient.InferenceServerClient(server.http_url) as client:
        inputs = []
        for name in ("IN0", "IN1"):
            tensor = httpclient.InferInput(name, [1, 16], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
            inputs.append(tensor)
        client.infer("ens", inputs, request_id="ens-1", headers={"traceparent": TRACEPARENT})
    spans = _family(receiver, "ens-1", 4)
    # Triton's shape: InferRequest -> ens -> m -> compute (no compute span for the ensemble itself)
    assert sorted((name, len(entries)) for name, entries in spans.items()) == [("InferRequest", 1), ("compute", 1), ("ens", 1), ("m", 1)]
    root, ens, step, compute = (spans[n][0][1] for n in ("InferRequest", "ens", "m", "compute"))
    assert ens.parent_span_id == root.span_id and step.parent_span_id == ens.span_id and compute.parent_span_id == step.span_id
    assert _attributes(step)["triton.trace_parent_id"] == _attributes(ens)["triton.trace_id"]


def test_rate_is_shared_with_triton_mode_and_traceparent_forces_a_trace(server, receiver):
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert client.update_trace_settings("sampled", {"trace_rate": "3"})["trace_rate"] == "3"
        assert client.get_trace_settings()["trace_mode"] == "opentelemetry"
        for index in range(6):
            client.infer("sampled", _inputs(httpclient), request_id=f"rate-{index}")
        client.infer("sampled", _inputs(httpclient), request_id="forced", headers={"traceparent": TRACEPARENT})
    forced = receiver.trace(lambda s: _attributes(s).get("triton.request_id") == "forced", 1)
    assert forced  # the 7th request is not on the 1-in-3 beat: traced because it carried a trace context
    # every request before it was exported already (one exporter queue, in order), so the count is final
    sampled = [s for _, s, _ in receiver.spans if s.name == "sampled" and str(_attributes(s).get("triton.request_id")).startswith("rate-")]
    assert sorted(_attributes(s)["triton.request_id"] for s in sampled) == ["rate-2", "rate-5"]
