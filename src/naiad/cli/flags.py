"""tritonserver-compatible flags -> ServerConfig; nothing else lives here."""

from __future__ import annotations

import argparse
import os

from naiad.cli.arg_types import parse_bool, parse_positive_ms, parse_positive_secs
from naiad.cli.deploy_flags import add_deploy_flags, default_repositories, deploy_settings, vertex_defaults
from naiad.config.server_config import ServerConfig


def parse_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a byte count, got '{text}'") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def _size(text: str) -> int:
    from naiad.runtime.memory import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _bool_flag(parser: argparse.ArgumentParser, name: str, default: bool, help_text: str) -> None:
    parser.add_argument(name, type=parse_bool, nargs="?", const=True, default=default, metavar="BOOL", help=help_text)


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
    d = ServerConfig()
    parser.add_argument("--model-repository", "--model-store", action="append", default=[], dest="model_repository",
                        metavar="PATH", help="model repository directory (repeatable)")
    parser.add_argument("--id", default=d.server_id, help="server identifier reported by /v2")
    _bool_flag(parser, "--allow-http", d.allow_http, "serve HTTP/REST")
    parser.add_argument("--http-address", default=d.http_address)
    parser.add_argument("--http-port", type=int, default=d.http_port, help="0 picks a free port")
    parser.add_argument("--http-max-input-size", type=parse_size, default=d.http_max_input_size,
                        help="largest accepted HTTP request body, in bytes (default 64 MiB)")
    parser.add_argument("--http-header-timeout-secs", type=float, default=d.http_header_timeout_secs,
                        help="close connections whose request headers are not complete within this time")
    parser.add_argument("--http-body-timeout-secs", type=float, default=d.http_body_timeout_secs,
                        help="answer 408 when a request body is not complete within this time")
    parser.add_argument("--openai-port", type=int, default=d.openai_port,
                        help="also serve the OpenAI-compatible API (/v1) alone on this port (on --http-address; 0 = free port)")
    _bool_flag(parser, "--allow-grpc", d.allow_grpc, "serve gRPC")
    parser.add_argument("--grpc-address", default=d.grpc_address)
    parser.add_argument("--grpc-port", type=int, default=d.grpc_port, help="0 picks a free port")
    parser.add_argument("--grpc-server-impl", choices=["naiad", "grpcio"], default=d.grpc_server_impl,
                        help="gRPC server implementation: Naiad's own HTTP/2 server (default) or grpcio's grpc.aio")
    parser.add_argument("--grpc-incomplete-request-timeout-secs", type=parse_positive_secs,
                        default=d.grpc_incomplete_request_timeout_secs,
                        help="reset a gRPC call whose request stops arriving half-way for this long (and close a "
                        "connection stuck in a partial frame or its preface); Naiad's gRPC server only")
    parser.add_argument("--grpc-max-message-size", type=parse_size, default=d.grpc_max_message_size,
                        help="largest gRPC request message accepted, in bytes; larger ones fail RESOURCE_EXHAUSTED "
                        "(default 2147483647, as Triton)")
    parser.add_argument("--grpc-max-decompressed-size", type=parse_size, default=d.grpc_max_decompressed_size,
                        help="largest size a compressed (grpc-encoding gzip/deflate) request message may inflate to, "
                        "in bytes; larger ones fail RESOURCE_EXHAUSTED (default 64 MiB); Naiad's gRPC server only")
    _bool_flag(parser, "--allow-metrics", d.allow_metrics, "serve Prometheus metrics")
    parser.add_argument("--metrics-address", default=None,
                        help="default: --http-address (0.0.0.0 when HTTP is off), as Triton")
    parser.add_argument("--metrics-port", type=int, default=d.metrics_port, help="0 picks a free port")
    parser.add_argument("--metrics-config", action="append", default=[], metavar="KEY=VALUE",
                        help="counter_latencies=, histogram_latencies=, summary_latencies=true|false; "
                             "summary_quantiles=<q>:<error>,...")
    parser.add_argument("--metrics-interval-ms", type=parse_positive_ms, default=d.metrics_interval_ms,
                        help="how often CPU, memory and GPU gauges are sampled (default 2000)")
    _bool_flag(parser, "--allow-cpu-metrics", d.allow_cpu_metrics, "export nv_cpu_* metrics")
    _bool_flag(parser, "--allow-gpu-metrics", d.allow_gpu_metrics, "export nv_gpu_* metrics when a GPU is present")
    parser.add_argument("--model-control-mode", choices=["none", "poll", "explicit"], default=d.model_control_mode)
    parser.add_argument("--load-model", action="append", default=[], metavar="NAME",
                        help="model to load at start in explicit mode ('*' = all)")
    _bool_flag(parser, "--strict-model-config", d.strict_model_config, "disable config auto-complete")
    _bool_flag(parser, "--disable-auto-complete-config", False, "same as --strict-model-config=true")
    _bool_flag(parser, "--strict-readiness", d.strict_readiness, "ready only when every model is ready")
    _bool_flag(parser, "--exit-on-error", d.exit_on_error, "exit when a model fails to load at start")
    parser.add_argument("--model-config-name", default="", help="use configs/<name>.pbtxt when present")
    parser.add_argument("--repository-poll-secs", type=float, default=d.repository_poll_secs)
    parser.add_argument("--model-load-thread-count", type=int, default=d.model_load_thread_count)
    _bool_flag(parser, "--load-on-demand", d.load_on_demand,
               "explicit mode: load a repository model on its first request instead of refusing it")
    parser.add_argument("--model-memory-budget", type=_size, default=None, metavar="SIZE",
                        help="keep loaded models under this much memory (e.g. 2GB); LRU idle models are unloaded")
    parser.add_argument("--model-idle-unload-secs", type=float, default=None, metavar="N",
                        help="unload models that received no request for N seconds")
    parser.add_argument("--backend-config", action="append", default=[], metavar="[BACKEND,]KEY=VALUE")
    parser.add_argument("--backend-directory", default=None, metavar="PATH",
                        help="Python-based backends: <PATH>/<name>/model.py serves models with backend: \"<name>\"")
    parser.add_argument("--cache-config", action="append", default=[], metavar="local,size=BYTES",
                        help="enable the response cache for models with response_cache { enable: true }")
    parser.add_argument("--response-cache-byte-size", type=int, default=None, help="deprecated: local cache size")
    parser.add_argument("--rate-limit", choices=["off", "execution_count"], default=d.rate_limit,
                        help="execution_count: instances execute only when their group's rate limiter resources are free")
    parser.add_argument("--rate-limit-resource", action="append", default=[], metavar="NAME:COUNT[:DEVICE]",
                        help="copies of a rate limiter resource (device omitted = every device; repeatable)")
    _bool_flag(parser, "--allow-client-shm", d.allow_client_shm, "allow client shared-memory regions")
    parser.add_argument("--trace-config", action="append", default=[], metavar="[MODE,]KEY=VALUE",
                        help="rate=N, level=OFF|TIMESTAMPS|TENSORS, count=N, mode=triton|opentelemetry, triton,file=PATH, "
                             "triton,log-frequency=N, opentelemetry,url=URL, opentelemetry,resource=KEY=VALUE, "
                             "opentelemetry,bsp_max_queue_size=N|bsp_schedule_delay=MS|bsp_max_export_batch_size=N")
    for old in ("file", "level", "rate", "count", "log-frequency"):
        parser.add_argument(f"--trace-{old}", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--exit-timeout-secs", type=float, default=d.exit_timeout_secs)
    parser.add_argument("--log-verbose", type=int, default=d.log_verbose, help="verbose logging level (0 = off)")
    _bool_flag(parser, "--log-info", d.log_info, "log info messages")
    _bool_flag(parser, "--log-warning", d.log_warning, "log warnings")
    _bool_flag(parser, "--log-error", d.log_error, "log errors")
    parser.add_argument("--log-format", choices=["default", "ISO8601"], default=d.log_format)
    parser.add_argument("--log-file", default=d.log_file, help="write the log to this file instead of stderr")
    add_deploy_flags(parser, os.environ)
    parser.set_defaults(**vertex_defaults(os.environ))


def _backend_config(entries: list[str]) -> dict[str, dict[str, str]]:
    result: dict[str, dict[str, str]] = {}
    for entry in entries:
        head, _, setting = entry.rpartition(",")
        key, sep, value = setting.partition("=")
        if not sep or not key:
            raise SystemExit(f"--backend-config expects [<backend>,]<key>=<value>, got '{entry}'")
        result.setdefault(head, {})[key] = value
    return result


def _cache_bytes(args: argparse.Namespace) -> int | None:
    from naiad.core.response_cache import parse_cache_config

    try:
        size = parse_cache_config(args.cache_config)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    return size if size is not None else args.response_cache_byte_size


def _rate_limit_resources(entries: list[str]) -> list[str]:
    from naiad.scheduling.rate_limiter import parse_resource_override

    try:
        for entry in entries:
            parse_resource_override(entry)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    return list(entries)


def _metrics_config(entries: list[str]) -> dict[str, str]:
    from naiad.observability.metrics import parse_metrics_config

    try:
        return parse_metrics_config(entries)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def _trace_entries(args: argparse.Namespace) -> list[str]:
    """--trace-config plus the deprecated --trace-* flags, validated here so errors show at start."""
    from naiad.observability.tracing import parse_trace_config

    entries = list(args.trace_config)
    for flag, key in (("trace_file", "triton,file"), ("trace_level", "level"), ("trace_rate", "rate"),
                      ("trace_count", "count"), ("trace_log_frequency", "triton,log-frequency")):
        entries += [f"{key}={value}" for value in getattr(args, flag)]
    try:
        config = parse_trace_config(entries)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if config.mode == "opentelemetry":
        from naiad.observability.otel import OtelUnavailable, require_sdk

        try:
            require_sdk()
        except OtelUnavailable as exc:
            raise SystemExit(str(exc)) from None
    return entries


def _metrics_address(args: argparse.Namespace) -> str:
    """--metrics-address, else --http-address (0.0.0.0 when HTTP is off), as Triton."""
    if args.metrics_address is not None:
        return args.metrics_address
    return args.http_address if args.allow_http else ServerConfig().metrics_address


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    repositories = list(args.model_repository) or default_repositories(os.environ)
    if not repositories:
        raise SystemExit("--model-repository is required")
    return ServerConfig(
        model_repositories=repositories,
        server_id=args.id,
        allow_http=args.allow_http,
        http_address=args.http_address,
        http_port=args.http_port,
        http_max_input_size=args.http_max_input_size,
        http_header_timeout_secs=args.http_header_timeout_secs,
        http_body_timeout_secs=args.http_body_timeout_secs,
        openai_port=args.openai_port,
        allow_grpc=args.allow_grpc,
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        grpc_server_impl=args.grpc_server_impl,
        grpc_incomplete_request_timeout_secs=args.grpc_incomplete_request_timeout_secs,
        grpc_max_message_size=args.grpc_max_message_size,
        grpc_max_decompressed_size=args.grpc_max_decompressed_size,
        allow_metrics=args.allow_metrics,
        metrics_address=_metrics_address(args),
        metrics_port=args.metrics_port,
        metrics_config=_metrics_config(args.metrics_config),
        allow_cpu_metrics=args.allow_cpu_metrics,
        allow_gpu_metrics=args.allow_gpu_metrics,
        metrics_interval_ms=args.metrics_interval_ms,
        model_control_mode=args.model_control_mode,
        load_models=list(args.load_model),
        strict_model_config=args.strict_model_config or args.disable_auto_complete_config,
        strict_readiness=args.strict_readiness,
        exit_on_error=args.exit_on_error,
        model_config_name=args.model_config_name,
        repository_poll_secs=args.repository_poll_secs,
        model_load_thread_count=args.model_load_thread_count,
        load_on_demand=args.load_on_demand,
        model_memory_budget=args.model_memory_budget,
        model_idle_unload_secs=args.model_idle_unload_secs,
        backend_config=_backend_config(args.backend_config),
        backend_directory=args.backend_directory,
        allow_client_shm=args.allow_client_shm,
        response_cache_bytes=_cache_bytes(args),
        rate_limit=args.rate_limit,
        rate_limit_resources=_rate_limit_resources(args.rate_limit_resource),
        trace_config=_trace_entries(args),
        exit_timeout_secs=args.exit_timeout_secs,
        log_verbose=args.log_verbose,
        log_info=args.log_info,
        log_warning=args.log_warning,
        log_error=args.log_error,
        log_format=args.log_format,
        log_file=args.log_file,
        **deploy_settings(args, os.environ),
    )
