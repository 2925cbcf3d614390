"""ServerConfig: every setting of a server, built by the CLI or by an embedding program."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ServerConfig:
    """Settings named after tritonserver's flags; defaults are the zero-setup local path."""

    model_repositories: list[str] = field(default_factory=list)
    server_id: str = "triton"
    # frontends
    allow_http: bool = True
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    http_max_input_size: int = 1 << 26
    http_header_timeout_secs: float = 30.0
    http_body_timeout_secs: float = 60.0
    http_ssl_certfile: str = ""  # TLS: server certificate (PEM); empty = plain HTTP
    http_ssl_keyfile: str = ""
    http_ssl_ca_certs: str = ""  # CA bundle that verifies client certificates
    http_ssl_client_cert_required: bool = False
    http_restricted_api: list[str] = field(default_factory=list)  # "<group>[,...]:<key>=<value>" entries
    http_header_forward_pattern: str = ""
    # N >= 1: the HTTP/REST and gRPC ports' protocol work runs in N worker processes each, feeding this
    # one; 0 = in this process (`naiad serve` resolves its default, auto, from the usable CPUs)
    frontend_processes: int = 0
    # with frontend processes: connections of each port (Naiad's own servers) the core serves itself
    # before handing new ones to the workers; K >= 1 also starts the workers only once more are open
    frontend_core_connections: int = 8
    # after answering its last request in flight, the event loop polls for the next one for up to this
    # long instead of sleeping (core/idle_spin.py); 0 = never. `naiad serve` defaults to 500 us; 0 here, for a
    # server made in code: called from the program's own threads it served as many requests either way
    idle_spin_us: int = 0
    openai_port: int | None = None  # --openai-port: the /v1 API alone on its own port (it is also under /v1 on HTTP)
    allow_grpc: bool = True
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    grpc_use_ssl: bool = False
    grpc_use_ssl_mutual: bool = False
    grpc_server_cert: str = ""
    grpc_server_key: str = ""
    grpc_root_cert: str = ""
    grpc_restricted_protocol: list[str] = field(default_factory=list)
    grpc_header_forward_pattern: str = ""
    # per connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; more are refused); 0 = no limit (grpc-core's default)
    grpc_max_concurrent_streams: int = 1000
    grpc_max_concurrent_rpcs: int = 0  # whole server; past it calls fail RESOURCE_EXHAUSTED; 0 = no limit
    # "naiad" (own HTTP/2 server, the default: see docs/security.md) or "grpcio" (grpc.aio)
    grpc_server_impl: str = "naiad"
    # Naiad's server: a call whose request stops arriving half-way (or a partial frame, a missing preface) is reset
    grpc_incomplete_request_timeout_secs: float = 30.0
    grpc_max_message_size: int = 2**31 - 1  # largest request message (declared length), as Triton
    # Naiad's server: what a compressed request message may inflate to (a gzip bomb's limit)
    grpc_max_decompressed_size: int = 1 << 26
    # cloud frontends (they listen on http_address)
    allow_sagemaker: bool = False
    sagemaker_port: int = 8080
    sagemaker_default_model: str = ""  # SAGEMAKER_TRITON_DEFAULT_MODEL_NAME; empty = the only loaded model
    sagemaker_ping_mode: str = "ready"  # SAGEMAKER_TRITON_PING_MODE: ready | live
    sagemaker_inference_type: str = "infer"  # SAGEMAKER_TRITON_INFERENCE_TYPE: infer | generate | generate_stream
    allow_vertex_ai: bool = False
    vertex_ai_port: int = 8080
    vertex_ai_default_model: str = ""  # empty = the repository's only model
    vertex_ai_health_route: str = ""  # AIP_HEALTH_ROUTE
    vertex_ai_predict_route: str = ""  # AIP_PREDICT_ROUTE
    allow_metrics: bool = True
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    metrics_config: dict[str, str] = field(default_factory=dict)
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True
    metrics_interval_ms: float = 2000.0  # --metrics-interval-ms: CPU/memory/GPU gauges sampled this often
    # model management
    model_control_mode: str = "none"
    load_models: list[str] = field(default_factory=list)
    strict_model_config: bool = False
    strict_readiness: bool = True
    exit_on_error: bool = False  # Triton exits; Naiad keeps serving the models that loaded
    model_config_name: str = ""
    repository_poll_secs: float = 15.0
    model_load_thread_count: int = 4
    load_on_demand: bool = False  # explicit mode: a request for an unloaded repository model loads it
    model_memory_budget: int | None = None  # bytes; least-recently-used idle models are evicted above it
    model_idle_unload_secs: float | None = None
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    backend_directory: str | None = None  # --backend-directory: Python-based backends as <dir>/<name>/model.py
    response_cache_bytes: int | None = None  # --cache-config local,size=N
    rate_limit: str = "off"  # --rate-limit: off | execution_count
    rate_limit_resources: list[str] = field(default_factory=list)  # --rate-limit-resource <name>:<count>[:<device>]
    # shared memory
    allow_client_shm: bool = True
    trace_config: list[str] = field(default_factory=list)  # --trace-config entries
    # lifecycle and logging
    exit_timeout_secs: float = 30.0
    log_verbose: int = 0
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_format: str = "default"
    log_file: str = ""

    def backend_setting(self, backend: str, key: str, default: str | None = None) -> str | None:
        """A --backend-config value: the backend's own setting first, then the global one."""
        own = self.backend_config.get(backend, {})
        if key in own:
            return own[key]
        return self.backend_config.get("", {}).get(key, default)
