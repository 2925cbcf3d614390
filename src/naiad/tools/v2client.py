"""The tools' blocking control plane for v2 servers (HTTP or gRPC): readiness, metadata, config, statistics,
system shared memory and repository load/unload, over tritonclient, with answers typed for the tools."""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from naiad.tools.errors import ToolError


class ServerError(ToolError):
    """The server answered with an error (message as the server wrote it)."""


@dataclass
class TensorSpec:
    name: str
    datatype: str
    shape: list[int]  # as in model metadata: includes -1 for the batch dim when max_batch_size > 0


@dataclass
class ModelInfo:
    name: str
    version: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    max_batch_size: int = 0
    decoupled: bool = False
    config: dict[str, Any] = field(default_factory=dict)


@dataclass
class StatsSnapshot:
    """Cumulative counters of one model version (ns / counts), as /v2/models/<m>/stats reports them."""

    inference_count: int = 0
    execution_count: int = 0
    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    queue_count: int = 0
    queue_ns: int = 0
    compute_input_count: int = 0
    compute_input_ns: int = 0
    compute_infer_count: int = 0
    compute_infer_ns: int = 0
    compute_output_count: int = 0
    compute_output_ns: int = 0
    cache_hit_count: int = 0

    def minus(self, other: StatsSnapshot) -> StatsSnapshot:
        return StatsSnapshot(**{k: getattr(self, k) - getattr(other, k) for k in self.__dataclass_fields__})

    @classmethod
    def from_json(cls, entries: list[dict[str, Any]]) -> StatsSnapshot:
        """Sum over the entries (one per version) of a statistics answer; gRPC uint64 strings accepted."""
        snap = cls()
        for entry in entries:
            stats = entry.get("inference_stats", {})

            def pair(key: str, stats: dict[str, Any] = stats) -> tuple[int, int]:
                part = stats.get(key, {}) or {}
                return int(part.get("count", 0) or 0), int(part.get("ns", 0) or 0)

            snap.inference_count += int(entry.get("inference_count", 0) or 0)
            snap.execution_count += int(entry.get("execution_count", 0) or 0)
            for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output"):
                count, ns = pair(key)
                setattr(snap, f"{key}_count", getattr(snap, f"{key}_count") + count)
                if key != "fail":
                    setattr(snap, f"{key}_ns", getattr(snap, f"{key}_ns") + ns)
            snap.cache_hit_count += pair("cache_hit")[0]
        return snap


def split_url(url: str, default_port: int) -> tuple[str, int]:
    """'host:port', 'http://host:port' or 'host' -> (host, port)."""
    text = url.split("://", 1)[-1].rstrip("/")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, int(rest.lstrip(":") or default_port)
    host, _, port = text.partition(":")
    return (host or "localhost"), int(port or default_port)


def _address(url: str, default_port: int) -> str:
    """'host:port' as tritonclient takes it (no scheme; IPv6 hosts bracketed)."""
    host, port = split_url(url, default_port)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@contextmanager
def _server_errors(what: str) -> Iterator[None]:
    """tritonclient's errors as ServerError carrying the server's own message."""
    from tritonclient.utils import InferenceServerException

    try:
        yield
    except InferenceServerException as exc:
        status = str(exc.status() or "").removeprefix("StatusCode.")
        status = f"HTTP {status}" if status.isdigit() else status
        raise ServerError(f"{what}: {status}: {exc.message()}" if status else f"{what}: {exc.message()}") from None
    except http.client.HTTPException as exc:  # geventhttpclient: the connection closed or sent no valid HTTP
        raise ServerError(f"{what}: {exc!r}") from None


