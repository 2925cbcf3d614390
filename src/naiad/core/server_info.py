"""The server information interface: metadata, model configs, statistics, metrics, log and trace settings."""

from __future__ import annotations

from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from naiad import __version__
from naiad.config.model_config import config_to_dict
from naiad.config.server_config import ServerConfig
from naiad.core.model_lifecycle import ModelLifecycle
from naiad.core.response_cache import ResponseCache
from naiad.observability.log_settings import LogSettings
from naiad.observability.metrics import MetricsCollector, ModelSeries
from naiad.observability.tracing import Tracer
from naiad.protocol.errors import invalid_arg
from naiad.protocol.model_versions import parse_model_version

EXTENSIONS = [
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
]


class ServerInfoService:
    """`ServerInfoAPI` over the Server's models, metrics collector, log settings and tracer."""

    def __init__(
        self, config: ServerConfig, models: ModelLifecycle, metrics: MetricsCollector, log_settings: LogSettings,
        tracer: Tracer,
    ) -> None:
        self._config = config
        self._models = models
        self._metrics = metrics
        self._log_settings = log_settings
        self._tracer = tracer

    # ------------------------------------------------------------ metadata and configs

    def metadata(self) -> dict[str, Any]:
        return {"name": self._config.server_id, "version": __version__, "extensions": list(EXTENSIONS)}

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        model = self._models.lookup(name, version)
        config = model.config
        if version:
            versions = [model.version_str]
        else:
            versions = [str(v) for v in sorted(self._models.records[name].ready())]
        return {
            "name": name,
            "versions": versions,
            "platform": config.platform or config.backend,
            "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in model.input_metadata],
            "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in model.output_metadata],
        }

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        return self._models.lookup(name, version).config

    def model_config_dict(self, name: str, version: str = "") -> dict[str, Any]:
        return config_to_dict(self.model_config(name, version))

    # ------------------------------------------------------------ statistics and metrics

    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        records = self._models.records
        if not name:
            return {"model_stats": [
                loaded.stats.as_dict()
                for _, each in sorted(records.items())
                for _, loaded in sorted(each.ready().items())
            ]}
        number = parse_model_version(version)
        record = records.get(name)
        ready = record.ready() if record is not None else {}
        if not ready:
            raise invalid_arg(f"requested model '{name}' is not available")
        if number is not None:
            model = ready.get(number)
            if model is None:
                raise invalid_arg(f"requested model version is not available for model '{name}'")
            return {"model_stats": [model.stats.as_dict()]}
        return {"model_stats": [m.stats.as_dict() for _, m in sorted(ready.items())]}

    def metrics_text(self) -> str:
        return self._metrics.render()

    # ------------------------------------------------------------ logging and trace extensions

    def get_log_settings(self) -> dict[str, Any]:
        return self._log_settings.as_dict()

    def update_log_settings(self, changes: dict[str, Any]) -> dict[str, Any]:
        return self._log_settings.update(changes)

    def get_trace_settings(self, model: str = "") -> dict[str, Any]:
        self._check_trace_target(model)
        return self._tracer.settings(model)

    def update_trace_settings(self, model: str, changes: dict[str, Any]) -> dict[str, Any]:
        self._check_trace_target(model)
        return self._tracer.update(model, changes)

    def _check_trace_target(self, model: str) -> None:
        if model and model not in self._models.records:
            raise invalid_arg(f"Request for unknown model : {model}")


def model_series(models: ModelLifecycle, response_cache: ResponseCache | None) -> list[ModelSeries]:
    """What the metrics collector reads of every ready model version."""
    return [
        ModelSeries(m.stats, m.scheduler.pending(), dict(m.config.metric_tags), m.config.response_cache.enable and response_cache is not None)
        for _, record in sorted(models.records.items())
        for _, m in sorted(record.ready().items())
    ]
