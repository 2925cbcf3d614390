"""Unit tests of the deployment-safety pieces: restriction parsing and grouping, header forwarding, model names."""

from __future__ import annotations

import re

import pytest
from tritonclient.grpc import service_pb2 as pb

from naiad.config.server_config import ServerConfig
from naiad.core.server import Server
from naiad.frontends.grpc.guard import GuardInterceptor
from naiad.frontends.http.guard import NAME_VERDICT_PATH_BYTES, NAME_VERDICTS_KEPT, HttpGuard
from naiad.frontends.http.listener import tls_options
from naiad.frontends.http.routes import build_router
from naiad.frontends.security import (
    API_GROUPS,
    GRPC_MODEL_NAME_FIELDS,
    GRPC_RPC_GROUPS,
    HeaderForwarder,
    Restriction,
    check_model_name,
    http_api_group,
    http_model_name,
    metadata_value,
    model_name_problem,
    parse_restrictions,
)
from naiad.protocol.errors import ErrorCode, NaiadError


def test_restrictions_parse_groups_key_and_value():
    parsed = parse_restrictions(["health,metadata:X-Key=abc", "inference:token=t=1"], "http-restricted-api")
    assert parsed == {
        "health": Restriction("x-key", "abc"),
        "metadata": Restriction("x-key", "abc"),
        "inference": Restriction("token", "t=1"),  # the value may itself hold '='
    }


def test_grpc_restrictions_carry_the_protocol_prefix():
    parsed = parse_restrictions(["model-repository:admin=1"], "grpc-restricted-protocol", "triton-grpc-protocol-")
    assert parsed["model-repository"].key == "triton-grpc-protocol-admin"