class ControlClient:
    """The calls both protocols share; `_call` holds the per-call options of the protocol's tritonclient."""

    def __init__(self, client: Any, **call: Any) -> None:
        self._client = client
        self._call = call

    def close(self) -> None:
        self._client.close()

    def ready(self) -> bool:
        """Server readiness; False when the server cannot be reached."""
        try:
            with _server_errors("server ready"):
                return bool(self._client.is_server_ready(**self._call))
        except (ServerError, OSError):
            return False

    def model_ready(self, model: str, version: str = "") -> bool:
        try:
            with _server_errors(f"model '{model}' ready"):
                return bool(self._client.is_model_ready(model, version, **self._call))
        except (ServerError, OSError):
            return False

    def metadata(self, model: str, version: str = "") -> dict[str, Any]:
        with _server_errors(f"model '{model}' metadata"):
            doc: dict[str, Any] = self._client.get_model_metadata(model, version, **self._json())
        for key in ("inputs", "outputs"):
            for tensor in doc.get(key, []):
                tensor["shape"] = [int(d) for d in tensor.get("shape", [])]  # gRPC JSON writes int64 as strings
        return doc

    def config(self, model: str, version: str = "") -> dict[str, Any]:
        with _server_errors(f"model '{model}' config"):
            return self._config_doc(self._client.get_model_config(model, version, **self._json()))

    def stats(self, model: str, version: str = "") -> StatsSnapshot:
        with _server_errors(f"model '{model}' statistics"):
            doc = self._client.get_inference_statistics(model, version, **self._json())
        return StatsSnapshot.from_json(doc.get("model_stats", []))

    def register_system_shm(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        with _server_errors(f"register system shared memory '{name}'"):
            self._client.register_system_shared_memory(name, key, byte_size, offset, **self._call)

    def unregister_system_shm(self, name: str) -> None:
        with _server_errors(f"unregister system shared memory '{name}'"):
            self._client.unregister_system_shared_memory(name, **self._call)

    def system_shm_regions(self) -> list[str]:
        """The names of the registered system shared-memory regions."""
        with _server_errors("system shared memory status"):
            return self._region_names(self._client.get_system_shared_memory_status(**self._json()))

    def load(self, model: str, config_json: str = "") -> None:
        """Load (or reload) a model; `config_json` overrides its config.pbtxt (Triton's "config" parameter)."""
        with _server_errors(f"load model '{model}'"):
            self._client.load_model(model, config=config_json or None, **self._call)

    def unload(self, model: str) -> None:
        with _server_errors(f"unload model '{model}'"):
            self._client.unload_model(model, **self._call)

    def _json(self) -> dict[str, Any]:
        return self._call

    def _config_doc(self, answer: Any) -> dict[str, Any]:
        return dict(answer)

    def _region_names(self, answer: Any) -> list[str]:
        return [str(region["name"]) for region in answer]


class HttpControl(ControlClient):
    """Control-plane calls over HTTP/REST (tritonclient.http: one keep-alive connection)."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        import tritonclient.http as triton_http

        super().__init__(triton_http.InferenceServerClient(
            _address(url, 8000), connection_timeout=timeout, network_timeout=timeout))

    def infer_json(self, model: str, inputs: list[tuple[str, str, Any]]) -> dict[str, Any]:
        """One inference with JSON input tensors: inputs are (name, datatype, numpy array); returns name -> array."""
        import tritonclient.http as triton_http

        with _server_errors(f"infer '{model}'"):  # an array that does not match its datatype fails here too
            tensors = []
            for name, datatype, array in inputs:
                tensor = triton_http.InferInput(name, list(array.shape), datatype)
                tensor.set_data_from_numpy(array, binary_data=False)
                tensors.append(tensor)
            result = self._client.infer(model, tensors)
        return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response().get("outputs", [])}


class GrpcControl(ControlClient):
    """The same calls over gRPC (tritonclient.grpc), each bounded by `timeout` seconds."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        import tritonclient.grpc as triton_grpc

        super().__init__(triton_grpc.InferenceServerClient(_address(url, 8001)), client_timeout=timeout)

    def _json(self) -> dict[str, Any]:
        return {**self._call, "as_json": True}

    def _config_doc(self, answer: Any) -> dict[str, Any]:
        doc: dict[str, Any] = answer.get("config", {})
        doc["max_batch_size"] = int(doc.get("max_batch_size", 0))  # proto3 JSON leaves out a zero
        return doc

    def _region_names(self, answer: Any) -> list[str]:
        return list(answer.get("regions", {}))


def control_client(protocol: str, url: str, timeout: float = 30.0) -> ControlClient:
    return GrpcControl(url, timeout) if protocol == "grpc" else HttpControl(url, timeout)


def model_info(client: ControlClient, model: str, version: str = "") -> ModelInfo:
    """Metadata + config folded into the facts a load generator needs."""
    meta = client.metadata(model, version)
    config = client.config(model, version)
    policy = config.get("model_transaction_policy") or {}
    specs = {
        key: [TensorSpec(t["name"], t["datatype"], [int(d) for d in t.get("shape", [])]) for t in meta.get(key, [])]
        for key in ("inputs", "outputs")
    }
    versions = meta.get("versions") or [""]
    return ModelInfo(
        name=model,
        version=version or str(versions[-1]),
        inputs=specs["inputs"],
        outputs=specs["outputs"],
        max_batch_size=int(config.get("max_batch_size", 0) or 0),
        decoupled=bool(policy.get("decoupled", False)),
        config=config,
    )
