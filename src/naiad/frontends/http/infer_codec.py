"""Infer request/response wire codec: JSON header + binary tensor blobs <-> InferenceRequest/Response."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from naiad.frontends.http.infer_params import (
    SHM_KEYS,
    apply_request_parameters,
    as_bool,
    as_object,
    as_uint,
    check_input_source,
    remaining_parameters,
    shared_memory_ref,
)
from naiad.protocol.datatypes import NATIVE_WIRE_DTYPES, NUMPY_DTYPES
from naiad.protocol.errors import invalid_arg
from naiad.protocol.request_json import load_request_json
from naiad.protocol.tensor_codec import (
    array_from_json,
    array_from_raw,
    array_to_json,
    array_to_raw,
    check_datatype,
    has_non_finite,
    non_finite_json_array,
    parse_shape,
    usual_float_array,
)
from naiad.protocol.types import (
    InferenceRequest,
    InferenceResponse,
    InferInput,
    RequestedOutput,
)

_INPUT_CONSUMED = ("binary_data_size", *SHM_KEYS)
_OUTPUT_CONSUMED = ("binary_data", "classification", *SHM_KEYS)
_EMPTY = memoryview(b"")
_NOT_NUMPY_JSON = ("BYTES", "FP16", "BF16")  # written element by element (array_to_json), or refused
_NUMPY_JSON_FLOATS = ("FP32", "FP64")
_NATIVE_FLOATS = frozenset((np.dtype(np.float32), np.dtype(np.float64)))  # in native byte order


@dataclass(slots=True)
class OutputPlan:
    """How each output goes back: binary blob or JSON `data` (per-output choice, else the request default)."""

    default_binary: bool = False
    binary: dict[str, bool] = field(default_factory=dict)

    def is_binary(self, name: str) -> bool:
        return self.binary.get(name, self.default_binary)


_ALL_JSON = OutputPlan()  # every output as JSON: the plan of a request naming no outputs and no parameters


def parse_header_length(value: bytes | None, body_length: int) -> int | None:
    """Inference-Header-Content-Length: None when absent, else an int in [0, body_length] (400 otherwise)."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit() and len(text) <= 20:
        length = int(text)
        if length <= body_length:
            return length
    shown = value.decode("latin-1")
    raise invalid_arg(f"inference header size should be in range (0, {body_length}), got: {shown}")


def decode_infer_request(model: str, version: str, body: bytes, header_length: int | None) -> tuple[InferenceRequest, OutputPlan]:
    """Decode a (decompressed) infer body; header_length None = all JSON, else the JSON header's
    length. A raw binary body (length 0) is shaped by the model: raw_request.decode_raw_request."""
    if header_length == 0:
        raise ValueError("a raw binary body is decoded against its resolved model (decode_raw_request)")
    if header_length is None:
        try:
            doc = orjson.loads(body)  # the usual body (load_request_json's first try, a call fewer)
        except orjson.JSONDecodeError:
            doc = load_request_json(body)
        if type(doc) is dict and len(doc) == 1 and "inputs" in doc:
            # The usual body, inputs and nothing else: what the general path below makes of it, without
            # looking for the id, parameters and outputs it does not hold.
            request = InferenceRequest(model, [], version)
            _decode_inputs(request, doc["inputs"], _EMPTY, False)
            return request, _ALL_JSON
        binary = _EMPTY
    else:
        view = memoryview(body)
        doc = load_request_json(view[:header_length])
        binary = view[header_length:]
    if not isinstance(doc, dict):
        raise invalid_arg("failed to parse the request JSON buffer: expected a JSON object")
    raw_id = doc.get("id", "")
    if not isinstance(raw_id, str):
        raise invalid_arg("Unable to parse 'id'")
    request = InferenceRequest(model, [], version, raw_id)
    params = doc.get("parameters")
    outputs = doc.get("outputs")
    if params is None and outputs is None:
        plan = _ALL_JSON  # (shared: nothing writes a plan once decoded)
    else:
        plan = OutputPlan(apply_request_parameters(params, request) if params is not None else False)
    _decode_inputs(request, doc.get("inputs"), binary, header_length is not None)
    if outputs is not None:
        _decode_outputs(request, plan, outputs)
    return request, plan


