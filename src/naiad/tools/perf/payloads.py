"""Pre-built request bytes: HTTP/1.1 requests with binary tensors, serialized gRPC ModelInferRequests."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from naiad.tools.perf.inputs import InputSet, tensor_bytes
from naiad.tools.v2client import ModelInfo


@dataclass
class ShmRef:
    region: str
    offset: int
    byte_size: int


@dataclass
class ShmLayout:
    """Where each input set's tensors and each output live in registered system shared memory."""

    inputs: list[dict[str, ShmRef]] = field(default_factory=list)  # one dict per input set
    outputs: dict[str, ShmRef] = field(default_factory=dict)


@dataclass
class RequestOptions:
    model: str
    version: str = ""
    parameters: dict[str, object] = field(default_factory=dict)  # --request-parameter
    headers: dict[str, str] = field(default_factory=dict)  # -H
    decoupled: bool = False


def _shm_params(ref: ShmRef) -> dict[str, object]:
    return {"shared_memory_region": ref.region, "shared_memory_byte_size": ref.byte_size,
            "shared_memory_offset": ref.offset}


@dataclass
class HttpTemplate:
    """A request's pieces before framing, so that sequence parameters can be added per request cheaply."""

    head: list[str]  # request line, Host and -H headers
    doc: dict[str, object]  # the JSON inference header
    blobs: bytes  # binary tensor data after the JSON header
    binary: bool  # the body carries binary data or shared-memory references


def http_template(host: str, port: int, model: ModelInfo, inputs: InputSet, options: RequestOptions,
                  shm_inputs: dict[str, ShmRef] | None, shm_outputs: dict[str, ShmRef] | None) -> HttpTemplate:
    """A POST .../infer request; tensors ride in the body (binary extension) or in shared memory."""
    blobs = []
    doc_inputs = []
    for tensor in inputs:
        entry: dict[str, object] = {"name": tensor.name, "shape": list(tensor.array.shape), "datatype": tensor.datatype}
        if shm_inputs is not None:
            entry["parameters"] = _shm_params(shm_inputs[tensor.name])
        else:
            blob = tensor_bytes(tensor)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        doc_inputs.append(entry)
    doc_outputs = []
    for spec in model.outputs:
        params = _shm_params(shm_outputs[spec.name]) if shm_outputs is not None else {"binary_data": True}
        doc_outputs.append({"name": spec.name, "parameters": params})
    doc: dict[str, object] = {"inputs": doc_inputs, "outputs": doc_outputs}
    if options.parameters:
        doc["parameters"] = dict(options.parameters)
    path = f"/v2/models/{options.model}" + (f"/versions/{options.version}" if options.version else "") + "/infer"
    head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}"] + [f"{k}: {v}" for k, v in options.headers.items()]
    return HttpTemplate(head, doc, b"".join(blobs), bool(blobs) or shm_inputs is not None)


def render_http(template: HttpTemplate, extra: dict[str, object] | None = None) -> bytes:
    """The request bytes, with `extra` request parameters (sequence id and flags) merged in."""
    doc = template.doc
    if extra:
        doc = dict(doc, parameters={**doc.get("parameters", {}), **extra})  # type: ignore[dict-item]
    header = json.dumps(doc, separators=(",", ":")).encode()
    body = header + template.blobs
    lines = template.head[:1] + template.head[1:2] + [f"Content-Length: {len(body)}"]
    if template.binary:
        lines += ["Content-Type: application/octet-stream", f"Inference-Header-Content-Length: {len(header)}"]
    else:
        lines.append("Content-Type: application/json")
    lines += template.head[2:]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def http_payload(host: str, port: int, model: ModelInfo, inputs: InputSet, options: RequestOptions,
                 shm_inputs: dict[str, ShmRef] | None, shm_outputs: dict[str, ShmRef] | None) -> bytes:
    """A complete POST .../infer request."""
    return render_http(http_template(host, port, model, inputs, options, shm_inputs, shm_outputs))


def grpc_parameters(extra: dict[str, object]) -> bytes:
    """Serialized request parameters only: appended to a serialized ModelInferRequest they merge into its map."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest()
    for key, value in extra.items():
        _set_parameter(request.parameters, key, value)
    return request.SerializeToString()


def _set_parameter(params: object, key: str, value: object) -> None:
    param = params[key]  # type: ignore[index]
    if isinstance(value, bool):
        param.bool_param = value
    elif isinstance(value, int):
        param.int64_param = value
    elif isinstance(value, float):
        param.double_param = value
    else:
        param.string_param = str(value)


def grpc_payload(model: ModelInfo, inputs: InputSet, options: RequestOptions,
                 shm_inputs: dict[str, ShmRef] | None, shm_outputs: dict[str, ShmRef] | None,
                 streaming: bool = False) -> bytes:
    """A serialized ModelInferRequest (raw_input_contents, or shared-memory parameters)."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=options.model, model_version=options.version)
    for tensor in inputs:
        entry = request.inputs.add()
        entry.name, entry.datatype = tensor.name, tensor.datatype
        entry.shape.extend(tensor.array.shape)
        if shm_inputs is not None:
            for key, value in _shm_params(shm_inputs[tensor.name]).items():
                _set_parameter(entry.parameters, key, value)
        else:
            request.raw_input_contents.append(tensor_bytes(tensor))
    for spec in model.outputs:
        out = request.outputs.add()
        out.name = spec.name
        if shm_outputs is not None:
            for key, value in _shm_params(shm_outputs[spec.name]).items():
                _set_parameter(out.parameters, key, value)
    for key, value in options.parameters.items():
        _set_parameter(request.parameters, key, value)
    if streaming and options.decoupled:
        _set_parameter(request.parameters, "triton_enable_empty_final_response", True)
    return request.SerializeToString()


def parse_request_parameter(text: str) -> tuple[str, object]:
    """`--request-parameter name:value:type` with type string|int|bool|double."""
    parts = text.rsplit(":", 2)
    if len(parts) != 3:
        raise ValueError(f"--request-parameter expects name:value:type, got '{text}'")
    name, value, kind = parts
    if kind == "int":
        return name, int(value)
    if kind == "bool":
        return name, value.lower() in ("1", "true", "yes", "on")
    if kind in ("double", "float"):
        return name, float(value)
    if kind == "string":
        return name, value
    raise ValueError(f"--request-parameter type must be string, int, bool or double, got '{kind}'")
