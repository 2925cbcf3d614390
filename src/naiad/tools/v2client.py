"""A small blocking control-plane client for v2 servers (HTTP or gRPC): health, metadata, config, stats, shm, repository."""

from __future__ import annotations

import http.client
import json
import time
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


class HttpControl:
    """Control-plane calls over HTTP/REST with one persistent connection."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.host, self.port = split_url(url, 8000)
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        payload = None if body is None else json.dumps(body).encode()
        for attempt in range(2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                headers = {"Content-Type": "application/json"} if payload is not None else {}
                self._conn.request(method, path, body=payload, headers=headers)
                response = self._conn.getresponse()
                data = response.read()
                break
            except (ConnectionError, http.client.HTTPException, OSError):
                self.close()
                if attempt:
                    raise
        doc: Any = None
        if data:
            try:
                doc = json.loads(data)
            except ValueError:
                doc = {"error": data.decode(errors="replace")}
        return response.status, doc

    def _ok(self, method: str, path: str, body: Any = None) -> Any:
        status, doc = self.request(method, path, body)
        if status != 200:
            message = doc.get("error", str(doc)) if isinstance(doc, dict) else str(doc)
            raise ServerError(f"{method} {path}: HTTP {status}: {message}")
        return doc

    @staticmethod
    def _model_path(model: str, version: str) -> str:
        return f"/v2/models/{model}" + (f"/versions/{version}" if version else "")

    def ready(self) -> bool:
        try:
            return self.request("GET", "/v2/health/ready")[0] == 200
        except OSError:
            return False

    def model_ready(self, model: str, version: str = "") -> bool:
        try:
            return self.request("GET", self._model_path(model, version) + "/ready")[0] == 200
        except OSError:
            return False

    def metadata(self, model: str, version: str = "") -> dict[str, Any]:
        return self._ok("GET", self._model_path(model, version))

    def config(self, model: str, version: str = "") -> dict[str, Any]:
        return self._ok("GET", self._model_path(model, version) + "/config")

    def stats(self, model: str, version: str = "") -> StatsSnapshot:
        doc = self._ok("GET", self._model_path(model, version) + "/stats")
        return StatsSnapshot.from_json(doc.get("model_stats", []))

    def register_system_shm(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        self._ok("POST", f"/v2/systemsharedmemory/region/{name}/register",
                 {"key": key, "offset": offset, "byte_size": byte_size})

    def unregister_system_shm(self, name: str) -> None:
        self._ok("POST", f"/v2/systemsharedmemory/region/{name}/unregister")

    def load(self, model: str, config_json: str = "") -> None:
        """Load (or reload) a model; `config_json` overrides its config.pbtxt (Triton's "config" parameter)."""
        body = {"parameters": {"config": config_json}} if config_json else {}
        self._ok("POST", f"/v2/repository/models/{model}/load", body)

    def infer_json(self, model: str, inputs: list[tuple[str, str, Any]]) -> dict[str, Any]:
        """One inference with JSON tensors: inputs are (name, datatype, numpy array); returns name -> numpy array."""
        import numpy as np

        doc = {"inputs": [{"name": n, "datatype": d, "shape": list(a.shape), "data": a.ravel().tolist()}
                          for n, d, a in inputs]}
        answer = self._ok("POST", f"/v2/models/{model}/infer", doc)
        return {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in answer.get("outputs", [])}

    def unload(self, model: str) -> None:
        self._ok("POST", f"/v2/repository/models/{model}/unload", {})


class GrpcControl:
    """The same calls over gRPC (GRPCInferenceService stubs from tritonclient)."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        self._grpc = grpc
        self._pb = service_pb2
        host, port = split_url(url, 8001)
        self._channel = grpc.insecure_channel(f"{host}:{port}")
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self.timeout = timeout

    def close(self) -> None:
        self._channel.close()

    def _call(self, name: str, request: Any) -> Any:
        try:
            return getattr(self._stub, name)(request, timeout=self.timeout)
        except self._grpc.RpcError as exc:
            raise ServerError(f"{name}: {exc.code().name}: {exc.details()}") from None

    def _dict(self, message: Any) -> dict[str, Any]:
        from google.protobuf import json_format

        return json_format.MessageToDict(message, preserving_proto_field_name=True)

    def ready(self) -> bool:
        try:
            return bool(self._stub.ServerReady(self._pb.ServerReadyRequest(), timeout=self.timeout).ready)
        except self._grpc.RpcError:
            return False

    def model_ready(self, model: str, version: str = "") -> bool:
        try:
            return bool(self._stub.ModelReady(self._pb.ModelReadyRequest(name=model, version=version), timeout=self.timeout).ready)
        except self._grpc.RpcError:
            return False

    def metadata(self, model: str, version: str = "") -> dict[str, Any]:
        doc = self._dict(self._call("ModelMetadata", self._pb.ModelMetadataRequest(name=model, version=version)))
        for key in ("inputs", "outputs"):
            for tensor in doc.get(key, []):
                tensor["shape"] = [int(d) for d in tensor.get("shape", [])]
        return doc

    def config(self, model: str, version: str = "") -> dict[str, Any]:
        response = self._call("ModelConfig", self._pb.ModelConfigRequest(name=model, version=version))
        doc = self._dict(response.config)
        doc["max_batch_size"] = int(response.config.max_batch_size)
        return doc

    def stats(self, model: str, version: str = "") -> StatsSnapshot:
        response = self._call("ModelStatistics", self._pb.ModelStatisticsRequest(name=model, version=version))
        return StatsSnapshot.from_json(self._dict(response).get("model_stats", []))

    def register_system_shm(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        self._call("SystemSharedMemoryRegister",
                   self._pb.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=offset, byte_size=byte_size))

    def unregister_system_shm(self, name: str) -> None:
        self._call("SystemSharedMemoryUnregister", self._pb.SystemSharedMemoryUnregisterRequest(name=name))

    def load(self, model: str) -> None:
        self._call("RepositoryModelLoad", self._pb.RepositoryModelLoadRequest(model_name=model))

    def unload(self, model: str) -> None:
        self._call("RepositoryModelUnload", self._pb.RepositoryModelUnloadRequest(model_name=model))


def control_client(protocol: str, url: str, timeout: float = 30.0) -> HttpControl | GrpcControl:
    return GrpcControl(url, timeout) if protocol == "grpc" else HttpControl(url, timeout)


def wait_ready(client: HttpControl | GrpcControl, timeout: float, model: str = "") -> None:
    """Poll readiness (server, then the model when named) until `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.ready() and (not model or client.model_ready(model)):
            return
        time.sleep(0.05)
    raise ServerError(f"server not ready after {timeout:.0f} s" + (f" (model '{model}')" if model else ""))


def model_info(client: HttpControl | GrpcControl, model: str, version: str = "") -> ModelInfo:
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