def _decode_inputs(request: InferenceRequest, raw_inputs: Any, binary: memoryview, has_header: bool) -> None:
    if not isinstance(raw_inputs, list):
        raise invalid_arg("Unable to parse 'inputs'")
    offset = 0
    available = len(binary)
    inputs = request.inputs
    for raw in raw_inputs:
        if not isinstance(raw, dict):
            raise invalid_arg("Unable to parse 'inputs'")
        name = raw.get("name")
        if not isinstance(name, str):
            raise invalid_arg("Unable to parse 'name'")
        datatype = raw.get("datatype")
        if not isinstance(datatype, str):
            raise invalid_arg(f"Unable to parse 'datatype' of input '{name}'")
        if datatype not in NUMPY_DTYPES:
            check_datatype(datatype, name)  # raises
        params = raw.get("parameters")
        if params is None and "data" in raw:  # the usual JSON input: its data and nothing else
            # (of a float datatype: its shape checked and its data packed in one call, ~5k instructions
            # fewer; anything else or anything wrong with it, parse_shape and array_from_json below)
            array = usual_float_array(datatype, raw.get("shape"), raw["data"])
            if array is not None:
                inputs.append(InferInput(name, datatype, array.shape, array))
                continue
        shape = parse_shape(raw.get("shape"), name)
        if params is None and "data" in raw:
            inputs.append(InferInput(name, datatype, shape, array_from_json(datatype, shape, raw["data"], name)))
            continue
        params = as_object(params, "parameters")
        has_binary = "binary_data_size" in params
        has_shm = "shared_memory_region" in params
        check_input_source(name, "data" in raw, has_binary, has_shm)
        ref = None
        if has_binary:
            size = as_uint(params["binary_data_size"], "binary_data_size")
            if size and not has_header:
                raise invalid_arg(
                    "must specify valid 'Infer-Header-Content-Length' in request header and "
                    "'binary_data_size' when passing inputs in binary data format"
                )
            if offset + size > available:
                missing = offset + size - available
                raise invalid_arg(
                    f"unexpected size for input '{name}', expecting {missing} additional bytes "
                    f"for model '{request.model_name}'"
                )
            array = array_from_raw(datatype, shape, binary[offset : offset + size], name)
            offset += size
        elif has_shm:
            array, ref = None, shared_memory_ref(params)  # the core reads the region
        else:
            array = array_from_json(datatype, shape, raw["data"], name)
        inputs.append(InferInput(name, datatype, shape, array, remaining_parameters(params, _INPUT_CONSUMED), ref))
    if offset != available:
        raise invalid_arg(f"unexpected additional input data for model '{request.model_name}'")


def _decode_outputs(request: InferenceRequest, plan: OutputPlan, raw_outputs: Any) -> None:
    if raw_outputs is None:
        return
    if not isinstance(raw_outputs, list):
        raise invalid_arg("Unable to parse 'outputs'")
    for raw in raw_outputs:
        if not isinstance(raw, dict):
            raise invalid_arg("Unable to parse 'outputs'")
        name = raw.get("name")
        if not isinstance(name, str):
            raise invalid_arg("Unable to parse 'name'")
        params = as_object(raw.get("parameters"), "parameters")
        wanted = RequestedOutput(name=name, parameters=remaining_parameters(params, _OUTPUT_CONSUMED))
        # As Triton 2.51 does: binary_data_output covers only outputs not listed explicitly;
        # a listed output without its own binary_data comes back as JSON.
        plan.binary[name] = as_bool(params["binary_data"], "binary_data") if "binary_data" in params else False
        if "shared_memory_region" in params:
            if "classification" in params:
                raise invalid_arg("Output can't set both 'shared_memory_region' and 'classification'")
            if plan.binary.get(name):
                raise invalid_arg("Output can't set both 'shared_memory_region' and 'binary_data'")
            wanted.shared_memory = shared_memory_ref(params)
        if "classification" in params:
            wanted.classification = as_uint(params["classification"], "classification", verb="set")
        request.outputs.append(wanted)


def _json_data(array: np.ndarray, datatype: str, spell_non_finite: bool) -> Any:
    """Flat JSON-ready data: numeric arrays go to orjson as numpy, BYTES as strings. orjson writes
    NaN and +-inf as null; with spell_non_finite they are written as Triton writes them instead."""
    dtype = array.dtype
    if dtype.kind not in "biuf" or datatype in _NOT_NUMPY_JSON:
        return array_to_json(array, datatype)
    flat = array.ravel()  # C order, contiguous (a copy only when the array is not)
    if not dtype.isnative:
        flat = flat.astype(dtype.newbyteorder("="))
    if spell_non_finite and has_non_finite(flat):
        return non_finite_json_array(flat)
    return flat


def encode_infer_response(response: InferenceResponse, plan: OutputPlan) -> tuple[bytes, int | None]:
    """(body, JSON header length or None when there are no binary blobs)."""
    if plan is _ALL_JSON:
        header = _encode_float_outputs(response)
        # Only its float data can write a null (orjson's NaN or +-inf), or a name that holds one: then
        # the general path spells them out. One search (~1.3k instructions fewer than _may_hold_null_data's).
        if header is not None and header.find(b"null") < 0:
            return header, None
    elif plan.binary or plan.default_binary:
        encoded = _encode_binary_outputs(response, plan)
        if encoded is not None:
            return encoded
    header, blobs = _encode(response, plan, spell_non_finite=False)
    if _may_hold_null_data(header):
        # Only then can an output hold NaN or +-inf (orjson's null): written again, spelled out.
        # Looking for them in every float output cost more than this search.
        header, blobs = _encode(response, plan, spell_non_finite=True)
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)


