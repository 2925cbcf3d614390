"""Raw binary infer requests (Inference-Header-Content-Length: 0): the body is the model's single input."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.protocol.datatypes import BYTE_SIZES, CONFIG_TO_PROTOCOL
from naiad.protocol.errors import invalid_arg, request_prefix
from naiad.protocol.tensor_codec import array_from_raw
from naiad.protocol.types import InferenceRequest, InferInput

if TYPE_CHECKING:
    from naiad.core.facade import ResolvedModel


def decode_raw_request(resolved: ResolvedModel, model: str, version: str, body: bytes) -> InferenceRequest:
    """Build the one input from the resolved model's config: batch dim 1, one variable dim deduced from the size."""
    config = resolved.config
    prefix = request_prefix("")
    if len(config.input) != 1:
        raise invalid_arg(
            f"{prefix}Raw request must only have 1 input (found 1) to be deduced but got "
            f"{len(config.input)} inputs in '{model}' model configuration"
        )
    spec = config.input[0]
    datatype = CONFIG_TO_PROTOCOL.get(mc.DataType.Name(spec.data_type))
    if datatype is None:
        raise invalid_arg(f"{prefix}raw input '{spec.name}' has an unsupported datatype in '{model}' model configuration")
    shape: list[int] = [1] if config.max_batch_size > 0 else []
    dynamic_axis = -1
    fixed_count = 1
    for dim in spec.dims:
        if dim == -1:
            if dynamic_axis != -1:
                raise invalid_arg(
                    f"{prefix}The shape of the raw input '{spec.name}' can not be deduced because there are "
                    "more than one variable-sized dimension"
                )
            dynamic_axis = len(shape)
        else:
            fixed_count *= dim
        shape.append(dim)
    if datatype == "BYTES":
        if dynamic_axis != -1 or fixed_count != 1:
            raise invalid_arg(f"{prefix}For BYTE datatype raw input, the model must have input shape [1]")
        array = np.empty(1, dtype=np.object_)
        array[0] = bytes(body)
        data = array.reshape(shape)
    else:
        if dynamic_axis != -1:
            unit = fixed_count * BYTE_SIZES[datatype]
            shape[dynamic_axis] = len(body) // unit if unit else 0
        data = array_from_raw(datatype, tuple(shape), body, spec.name)
    return InferenceRequest(
        model_name=model,
        model_version=version,
        inputs=[InferInput(spec.name, datatype, tuple(shape), data)],
    )
