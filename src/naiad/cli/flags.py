"""tritonserver-compatible flags -> ServerConfig; nothing else lives here."""

from __future__ import annotations

import argparse
import os
import re

from naiad.cli.arg_types import parse_bool, parse_positive_ms, parse_positive_secs
from naiad.cli.deploy_flags import (
    add_deploy_flags,
    default_repositories,
    deploy_settings,
    vertex_defaults,
)
from naiad.config.cpu_placement import (
    AUTO_FRONTEND_CAP,
    AUTO_FRONTEND_MIN_CPUS,
    auto_frontend_processes,
    usable_cpu_count,
)
from naiad.config.server_config import ServerConfig
from naiad.core.idle_spin import SERVE_WINDOW_US


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


def _shown_default(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None or value == [] or value == "":
        return "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


MAX_FRONTEND_PROCESSES = 64
AUTO = "auto"
MAX_CORE_CONNECTIONS = 1 << 16
MAX_IDLE_SPIN_US = 10_000  # a poll longer than this would only burn the CPU: the next request is not that close
_MENTIONS_DEFAULT = re.compile(r"(?<![-\w])default(?![-\w])", re.IGNORECASE)  # not default-max-batch-size


class ServeHelpFormatter(argparse.HelpFormatter):
    """Every flag's help ends with its default, unless the help already says what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if not action.option_strings or action.nargs == 0 or action.default is argparse.SUPPRESS:
            return text
        if action.required or "(required)" in text or _MENTIONS_DEFAULT.search(text):
            return text
        return f"{text} (default: {_shown_default(action.default)})".replace("%", "%%").replace("%%(", "%(")


# tritonserver flags with nothing to tune in Naiad: accepted so a Triton command line starts, and named
# in a warning at start-up (flag -> why it does nothing here).
IGNORED_TRITON_FLAGS = {
    "--http-thread-count": "HTTP requests are served on the event loop, not by a thread pool",
    "--sagemaker-thread-count": "SageMaker requests are served on the event loop",
    "--vertex-ai-thread-count": "Vertex AI requests are served on the event loop",
    "--buffer-manager-thread-count": "there is no buffer-manager thread pool",
    "--grpc-infer-allocation-pool-size": "gRPC messages are not pooled",
    "--grpc-infer-response-compression-level": "responses are not compressed by the server",
    "--grpc-keepalive-time": "gRPC keepalive is not configurable",
    "--grpc-keepalive-timeout": "gRPC keepalive is not configurable",
    "--grpc-keepalive-permit-without-calls": "gRPC keepalive is not configurable",
    "--grpc-http2-max-pings-without-data": "HTTP/2 ping policy is not configurable",
    "--grpc-http2-min-recv-ping-interval-without-data": "HTTP/2 ping policy is not configurable",
    "--grpc-http2-max-ping-strikes": "HTTP/2 ping policy is not configurable",
    "--grpc-max-connection-age": "connections are not aged out",
    "--grpc-max-connection-age-grace": "connections are not aged out",
    "--reuse-http-port": "ports are never shared (SO_REUSEPORT is off)",
    "--reuse-grpc-port": "ports are never shared (SO_REUSEPORT is off)",
    "--pinned-memory-pool-byte-size": "there is no CUDA pinned memory without a GPU backend",
    "--cuda-memory-pool-byte-size": "CUDA memory is managed by each framework (ONNX Runtime, PyTorch)",
    "--cuda-virtual-address-size": "CUDA memory is managed by each framework",
    "--min-supported-compute-capability": "GPU checks are left to each framework",
    "--enable-peer-access": "CUDA peer access is left to each framework",
    "--model-load-gpu-limit": "model loads are not limited by GPU memory",
    "--host-policy": "there are no NUMA host policies",
    "--model-load-retry-count": "a failed load is not retried (reload it with the repository API)",
}


# tritonserver flags whose meaning Naiad cannot honour: refused with the reason rather than "unrecognized".
REFUSED_TRITON_FLAGS = {
    "--model-namespacing": "model names must be unique across repositories (rename the duplicates)",
    "--repoagent-directory": "repository agents (checksum, decryption) are not supported",
    "--cache-directory": "the response cache is built in (--cache-config local,size=BYTES); there are no cache libraries",
    "--sagemaker-safe-port-range": "give --sagemaker-port instead",
}


class _Refused(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if isinstance(values, str) and values.strip().lower() in ("false", "0", "no", "off"):
            return  # switched off: what Naiad does anyway
        parser.error(f"{option_string} is not supported by Naiad: {REFUSED_TRITON_FLAGS[self.option_strings[0]]}")


def _add_ignored_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tritonserver flags accepted and ignored")
    for flag, why in IGNORED_TRITON_FLAGS.items():
        group.add_argument(flag, nargs="?", const="true", default=None, action="append", metavar="VALUE",
                           dest="ignored_" + flag[2:].replace("-", "_"), help=f"ignored: {why}")
    refused = parser.add_argument_group("tritonserver flags refused")
    for flag, why in REFUSED_TRITON_FLAGS.items():
        refused.add_argument(flag, nargs="?", action=_Refused, default=argparse.SUPPRESS, metavar="VALUE",
                             help=f"refused: {why}")


def ignored_flag_warnings(args: argparse.Namespace) -> list[str]:
    """One warning per tritonserver flag given that Naiad ignores."""
    return [f"{flag} is ignored: {why}" for flag, why in IGNORED_TRITON_FLAGS.items()
            if getattr(args, "ignored_" + flag[2:].replace("-", "_"), None) is not None]


def missing_repository(args: argparse.Namespace) -> bool:
    """No --model-repository and no platform variable naming one."""
    return not args.model_repository and not default_repositories(os.environ)


def _whole_number(text: str, what: str, most: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of {what}, got '{text}'") from None
    if not 0 <= value <= most:
        raise argparse.ArgumentTypeError(f"must be between 0 and {most}, got {value}")
    return value


def _process_count(text: str) -> int | str:
    if text == AUTO:
        return AUTO
    return _whole_number(text, "processes", MAX_FRONTEND_PROCESSES)


def _connection_count(text: str) -> int:
    return _whole_number(text, "connections", MAX_CORE_CONNECTIONS)


def _idle_spin_us(text: str) -> int:
    return _whole_number(text, "microseconds", MAX_IDLE_SPIN_US)


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
    d = ServerConfig()
    required = parser.add_argument_group("required")
    required.add_argument("--model-repository", "--model-store", action="append", default=[], dest="model_repository",
                          metavar="PATH", help="directory holding one directory per model (Triton's layout); "
                          "repeatable; also s3://, gs://, as:// URLs (required)")
    parser.add_argument("--id", default=d.server_id, help="server name reported by GET /v2")
    _bool_flag(parser, "--allow-http", d.allow_http, "serve HTTP/REST")
    parser.add_argument("--http-address", default=d.http_address, metavar="ADDRESS",
                        help="address the HTTP/REST endpoint listens on (127.0.0.1 = this host only)")
    parser.add_argument("--http-port", type=int, default=d.http_port, metavar="PORT",
                        help="HTTP/REST port (KServe v2, Triton extensions, OpenAI /v1); 0 picks a free port")
    parser.add_argument("--http-max-input-size", type=parse_size, default=d.http_max_input_size,
                        metavar="BYTES", help="largest accepted HTTP request body, in bytes")
    parser.add_argument("--http-header-timeout-secs", type=float, default=d.http_header_timeout_secs,
                        metavar="SECS", help="close connections whose request headers are not complete within this time")
    parser.add_argument("--http-body-timeout-secs", type=float, default=d.http_body_timeout_secs,
                        metavar="SECS", help="answer 408 when a request body is not complete within this time")
    parser.add_argument("--frontend-processes", type=_process_count, default=AUTO, metavar="N",
                        help="serve the HTTP/REST port and the gRPC port from N worker processes each, "
                        "that decode and encode requests and hand them to this process (models, batching, "
                        "statistics, model control stay here, one server); 0 = all in this process; "
                        f"auto (default) = 0 below {AUTO_FRONTEND_MIN_CPUS} usable CPUs, else half of them, "
                        f"at most {AUTO_FRONTEND_CAP}")
    parser.add_argument("--frontend-core-connections", type=_connection_count, default=d.frontend_core_connections,
                        metavar="K", help="with --frontend-processes: this process serves up to K connections of "
                        "each port itself (no hop through a worker for a client alone) and hands the others to the "
                        "workers, which start once a port first has more than K connections open; 0 = all to the "
                        f"workers, started with the server (default: {d.frontend_core_connections})")
    parser.add_argument("--idle-spin-us", type=_idle_spin_us, default=SERVE_WINDOW_US, metavar="US",
                        help="after answering its last request in flight, the server polls for the next one for up "
                        "to US microseconds instead of sleeping, so a client's next request is read without "
                        "waiting for the CPU to wake (misses make the polls rarer); 0 = never "
                        f"(default: {SERVE_WINDOW_US})")
    parser.add_argument("--openai-port", type=int, default=d.openai_port, metavar="PORT",
                        help="also serve the OpenAI-compatible API (/v1) alone on this port, on --http-address "
                        "(0 = free port; default: off, /v1 is on the HTTP port anyway)")
    _bool_flag(parser, "--allow-grpc", d.allow_grpc, "serve gRPC")
    parser.add_argument("--grpc-address", default=d.grpc_address, metavar="ADDRESS",
                        help="address the gRPC endpoint listens on")
    parser.add_argument("--grpc-port", type=int, default=d.grpc_port, metavar="PORT",
                        help="gRPC port (inference.GRPCInferenceService); 0 picks a free port")
    parser.add_argument("--grpc-server-impl", choices=["naiad", "grpcio"], default=d.grpc_server_impl,
                        help="gRPC server implementation: Naiad's own HTTP/2 server (default; about twice "
                        "grpcio's calls per second, with the defences against the attacks listed in "
                        "docs/security.md: rapid reset, frame floods, unread writes, compression bombs) or "
                        "grpcio's grpc.aio (gRPC C-core, as Triton); either one in each --frontend-processes worker")
    parser.add_argument("--grpc-incomplete-request-timeout-secs", type=parse_positive_secs,
                        default=d.grpc_incomplete_request_timeout_secs, metavar="SECS",
                        help="reset a gRPC call whose request stops arriving half-way for this long (and close a "
                        "connection stuck in a partial frame or its preface, or whose client reads nothing); "
                        "Naiad's gRPC server only")
    parser.add_argument("--grpc-max-message-size", type=parse_size, default=d.grpc_max_message_size, metavar="BYTES",
                        help="largest gRPC request message accepted, in bytes; larger ones fail RESOURCE_EXHAUSTED "
                        "(default 2147483647, as Triton; both gRPC servers)")
    parser.add_argument("--grpc-max-decompressed-size", type=parse_size, default=d.grpc_max_decompressed_size,
                        metavar="BYTES", help="largest size a compressed (grpc-encoding gzip/deflate) request message "
                        "may inflate to, in bytes; larger ones fail RESOURCE_EXHAUSTED (default 64 MiB); "
                        "Naiad's gRPC server only")
    _bool_flag(parser, "--allow-metrics", d.allow_metrics, "serve Prometheus metrics")
    parser.add_argument("--metrics-address", default=None, metavar="ADDRESS",
                        help="address of the metrics endpoint (default: --http-address, 0.0.0.0 when HTTP is off)")
    parser.add_argument("--metrics-port", type=int, default=d.metrics_port, metavar="PORT",
                        help="Prometheus metrics port (GET /metrics); 0 picks a free port")
    parser.add_argument("--metrics-config", action="append", default=[], metavar="KEY=VALUE",
                        help="counter_latencies=, histogram_latencies=, summary_latencies=true|false; "
                             "summary_quantiles=<q>:<error>,... (repeatable)")
    parser.add_argument("--metrics-interval-ms", type=parse_positive_ms, default=d.metrics_interval_ms,
                        metavar="MS", help="how often CPU, memory and GPU gauges are sampled, in milliseconds")
    _bool_flag(parser, "--allow-cpu-metrics", d.allow_cpu_metrics, "export nv_cpu_* metrics")
    _bool_flag(parser, "--allow-gpu-metrics", d.allow_gpu_metrics, "export nv_gpu_* metrics when a GPU is present")
    parser.add_argument("--model-control-mode", choices=["none", "poll", "explicit"], default=d.model_control_mode,
                        help="none: load every model at start; poll: also follow repository changes; "
                        "explicit: load only --load-model and what clients load")
    parser.add_argument("--load-model", action="append", default=[], metavar="NAME",
                        help="model to load at start in explicit mode ('*' = all; repeatable)")
    _bool_flag(parser, "--strict-model-config", d.strict_model_config, "disable config auto-complete")
    _bool_flag(parser, "--disable-auto-complete-config", False, "same as --strict-model-config=true")
    _bool_flag(parser, "--strict-readiness", d.strict_readiness, "ready only when every model is ready")
    _bool_flag(parser, "--exit-on-error", d.exit_on_error, "exit when a model fails to load at start")
    parser.add_argument("--model-config-name", default="", metavar="NAME",
                        help="use <model>/configs/<NAME>.pbtxt instead of config.pbtxt where present")
    parser.add_argument("--repository-poll-secs", type=float, default=d.repository_poll_secs, metavar="SECS",
                        help="poll mode: how often the repository is checked for changes")
    parser.add_argument("--model-load-thread-count", type=int, default=d.model_load_thread_count, metavar="N",
                        help="models loaded in parallel")
    _bool_flag(parser, "--load-on-demand", d.load_on_demand,
               "explicit mode: load a repository model on its first request instead of refusing it")
    parser.add_argument("--model-memory-budget", type=_size, default=None, metavar="SIZE",
                        help="keep loaded models under this much memory (e.g. 2GB); LRU idle models are unloaded")
    parser.add_argument("--model-idle-unload-secs", type=float, default=None, metavar="N",
                        help="unload models that received no request for N seconds")
    parser.add_argument("--backend-config", action="append", default=[], metavar="[BACKEND,]KEY=VALUE",
                        help="backend setting, e.g. default-max-batch-size=8 or python,shm-default-byte-size=N "
                        "(repeatable)")
    parser.add_argument("--backend-directory", default=None, metavar="PATH",
                        help="Python-based backends: <PATH>/<name>/model.py serves models with backend: \"<name>\"")
    parser.add_argument("--cache-config", action="append", default=[], metavar="local,size=BYTES",
                        help="enable the response cache for models with response_cache { enable: true }")
    parser.add_argument("--response-cache-byte-size", type=int, default=None, metavar="BYTES",
                        help="deprecated: same as --cache-config local,size=BYTES")
    parser.add_argument("--rate-limit", choices=["off", "execution_count"], default=d.rate_limit,
                        help="execution_count: instances execute only when their group's rate limiter resources are free")
    parser.add_argument("--rate-limit-resource", action="append", default=[], metavar="NAME:COUNT[:DEVICE]",
                        help="copies of a rate limiter resource (device omitted = every device; repeatable)")
    _bool_flag(parser, "--allow-client-shm", d.allow_client_shm, "allow client shared-memory regions")
    parser.add_argument("--trace-config", action="append", default=[], metavar="[MODE,]KEY=VALUE",
                        help="rate=N, level=OFF|TIMESTAMPS|TENSORS, count=N, mode=triton|opentelemetry, triton,file=PATH, "
                             "triton,log-frequency=N, opentelemetry,url=URL, opentelemetry,resource=KEY=VALUE, "
                             "opentelemetry,bsp_max_queue_size=N|bsp_schedule_delay=MS|bsp_max_export_batch_size=N")
    for old, key in (("file", "triton,file"), ("level", "level"), ("rate", "rate"), ("count", "count"),
                     ("log-frequency", "triton,log-frequency")):
        parser.add_argument(f"--trace-{old}", action="append", default=[], metavar="VALUE",
                            help=f"deprecated: same as --trace-config {key}=VALUE")
    parser.add_argument("--exit-timeout-secs", type=float, default=d.exit_timeout_secs, metavar="SECS",
                        help="at SIGINT/SIGTERM, how long in-flight requests may finish (a second signal exits at once)")
    parser.add_argument("--log-verbose", type=int, default=d.log_verbose, metavar="LEVEL",
                        help="verbose logging level (0 = off)")
    _bool_flag(parser, "--log-info", d.log_info, "log info messages")
    _bool_flag(parser, "--log-warning", d.log_warning, "log warnings")
    _bool_flag(parser, "--log-error", d.log_error, "log errors")
    parser.add_argument("--log-format", choices=["default", "ISO8601"], default=d.log_format,
                        help="log line layout: Triton's usual one (MMDD hh:mm:ss.us) or ISO8601 timestamps")
    parser.add_argument("--log-file", default=d.log_file, metavar="PATH",
                        help="write the log to this file instead of stderr (default: stderr)")
    add_deploy_flags(parser, os.environ)
    _add_ignored_flags(parser)
    # the one required flag first in --help, not after sixty optional ones
    parser._action_groups.remove(required)
    parser._action_groups.insert(0, required)
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
        frontend_processes=(auto_frontend_processes(usable_cpu_count()) if args.frontend_processes == AUTO
                            else args.frontend_processes),
        frontend_core_connections=args.frontend_core_connections,
        idle_spin_us=args.idle_spin_us,
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
