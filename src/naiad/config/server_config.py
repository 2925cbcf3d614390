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
    allow_grpc: bool = True
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    allow_metrics: bool = True
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    metrics_config: dict[str, str] = field(default_factory=dict)
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True
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
    response_cache_bytes: int | None = None  # --cache-config local,size=N
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