@pytest.mark.parametrize("entry,message", [
    ("health", "option format is"),
    ("health:key", "option format is"),
    (":k=v", "option format is"),
    ("health:=v", "option format is"),
    ("health:k=", "option format is"),
    ("healthz:k=v", "unknown restricted API 'healthz'"),
])
def test_bad_restrictions_are_refused(entry, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_restrictions([entry], "http-restricted-api")


def test_a_group_may_be_restricted_once():
    with pytest.raises(ValueError, match="can not be specified in multiple config groups"):
        parse_restrictions(["health:a=1", "metadata,health:b=2"], "http-restricted-api")


def test_restriction_compares_the_exact_value():
    restriction = Restriction("k", "secret")
    assert restriction.allows("secret")
    assert not restriction.allows("Secret") and not restriction.allows(None) and not restriction.allows("secret ")


def _concrete(path: str) -> str:
    return (path.replace("{version:naiad_version}", "3").replace("{model}", "m")
            .replace("{repository}", "r").replace("{region}", "reg"))


def test_every_http_route_belongs_to_a_restriction_group(tmp_path):
    server = Server(ServerConfig(model_repositories=[str(tmp_path)]))
    router = build_router(server)
    paths = {_concrete(route.path) for route in router.routes}
    paths |= {"/v2/models/m/infer", "/v2/models/m/versions/3/infer",  # the table's fast entries
              "/v2/models/m/generate", "/v2/models/m/versions/3/generate_stream"}
    assert len(paths) > 30
    for path in paths:
        assert http_api_group(path) in API_GROUPS, path


@pytest.mark.parametrize("path,group", [
    ("/v2/health/live", "health"), ("/v2/models/m/versions/2/ready", "health"),
    ("/v2", "metadata"), ("/v2/models/m", "metadata"),
    ("/v2/models/m/infer", "inference"), ("/v2/models/m/generate_stream", "inference"),
    ("/v2/models/m/config", "model-config"), ("/v2/models/stats", "statistics"),
    ("/v2/models/m/versions/1/stats", "statistics"), ("/v2/repository/index", "model-repository"),
    ("/v2/repository/r/models/m/unload", "model-repository"),
    ("/v2/cudasharedmemory/region/x/register", "shared-memory"), ("/v2/trace/setting", "trace"),
    ("/v2/models/m/trace/setting", "trace"), ("/v2/logging", "logging"),
    ("/v2/unknown", None), ("/v2/models/m/nothing", None), ("/metrics", None), ("/", None),
])
def test_http_paths_map_to_tritonservers_groups(path, group):
    assert http_api_group(path) == group


def test_every_grpc_rpc_belongs_to_a_restriction_group():
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in service.methods:
        assert GRPC_RPC_GROUPS.get(method.name) in API_GROUPS, method.name


def test_model_name_fields_exist_on_the_request_messages():
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    inputs = {method.name: method.input_type for method in service.methods}
    for rpc, field in GRPC_MODEL_NAME_FIELDS.items():
        assert field in inputs[rpc].fields_by_name, rpc


def test_grpc_guard_parses_its_flags():
    guard = GuardInterceptor(["logging:k=v"], "(?-i)^x-")
    assert guard.restrictions == {"logging": Restriction("triton-grpc-protocol-k", "v")}
    assert guard.forwarder is not None and guard.forwarder.matches("x-a") and not guard.forwarder.matches("X-a")


def test_forwarding_is_case_insensitive_by_default():
    forwarder = HeaderForwarder("^X-Tenant")
    assert forwarder.forwarded([(b"x-tenant", b"acme"), (b"x-other", b"no")]) == {"x-tenant": "acme"}


def test_forwarding_prefix_makes_it_case_sensitive():
    forwarder = HeaderForwarder("(?-i)^X-Tenant")
    assert forwarder.forwarded([("X-Tenant", "a"), ("x-tenant", "b")]) == {"X-Tenant": "a"}


def test_forwarding_searches_anywhere_in_the_name():
    assert HeaderForwarder("tenant").matches("x-my-tenant-id")


def test_reserved_and_triton_names_are_never_forwarded():
    forwarder = HeaderForwarder(".*")
    headers = [("triton_grpc_error", "true"), ("TRITON_X", "1"), ("sequence_id", "7"), ("priority", "1"),
               ("timeout", "5"), ("x-ok", "yes"), ("trace-bin", b"\x00\x01")]
    assert forwarder.forwarded(headers) == {"x-ok": "yes"}


def test_forwarded_headers_do_not_replace_request_parameters():
    params = {"x-a": "body"}
    HeaderForwarder("^x-").apply([(b"x-a", b"header"), (b"x-b", b"header")], params)
    assert params == {"x-a": "body", "x-b": "header"}


def test_bad_forward_pattern_is_a_value_error():
    with pytest.raises(ValueError, match="invalid header forward pattern"):
        HeaderForwarder("(unclosed")


@pytest.mark.parametrize("name", ["..", ".", "a/b", "../x", "a\\b", "a\x00b", "/abs"])
def test_unsafe_model_names(name):
    assert model_name_problem(name) is not None
    with pytest.raises(NaiadError) as info:
        check_model_name(name)
    assert info.value.code == ErrorCode.INVALID_ARG and "invalid model name" in info.value.message


@pytest.mark.parametrize("name", ["add_sub", "a..b", "..x", "model-1.onnx", "", "名前"])
def test_ordinary_model_names(name):
    assert model_name_problem(name) is None
    check_model_name(name)


@pytest.mark.parametrize("raw,name", [
    (b"/v2/models/m/infer", "m"), (b"/v2/models/a%2Fb/config", "a/b"), (b"/v2/models/%2E%2E", ".."),
    (b"/v2/repository/models/x/load", "x"), (b"/v2/repository/r/models/y/unload", "y"),
    (b"/v2/models/stats", None), (b"/v2/health/ready", None), (b"/v2/repository/index", None),
    (b"/v2/models/a%00b/ready", "a\x00b"), (b"/ping", None),
])
def test_model_name_is_read_from_the_raw_path(raw, name):
    assert http_model_name(raw) == name


def test_the_http_guard_gives_the_same_model_name_verdict_every_time():
    """Verdicts are remembered per raw path (a bounded number of short paths): asked again, or after
    the memory was emptied, or for a path too long to remember, the answer is the same."""
    guard = HttpGuard([])
    bad = {"path": "/v2/models/a/b/infer", "raw_path": b"/v2/models/a%2Fb/infer", "headers": []}
    good = {"path": "/v2/models/m/infer", "raw_path": b"/v2/models/m/infer", "headers": []}
    long_bad = {"path": "", "raw_path": b"/v2/models/" + b"x" * NAME_VERDICT_PATH_BYTES + b"%2F/infer", "headers": []}
    for _ in range(2):
        assert guard.refusal(bad) == (400, "invalid model name 'a/b': a model name cannot contain '/'")
        assert guard.refusal(good) is None
        assert guard.refusal(long_bad)[0] == 400
    for index in range(NAME_VERDICTS_KEPT + 5):
        assert guard.refusal({"path": "", "raw_path": b"/v2/models/m%d/ready" % index, "headers": []}) is None
    assert len(guard._name_verdicts) <= NAME_VERDICTS_KEPT
    assert guard.refusal(bad)[0] == 400 and guard.refusal(good) is None


def test_metadata_lookup_is_case_insensitive_and_decodes_bytes():
    assert metadata_value((("Triton-Grpc-Protocol-K", b"v"),), "triton-grpc-protocol-k") == "v"
    assert metadata_value({"a": "1"}, "a") == "1"
    assert metadata_value(None, "a") is None


def test_tls_options():
    assert tls_options("", "", "", False) == {}
    plain = tls_options("c.pem", "k.pem", "", False)
    assert plain == {"ssl_certfile": "c.pem", "ssl_keyfile": "k.pem"}
    import ssl

    assert tls_options("c.pem", "", "ca.pem", True)["ssl_cert_reqs"] == ssl.CERT_REQUIRED
    assert tls_options("c.pem", "", "ca.pem", False)["ssl_cert_reqs"] == ssl.CERT_OPTIONAL
    with pytest.raises(ValueError):
        tls_options("c.pem", "", "", True)
    with pytest.raises(ValueError):
        tls_options("", "k.pem", "", False)
