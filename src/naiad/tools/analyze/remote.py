"""Model Analyzer's remote launch mode: variants of a model are loaded into a server that is already running
(EXPLICIT model control) through the repository API, each as a config override of the model itself."""

from __future__ import annotations

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from naiad.tools.analyze.server import ServerStartError
from naiad.tools.v2client import HttpControl, ServerError


class RemoteServer:
    """The running server with `model` (re)loaded under `config`; stands where a started server would."""

    def __init__(self, http_endpoint: str, grpc_endpoint: str, model: str, config: mc.ModelConfig | None) -> None:
        self.endpoints = {"http": http_endpoint, "grpc": grpc_endpoint}
        self.model = model
        control = HttpControl(http_endpoint, timeout=300.0)
        try:
            if config is not None:
                override = mc.ModelConfig()
                override.CopyFrom(config)
                override.name = model  # a config override keeps the model's own name
                control.load(model, json_format.MessageToJson(override, preserving_proto_field_name=True))
            elif not control.model_ready(model):
                control.load(model)
        except (ServerError, OSError) as exc:
            raise ServerStartError(f"the server at {http_endpoint} did not load '{model}': {exc}") from None
        finally:
            control.close()

    def url(self, protocol: str) -> str:
        return self.endpoints["grpc" if protocol == "grpc" else "http"]

    def memory_mb(self) -> float:
        return 0.0  # another machine's (or process tree's) memory is not ours to read

    def __enter__(self) -> RemoteServer:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def served_config(http_endpoint: str, model: str) -> mc.ModelConfig:
    """The config the running server reports for `model` (loading it first when it is not loaded)."""
    control = HttpControl(http_endpoint, timeout=300.0)
    try:
        if not control.ready():
            raise ServerError(f"no ready server at {http_endpoint} (start it with --model-control-mode explicit)")
        if not control.model_ready(model):
            control.load(model)
        config = mc.ModelConfig()
        json_format.ParseDict(control.config(model), config, ignore_unknown_fields=True)
        return config
    finally:
        control.close()


def restore(http_endpoint: str, model: str, config: mc.ModelConfig) -> None:
    """Load the model again with the config it was served with before the analysis."""
    RemoteServer(http_endpoint, "", model, config)
