"""ModelConfig (the auto_complete_config wrapper) and the helper functions around configs, tensors and BYTES."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

from triton_python_backend_utils._request import InferenceRequest

_INPUT_KEYS = ("name", "data_type", "dims", "optional", "reshape", "is_shape_tensor")
_OUTPUT_KEYS = ("name", "data_type", "dims", "reshape", "is_shape_tensor", "label_filename")
_LEN = struct.Struct("<I")


class ModelConfig:
    """The model configuration handed to auto_complete_config; mutate it, then return it."""

    def __init__(self, model_config: str | dict) -> None:
        config = json.loads(model_config) if isinstance(model_config, str) else model_config
        config.setdefault("name", "")
        config.setdefault("max_batch_size", 0)
        config.setdefault("input", [])
        config.setdefault("output", [])
        self._model_config = config

    def as_dict(self) -> dict:
        return self._model_config

    def _name(self) -> str:
        return self._model_config.get("name", "")

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = int(self._model_config.get("max_batch_size", 0) or 0)
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config function for "
                f"model '{self._name()}' specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but auto-complete-config function for "
                    f"model '{self._name()}' tries to set scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def _add(self, kind: str, tensor: dict, allowed: tuple) -> None:
        name = tensor.get("name")
        for key in tensor:
            if key not in allowed:
                raise ValueError(
                    f"{kind} '{name}' in auto-complete-config function for model '{self._name()}' contains property "
                    f"other than {', '.join(repr(k) for k in allowed)}."
                )
        if "name" not in tensor:
            raise ValueError(f"{kind} in auto-complete-config function for model '{self._name()}' is missing 'name' property.")
        for required in ("data_type", "dims"):
            if required not in tensor:
                raise ValueError(
                    f"{kind} '{name}' in auto-complete-config function for model '{self._name()}' is missing "
                    f"'{required}' property."
                )
        field = self._model_config.setdefault(kind, [])
        for current in field:
            if current.get("name") != name:
                continue
            current_type = current.get("data_type", "TYPE_INVALID")
            if current_type not in ("TYPE_INVALID", "") and current_type != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{self._name()}', configuration expects datatype {current_type} for "
                    f"{kind} '{name}', model provides {tensor['data_type']}"
                )
            current_dims = [int(d) for d in current.get("dims", [])]
            if current_dims and current_dims != [int(d) for d in tensor["dims"]]:
                raise ValueError(
                    f"model '{self._name()}', tensor '{name}': the model expects dims {list(tensor['dims'])} but the "
                    f"model configuration specifies dims {current_dims}"
                )
            if kind == "input" and "optional" in current and "optional" in tensor and current["optional"] != tensor["optional"]:
                raise ValueError(
                    f"model '{self._name()}', tensor '{name}': the model expects optional {tensor['optional']} but "
                    f"the model configuration specifies optional {current['optional']}"
                )
            current.update(tensor)
            return
        field.append(dict(tensor))

    def add_input(self, input: dict) -> None:  # Triton's parameter name
        self._add("input", input, _INPUT_KEYS)

    def add_output(self, output: dict) -> None:
        self._add("output", output, _OUTPUT_KEYS)

    def set_model_transaction_policy(self, transaction_policy_dict: dict) -> None:
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    f"model transaction property in auto-complete-config function for model '{self._name()}' "
                    "contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = bool(transaction_policy_dict["decoupled"])
            if "decoupled" in policy and bool(policy["decoupled"]) != wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model '{self._name()}', which "
                    f"is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted


def get_input_tensor_by_name(inference_request: Any, name: str) -> Any:
    if type(inference_request) is InferenceRequest and inference_request._handle is not None:
        # A request received in execute(): its inputs are the worker's own Tensor objects.
        for tensor in inference_request._inputs:
            if tensor._name == name:
                return tensor
        return None
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: Any, name: str) -> Any:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def _config_entry(model_config: dict, field: str, name: str) -> dict | None:
    for entry in model_config.get(field, []) or []:
        if entry.get("name") == name:
            return entry
    return None


def get_input_config_by_name(model_config: dict, name: str) -> dict | None:
    return _config_entry(model_config, "input", name)


def get_output_config_by_name(model_config: dict, name: str) -> dict | None:
    return _config_entry(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config: dict) -> bool:
    policy = model_config.get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


def serialize_byte_tensor(input_tensor: np.ndarray) -> Any:
    """Length-prefixed serialization of an object/bytes_ tensor as one bytes value (() when empty, None otherwise)."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        return None
    parts = []
    for value in input_tensor.ravel(order="C").tolist():  # Python objects: bytes for a bytes_ array
        data = value if isinstance(value, bytes) else str(value).encode("utf-8")
        parts.append(_LEN.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """Inverse of serialize_byte_tensor: a 1-D object array of bytes."""
    data = bytes(encoded_tensor)
    items = []
    offset = 0
    while offset < len(data):
        (length,) = _LEN.unpack_from(data, offset)
        offset += 4
        items.append(data[offset : offset + length])
        offset += length
    result = np.empty(len(items), dtype=np.object_)
    result[:] = items
    return result
