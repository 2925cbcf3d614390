"""Deployment flags (TLS, restricted APIs, header forwarding, stream limits, SageMaker, Vertex AI) and the
cloud platforms' environment variables -> ServerConfig settings. The only place these variables are read."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from naiad.cli.arg_types import parse_bool
from naiad.config.server_config import ServerConfig

# Environment variables the platforms set (read here, at the edge, and nowhere else).
SAGEMAKER_DEFAULT_MODEL = "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"
SAGEMAKER_PING_MODE = "SAGEMAKER_TRITON_PING_MODE"
SAGEMAKER_INFERENCE_TYPE = "SAGEMAKER_TRITON_INFERENCE_TYPE"
SAGEMAKER_PORT = "SAGEMAKER_BIND_TO_PORT"
AIP_MODE = "AIP_MODE"
AIP_HTTP_PORT = "AIP_HTTP_PORT"
AIP_HEALTH_ROUTE = "AIP_HEALTH_ROUTE"
AIP_PREDICT_ROUTE = "AIP_PREDICT_ROUTE"
AIP_STORAGE_URI = "AIP_STORAGE_URI"


def parse_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def _port(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name, "")
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise SystemExit(f"environment variable {name}='{text}' is not a port number") from None


def vertex_mode(env: Mapping[str, str]) -> bool:
    """Vertex AI sets AIP_MODE=PREDICTION in the serving container (tritonserver reacts the same way)."""
    return env.get(AIP_MODE, "") == "PREDICTION"


def _bool_flag(parser: argparse._ActionsContainer, name: str, default: bool, help_text: str) -> None:
    parser.add_argument(name, type=parse_bool, nargs="?", const=True, default=default, metavar="BOOL", help=help_text)


def add_deploy_flags(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """Security and cloud flags; defaults follow the platform's environment like tritonserver's."""
    http = parser.add_argument_group("HTTP security")
    http.add_argument("--http-ssl-certfile", default="", metavar="PEM", help="serve HTTPS with this certificate (chain)")
    http.add_argument("--http-ssl-keyfile", default="", metavar="PEM", help="private key of --http-ssl-certfile")
    http.add_argument("--http-ssl-ca-certs", default="", metavar="PEM",
                      help="CA bundle that verifies client certificates (optional client auth unless required)")
    _bool_flag(http, "--http-ssl-client-cert-required", False, "refuse HTTPS clients without a certificate signed by --http-ssl-ca-certs")
    http.add_argument("--http-restricted-api", action="append", default=[], metavar="API[,API...]:KEY=VALUE",
                      help="require header KEY: VALUE for these API groups (health, metadata, inference, shared-memory, "
                           "model-config, model-repository, statistics, trace, logging); repeatable")
    http.add_argument("--http-header-forward-pattern", default="", metavar="REGEX",
                      help="forward matching request headers as string parameters (case-insensitive unless '(?-i)' prefix)")
    grpc = parser.add_argument_group("gRPC security")
    _bool_flag(grpc, "--grpc-use-ssl", False, "serve gRPC over TLS (needs --grpc-server-cert/--grpc-server-key)")
    _bool_flag(grpc, "--grpc-use-ssl-mutual", False, "TLS with client certificates checked against --grpc-root-cert")
    grpc.add_argument("--grpc-server-cert", default="", metavar="PEM", help="gRPC TLS server certificate (chain)")
    grpc.add_argument("--grpc-server-key", default="", metavar="PEM", help="private key of --grpc-server-cert")
    grpc.add_argument("--grpc-root-cert", default="", metavar="PEM",
                      help="CA bundle that verifies client certificates (--grpc-use-ssl-mutual)")
    grpc.add_argument("--grpc-restricted-protocol", action="append", default=[], metavar="PROTOCOL[,...]:KEY=VALUE",
                      help="require metadata 'triton-grpc-protocol-KEY: VALUE' for these groups; repeatable")
    grpc.add_argument("--grpc-header-forward-pattern", default="", metavar="REGEX",
                      help="forward matching metadata as string parameters (case-insensitive unless '(?-i)' prefix)")
    grpc.add_argument("--grpc-max-concurrent-streams", type=parse_count, default=ServerConfig().grpc_max_concurrent_streams,
                      metavar="N", help="concurrent RPCs per client connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; "
                      "more are refused with REFUSED_STREAM); 0 = no limit")
    grpc.add_argument("--grpc-max-concurrent-rpcs", type=parse_count, default=0, metavar="N",
                      help="RPCs in flight on the whole server; more fail with RESOURCE_EXHAUSTED; 0 = no limit")
    cloud = parser.add_argument_group("cloud frontends (listen on --http-address)")
    _bool_flag(cloud, "--allow-sagemaker", False, "serve the SageMaker routes (/ping, /invocations, /models)")
    cloud.add_argument("--sagemaker-port", type=int, default=_port(env, SAGEMAKER_PORT, 8080),
                       help=f"SageMaker port (default ${SAGEMAKER_PORT} or 8080; 0 picks a free port)")
    _bool_flag(cloud, "--allow-vertex-ai", vertex_mode(env), f"serve the Vertex AI routes (default true when {AIP_MODE}=PREDICTION)")
    cloud.add_argument("--vertex-ai-port", type=int, default=_port(env, AIP_HTTP_PORT, 8080),
                       help=f"Vertex AI port (default ${AIP_HTTP_PORT} or 8080; 0 picks a free port)")
    cloud.add_argument("--vertex-ai-default-model", default="", metavar="NAME",
                       help="model the predict route serves (default: the repository's only model)")


def vertex_defaults(env: Mapping[str, str]) -> dict[str, bool]:
    """Under AIP_MODE=PREDICTION the plain HTTP and gRPC frontends are off unless asked for."""
    return {"allow_http": False, "allow_grpc": False} if vertex_mode(env) else {}


def default_repositories(env: Mapping[str, str]) -> list[str]:
    """AIP_STORAGE_URI stands in for a missing --model-repository (as tritonserver does)."""
    uri = env.get(AIP_STORAGE_URI, "")
    return [uri] if uri else []


def _check(args: argparse.Namespace) -> None:
    """Fail at start, with the flag's name, on settings the frontends would refuse."""
    from naiad.frontends.security import HeaderForwarder, parse_restrictions

    try:
        parse_restrictions(args.http_restricted_api, "http-restricted-api")
        parse_restrictions(args.grpc_restricted_protocol, "grpc-restricted-protocol")
        for pattern in (args.http_header_forward_pattern, args.grpc_header_forward_pattern):
            if pattern:
                HeaderForwarder(pattern)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if (args.grpc_use_ssl or args.grpc_use_ssl_mutual) and not (args.grpc_server_cert and args.grpc_server_key):
        raise SystemExit("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
    if args.grpc_use_ssl_mutual and not args.grpc_root_cert:
        raise SystemExit("--grpc-use-ssl-mutual needs --grpc-root-cert")
    if args.http_ssl_client_cert_required and not args.http_ssl_ca_certs:
        raise SystemExit("--http-ssl-client-cert-required needs --http-ssl-ca-certs")
    if (args.http_ssl_keyfile or args.http_ssl_ca_certs) and not args.http_ssl_certfile:
        raise SystemExit("--http-ssl-keyfile/--http-ssl-ca-certs need --http-ssl-certfile")


def deploy_settings(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    """ServerConfig fields of the deployment flags and the platforms' environment variables."""
    _check(args)
    settings: dict[str, Any] = {
        "http_ssl_certfile": args.http_ssl_certfile,
        "http_ssl_keyfile": args.http_ssl_keyfile,
        "http_ssl_ca_certs": args.http_ssl_ca_certs,
        "http_ssl_client_cert_required": args.http_ssl_client_cert_required,
        "http_restricted_api": list(args.http_restricted_api),
        "http_header_forward_pattern": args.http_header_forward_pattern,
        "grpc_use_ssl": args.grpc_use_ssl or args.grpc_use_ssl_mutual,
        "grpc_use_ssl_mutual": args.grpc_use_ssl_mutual,
        "grpc_server_cert": args.grpc_server_cert,
        "grpc_server_key": args.grpc_server_key,
        "grpc_root_cert": args.grpc_root_cert,
        "grpc_restricted_protocol": list(args.grpc_restricted_protocol),
        "grpc_header_forward_pattern": args.grpc_header_forward_pattern,
        "grpc_max_concurrent_streams": args.grpc_max_concurrent_streams,
        "grpc_max_concurrent_rpcs": args.grpc_max_concurrent_rpcs,
        "allow_sagemaker": args.allow_sagemaker,
        "sagemaker_port": args.sagemaker_port,
        "sagemaker_default_model": env.get(SAGEMAKER_DEFAULT_MODEL, ""),
        "sagemaker_ping_mode": env.get(SAGEMAKER_PING_MODE, "") or "ready",
        "sagemaker_inference_type": env.get(SAGEMAKER_INFERENCE_TYPE, "") or "infer",
        "allow_vertex_ai": args.allow_vertex_ai,
        "vertex_ai_port": args.vertex_ai_port,
        "vertex_ai_default_model": args.vertex_ai_default_model,
        "vertex_ai_health_route": env.get(AIP_HEALTH_ROUTE, ""),
        "vertex_ai_predict_route": env.get(AIP_PREDICT_ROUTE, ""),
    }
    if settings["sagemaker_ping_mode"] not in ("ready", "live"):
        raise SystemExit(f"{SAGEMAKER_PING_MODE} must be 'ready' or 'live', got '{settings['sagemaker_ping_mode']}'")
    if settings["sagemaker_inference_type"] not in ("infer", "generate", "generate_stream"):
        raise SystemExit(f"{SAGEMAKER_INFERENCE_TYPE} must be infer, generate or generate_stream, "
                         f"got '{settings['sagemaker_inference_type']}'")
    if args.allow_vertex_ai:
        for name, key in ((AIP_PREDICT_ROUTE, "vertex_ai_predict_route"), (AIP_HEALTH_ROUTE, "vertex_ai_health_route")):
            route = settings[key]
            if not route:
                raise SystemExit(f"{name} is not defined for the Vertex AI endpoint (--allow-vertex-ai=true)")
            if not route.startswith("/"):
                settings[key] = "/" + route
    return settings
