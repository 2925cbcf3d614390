"""ModelInferRequest -> InferenceRequest and InferenceResponse -> ModelInferResponse."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from naiad.frontends.grpc.params import apply_request_params, fill_params, params_to_dict
from naiad.protocol.datatypes import NUMPY_DTYPES, WIRE_DTYPES
from naiad.protocol.errors import NaiadError, invalid_arg, unsupported
from naiad.protocol.tensor_codec import (
    array_from_raw,
    check_datatype,
    element_count,
    parse_shape,
    serialize_bytes,
)
from naiad.protocol.types import (
    InferenceRequest,
    InferenceResponse,
    InferInput,
    RequestedOutput,
    SharedMemoryRef,
)

SHM_DISABLED_MESSAGE = (
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
)
_SHM_KEYS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")

# datatype -> (InferTensorContents field, dtype the field's values are read as)
_CONTENTS: dict[str, tuple[str, np.dtype]] = {
    "BOOL": ("bool_contents", np.dtype(np.bool_)),
    "INT8": ("int_contents", np.dtype(np.int32)),
    "INT16": ("int_contents", np.dtype(np.int32)),
    "INT32": ("int_contents", np.dtype(np.int32)),
    "INT64": ("int64_contents", np.dtype(np.int64)),
    "UINT8": ("uint_contents", np.dtype(np.uint32)),
    "UINT16": ("uint_contents", np.dtype(np.uint32)),
    "UINT32": ("uint_contents", np.dtype(np.uint32)),
    "UINT64": ("uint64_contents", np.dtype(np.uint64)),
    "FP32": ("fp32_contents", np.dtype(np.float32)),
    "FP64": ("fp64_contents", np.dtype(np.float64)),
    "BYTES": ("bytes_contents", np.dtype(np.object_)),
}
_NARROW = frozenset(("INT8", "INT16", "UINT8", "UINT16"))


# ---------------------------------------------------------------- shared memory parameters


def _shm_ref(params: Any, owner: str, model: str) -> SharedMemoryRef | None:
    """Shared-memory parameters of an input or requested output, or None when it has none."""
    if not any(key in params for key in _SHM_KEYS):
        return None
    if "shared_memory_region" not in params or "shared_memory_byte_size" not in params:
        raise invalid_arg(
            f"{owner} for model '{model}' must specify both 'shared_memory_region' and "
            "'shared_memory_byte_size' when using shared memory"
        )
    region = params["shared_memory_region"]
    if region.WhichOneof("parameter_choice") != "string_param":
        raise invalid_arg(f"invalid value type for 'shared_memory_region' of {owner}, expected string_param.")
    sizes = []
    for key in ("shared_memory_byte_size", "shared_memory_offset"):
        if key not in params:
            sizes.append(0)
            continue
        param = params[key]
        choice = param.WhichOneof("parameter_choice")
        if choice not in ("int64_param", "uint64_param") or getattr(param, choice) < 0:
            raise invalid_arg(f"'{key}' of {owner} must be a non-negative int64_param")
        sizes.append(getattr(param, choice))
    return SharedMemoryRef(region=region.string_param, byte_size=sizes[0], offset=sizes[1])


# ---------------------------------------------------------------- inputs


def array_from_contents(
    datatype: str, shape: tuple[int, ...], contents: pb.InferTensorContents, name: str, model: str
) -> np.ndarray:
    """Decode the typed `contents` of an input; the element count must match the shape."""
    count = element_count(shape)
    spec = _CONTENTS.get(datatype)
    if spec is None:
        if count == 0 and not contents.ListFields():
            return np.empty(shape, dtype=WIRE_DTYPES[datatype])
        raise invalid_arg(
            f"{datatype} data for input '{name}' for model '{model}' must be sent in raw_input_contents: "
            "InferTensorContents has no field for it"
        )
    field_name, read_dtype = spec
    for descriptor, _ in contents.ListFields():
        if descriptor.name != field_name:
            raise invalid_arg(
                f"unexpected '{descriptor.name}' in contents of input '{name}' for model '{model}': "
                f"{datatype} data goes in '{field_name}'"
            )
    values = getattr(contents, field_name)
    if len(values) != count:
        raise invalid_arg(
            f"unexpected number of elements {len(values)} in contents of input '{name}' for model "
            f"'{model}', expecting {count} for shape {list(shape)}"
        )
    if datatype == "BYTES":
        array = np.empty(count, dtype=np.object_)
        array[:] = list(values)
        return array.reshape(shape)
    array = np.fromiter(values, dtype=read_dtype, count=count)
    if datatype in _NARROW and count:
        target = np.iinfo(WIRE_DTYPES[datatype])
        if int(array.min()) < target.min or int(array.max()) > target.max:
            raise invalid_arg(
                f"value out of range for {datatype} in contents of input '{name}' for model '{model}'"
            )
    native = WIRE_DTYPES[datatype].newbyteorder("=")
    if array.dtype != native:
        array = array.astype(native)
    return array.reshape(shape)


def _decode_inputs(request: pb.ModelInferRequest, allow_shared_memory: bool,
                   raw: Sequence[bytes] | None = None) -> list[InferInput]:
    if raw is None:
        raw = request.raw_input_contents
    n_raw = len(raw)
    raw_index = 0
    inputs: list[InferInput] = []
    for tensor in request.inputs:
        params = tensor.parameters
        wire = WIRE_DTYPES.get(tensor.datatype)  # None for BYTES and unknown datatypes
        if wire is not None and not params and raw_index < n_raw and not tensor.HasField("contents"):
            # the common case: a fixed-size tensor in raw_input_contents, no parameters
            shape = tuple(tensor.shape[:])
            buffer = raw[raw_index]
            if (not shape or min(shape) >= 0) and len(buffer) == wire.itemsize * math.prod(shape):
                array = np.ndarray(shape, wire, buffer)  # a read-only view of the message's bytes
                if not wire.isnative:  # a big-endian host: a converted copy
                    array = array.astype(NUMPY_DTYPES[tensor.datatype])
                inputs.append(InferInput(tensor.name, tensor.datatype, shape, array, {}, None))
                raw_index += 1
                continue
        data, used = _decode_input(tensor, request, raw, raw_index, allow_shared_memory)
        inputs.append(data)
        raw_index += used
    if raw_index != n_raw:
        raise _raw_count_error(request, n_raw)
    return inputs


def _decode_input(tensor: Any, request: pb.ModelInferRequest, raw: Any, raw_index: int,
                  allow_shared_memory: bool) -> tuple[InferInput, int]:
    """One input, checked in full (shared memory, typed contents, parameters); and how many
    raw_input_contents entries it took (0 or 1)."""
    model = request.model_name
    n_raw = len(raw)
    name = tensor.name
    datatype = check_datatype(tensor.datatype, name)
    shape = parse_shape(list(tensor.shape), name)
    params = tensor.parameters
    ref = _shm_ref(params, f"input '{name}'", model) if params else None
    has_contents = tensor.HasField("contents")
    data: np.ndarray | None
    used = 0
    if ref is not None:
        if has_contents:
            raise invalid_arg(
                f"contents field must not be specified when using shared memory for '{name}' "
                f"for model '{model}'"
            )
        if not allow_shared_memory:
            raise unsupported(SHM_DISABLED_MESSAGE)
        data = None  # the core reads the region
    elif n_raw:
        if has_contents:
            raise invalid_arg(
                f"contents field must not be specified when using raw_input_contents for '{name}' "
                f"for model '{model}'"
            )
        if raw_index >= n_raw:
            raise _raw_count_error(request, n_raw)
        data = array_from_raw(datatype, shape, raw[raw_index], name)
        used = 1
    else:
        data = array_from_contents(datatype, shape, tensor.contents, name, model)
    extra = params_to_dict(params) if params else {}
    for key in _SHM_KEYS:
        extra.pop(key, None)
    return InferInput(name=name, datatype=datatype, shape=shape, data=data, parameters=extra, shared_memory=ref), used


def _raw_count_error(request: pb.ModelInferRequest, n_raw: int) -> NaiadError:
    needed = 0
    for tensor in request.inputs:
        if not any(key in tensor.parameters for key in _SHM_KEYS):
            needed += 1
    return invalid_arg(
        f"expected {needed} raw_input_contents entries (one per input not in shared memory) but got "
        f"{n_raw} for model '{request.model_name}'"
    )


def _decode_outputs(request: pb.ModelInferRequest, allow_shared_memory: bool) -> list[RequestedOutput]:
    model = request.model_name
    outputs: list[RequestedOutput] = []
    for tensor in request.outputs:
        name = tensor.name
        params = tensor.parameters
        if not params:
            outputs.append(RequestedOutput(name=name))
            continue
        ref = _shm_ref(params, f"output '{name}'", model)
        if ref is not None and not allow_shared_memory:
            raise unsupported(SHM_DISABLED_MESSAGE)
        classification = 0
        if "classification" in params:
            param = params["classification"]
            choice = param.WhichOneof("parameter_choice")
            if choice not in ("int64_param", "uint64_param") or getattr(param, choice) < 0:
                raise invalid_arg(
                    f"invalid value type for 'classification' of output '{name}', "
                    "expected a non-negative int64_param."
                )
            classification = getattr(param, choice)
        if classification and ref is not None:
            raise invalid_arg(
                f"output '{name}' for model '{model}' cannot use both classification and shared memory"
            )
        extra = params_to_dict(params)
        for key in (*_SHM_KEYS, "classification"):
            extra.pop(key, None)
        outputs.append(
            RequestedOutput(name=name, parameters=extra, classification=classification, shared_memory=ref)
        )
    return outputs


def decode_infer_request(
    request: pb.ModelInferRequest,
    allow_shared_memory: bool,
    raw: Sequence[bytes] | None = None,
) -> InferenceRequest:
    """Decode a ModelInferRequest; raises NaiadError (INVALID_ARG) on malformed input.

    Shared-memory inputs and outputs are decoded as references (the core reads and writes the
    regions); with `allow_shared_memory` False (--allow-client-shm=false) they are refused.
    The model name was checked by the caller (InferenceServicer._decode), before anything else.
    `raw`: the message's raw_input_contents, when the caller has taken them out already.
    """
    try:
        inputs = _decode_inputs(request, allow_shared_memory, raw)
    except ValueError as exc:  # numpy refusing a shape (too many dims, too large)
        raise invalid_arg(f"invalid input tensor for model '{request.model_name}': {exc}") from None
    decoded = InferenceRequest(
        model_name=request.model_name,
        inputs=inputs,
        model_version=request.model_version,
        id=request.id,
        outputs=_decode_outputs(request, allow_shared_memory) if request.outputs else [],
    )
    if request.parameters:
        apply_request_params(request.parameters, decoded)
    return decoded


# ---------------------------------------------------------------- responses


def raw_bytes(array: np.ndarray, datatype: str) -> bytes:
    """Raw little-endian wire bytes of an output (length-prefixed elements for BYTES)."""
    if datatype == "BYTES":
        return serialize_bytes(array)
    wire = WIRE_DTYPES.get(datatype)
    if wire is not None and array.dtype != wire:
        array = array.astype(wire)
    return array.tobytes()


def encode_infer_response(response: InferenceResponse) -> pb.ModelInferResponse:
    """Every output goes to raw_output_contents, in order; shared-memory outputs get an empty entry."""
    message = pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id,
    )
    outputs = message.outputs
    raw: list[bytes] = []
    for out in response.outputs:
        tensor = outputs.add(name=out.name, datatype=out.datatype, shape=out.shape)
        if out.parameters:
            fill_params(tensor.parameters, out.parameters)
        raw.append(b"" if out.data is None else raw_bytes(out.data, out.datatype))
    message.raw_output_contents.extend(raw)
    if response.parameters:
        fill_params(message.parameters, response.parameters)
    return message