_OUTPUTS_KEY = b'"outputs":['


def _may_hold_null_data(header: bytes) -> bool:
    """Whether an output's JSON data in `header` (as _encode writes it) may hold a null.

    A null that matters comes after the "outputs" key, which _encode writes last. The key names
    of the outputs hold no "u", nor do numbers, so the "u" of "null" is looked for first with
    one byte search (memchr, much faster than a search for four bytes); only from a "u" on
    (an output named with one, booleans, strings, ...) is "null" itself looked for. A false
    alarm only costs the spelled-out encoding, which writes the same bytes when nothing is
    non-finite. (`find`, not `in`, which first tries the bytes as an int.)"""
    start = header.find(_OUTPUTS_KEY)  # near the start (a parameter named "outputs" only starts it earlier)
    u = header.find(b"u", start + len(_OUTPUTS_KEY))
    return u >= 0 and header.find(b"null", u - 1) >= 0


def _encode_float_outputs(response: InferenceResponse) -> bytes | None:
    """_encode's JSON for the usual answer to a request that named no outputs and no parameters: every
    output a native float array written by orjson, no parameters anywhere (None: any other answer).
    The same bytes in about half the bytecodes of _encode's general loop."""
    outputs = []
    for out in response.outputs:
        data = out.data
        if data is None or out.parameters or type(out.shape) is not tuple or data.dtype not in _NATIVE_FLOATS:
            return None
        if out.datatype not in _NUMPY_JSON_FLOATS:
            return None
        outputs.append({"name": out.name, "datatype": out.datatype, "shape": out.shape, "data": data.ravel()})
    if response.id or response.parameters:
        return None
    return orjson.dumps(
        {"model_name": response.model_name, "model_version": str(response.model_version), "outputs": outputs},
        option=orjson.OPT_SERIALIZE_NUMPY,
    )


def _encode_binary_outputs(response: InferenceResponse, plan: OutputPlan) -> tuple[bytes, int | None] | None:
    """encode_infer_response's answer when every output goes back as a binary blob of its datatype's own
    numeric dtype and nothing has parameters (None: any other answer), as tritonclient and perf_analyzer
    ask for it. The same bytes as _encode's, with no JSON data to look for nulls in and no dict copied
    per output (~6k instructions fewer for add_sub's two outputs)."""
    if response.id or response.parameters:
        return None
    binary, default_binary = plan.binary, plan.default_binary
    outputs = []
    parts = [b""]  # the header goes first
    for out in response.outputs:
        data = out.data
        if (data is None or out.parameters or type(out.shape) is not tuple or not binary.get(out.name, default_binary)
                or data.dtype is not NATIVE_WIRE_DTYPES.get(out.datatype) or not data.flags.c_contiguous):
            return None
        outputs.append({"name": out.name, "datatype": out.datatype, "shape": out.shape,
                        "parameters": {"binary_data_size": data.nbytes}})
        if data.nbytes:
            parts.append(data.data.cast("B") if data.ndim else data.tobytes())
    header = orjson.dumps({"model_name": response.model_name, "model_version": str(response.model_version),
                           "outputs": outputs})
    if len(parts) == 1:
        return header, None  # no blob (every output empty): a JSON answer, as _encode's caller makes it
    parts[0] = header
    return b"".join(parts), len(header)


def _encode(response: InferenceResponse, plan: OutputPlan, spell_non_finite: bool) -> tuple[bytes, list[bytes | memoryview]]:
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    binary, default_binary = plan.binary, plan.default_binary
    for out in response.outputs:
        shape = out.shape
        entry: dict[str, Any] = {
            "name": out.name, "datatype": out.datatype,
            "shape": shape if type(shape) is tuple else [int(d) for d in shape],  # (array shapes are tuples of ints)
        }
        params = out.parameters
        if out.data is None:
            if params:
                entry["parameters"] = params
        elif binary.get(out.name, default_binary) if binary else default_binary:
            raw = array_to_raw(out.data, out.datatype)
            merged = dict(params) if params else {}
            merged["binary_data_size"] = len(raw)
            entry["parameters"] = merged
            if len(raw):
                blobs.append(raw)
        else:
            if params:
                entry["parameters"] = params
            data = out.data
            dtype = data.dtype
            if dtype.kind == "f" and dtype.isnative and not spell_non_finite and out.datatype in _NUMPY_JSON_FLOATS:
                entry["data"] = data.ravel()  # the usual float output (_json_data's first case, a call fewer)
            else:
                entry["data"] = _json_data(data, out.datatype, spell_non_finite)
        outputs.append(entry)
    doc: dict[str, Any] = {"id": response.id} if response.id else {}
    doc["model_name"] = response.model_name
    doc["model_version"] = str(response.model_version)
    if response.parameters:
        doc["parameters"] = response.parameters
    doc["outputs"] = outputs
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY), blobs
