"""A config's inputs and outputs against the tensors an ONNX model declares, by the rules (and in the words)
of Triton's ONNX Runtime backend. Shared by the server's onnxruntime backend and `naiad repo lint`, which
read the model's metadata themselves and hand it over as ModelTensor lists.

Rules: the model must have as many inputs as the config lists (plus sequence controls and states); every
config tensor must exist in the model with the same datatype; dims (or the reshape, when given) must match
the model's shape: with max_batch_size > 0 the model's first dimension must be -1 and the rest must match
the config dims. A model dimension of -1 accepts any config value for inputs; outputs must match exactly.
A model scalar (rank 0) takes config dims of 1 only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from naiad.config.model_config import datatype_name

# onnxruntime's type strings (NodeArg.type) -> config datatypes.
ORT_TYPES = {
    "tensor(bool)": mc.TYPE_BOOL,
    "tensor(uint8)": mc.TYPE_UINT8,
    "tensor(uint16)": mc.TYPE_UINT16,
    "tensor(uint32)": mc.TYPE_UINT32,
    "tensor(uint64)": mc.TYPE_UINT64,
    "tensor(int8)": mc.TYPE_INT8,
    "tensor(int16)": mc.TYPE_INT16,
    "tensor(int32)": mc.TYPE_INT32,
    "tensor(int64)": mc.TYPE_INT64,
    "tensor(float16)": mc.TYPE_FP16,
    "tensor(float)": mc.TYPE_FP32,
    "tensor(double)": mc.TYPE_FP64,
    "tensor(string)": mc.TYPE_STRING,
    "tensor(bfloat16)": mc.TYPE_BF16,
}


@dataclass(frozen=True)
class ModelTensor:
    """One input or output as the model file declares it."""

    name: str
    data_type: int  # mc.TYPE_*; TYPE_INVALID when the model's type has no config equivalent
    shape: tuple[int, ...]  # -1 for a dynamic dimension


@dataclass(frozen=True)
class IoMismatch:
    """One way the config contradicts the model."""

    field: str  # the config field: "input", "output.data_type", "input.dims", ...
    tensor: str  # the tensor it is about ("" when it is about the inputs as a whole)
    message: str


def ort_tensor(name: str, type_name: str, shape: Sequence[object]) -> ModelTensor:
    """A ModelTensor from onnxruntime's NodeArg fields (symbolic or unknown dimensions become -1)."""
    dims = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in shape)
    return ModelTensor(name, ORT_TYPES.get(type_name, mc.TYPE_INVALID), dims)


def can_batch(inputs: Sequence[ModelTensor], outputs: Sequence[ModelTensor]) -> bool:
    """Every tensor has a dynamic first dimension, so the model takes a batch dimension."""
    tensors = [*inputs, *outputs]
    return bool(tensors) and all(t.shape and t.shape[0] == -1 for t in tensors)


def completed_max_batch_size(config: mc.ModelConfig, inputs: Sequence[ModelTensor], outputs: Sequence[ModelTensor],
                             default_max_batch_size: int) -> int:
    """max_batch_size after auto-complete: a batchable model with max_batch_size 0 gets the default,
    unless the config lists an input with the model's full rank (it meant "no batching")."""
    configured: int = config.max_batch_size
    if configured != 0 or not can_batch(inputs, outputs):
        return configured
    full_rank = any(len(c.dims) == len(t.shape) for c in config.input for t in inputs if c.name == t.name)
    return configured if full_rank else max(default_max_batch_size, 0)


def _shape(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _dims_problem(model: str, tensor: str, model_shape: tuple[int, ...], dims: list[int], max_batch_size: int,
                  exact: bool) -> str | None:
    if not model_shape:
        if any(d != 1 for d in dims):
            return (f"unable to load model '{model}', scalar tensor '{tensor}', should only provide 1 in the model "
                    f"configuration when the model doesn't support batching. Model configuration provided: "
                    f"{_shape(dims)}.")
        return None
    if max_batch_size > 0:
        if model_shape[0] != -1:
            return (f"model '{model}', tensor '{tensor}': for the model to support batching the shape should have at "
                    "least 1 dimension and the first dimension must be -1; but shape expected by the model is "
                    f"{_shape(model_shape)}")
        full = [-1, *dims]
        if not _dims_match(model_shape, full, exact):
            return (f"model '{model}', tensor '{tensor}': the model expects {len(model_shape)} dimensions (shape "
                    f"{_shape(model_shape)}) but the model configuration specifies {len(full)} dimensions (an initial "
                    "batch dimension because max_batch_size > 0 followed by the explicit tensor shape, making "
                    f"complete shape {_shape(full)})")
        return None
    if not _dims_match(model_shape, dims, exact):
        return (f"model '{model}', tensor '{tensor}': the model expects {len(model_shape)} dimensions (shape "
                f"{_shape(model_shape)}) but the model configuration specifies {len(dims)} dimensions (shape "
                f"{_shape(dims)})")
    return None


def _dims_match(model_shape: tuple[int, ...], dims: list[int], exact: bool) -> bool:
    if len(model_shape) != len(dims):
        return False
    return all(m == d for m, d in zip(model_shape, dims) if exact or m != -1)


def _control_count(config: mc.ModelConfig) -> int:
    if not config.HasField("sequence_batching"):
        return 0
    return len(config.sequence_batching.control_input) + len(config.sequence_batching.state)


def check_model_io(config: mc.ModelConfig, inputs: Sequence[ModelTensor], outputs: Sequence[ModelTensor],
                   count_inputs: bool = True) -> list[IoMismatch]:
    """Every contradiction between the config's tensors and the model's (Triton reports the first).

    `count_inputs` False skips the input count (a config that auto-complete will still add inputs to).
    """
    name = config.name
    problems: list[IoMismatch] = []
    batch_outputs = {n for b in config.batch_output for n in b.target_name}
    for kind, declared, model in (("input", config.input, inputs), ("output", config.output, outputs)):
        by_name = {t.name: t for t in model}
        for tensor in declared:
            found = by_name.get(tensor.name)
            if found is None:
                allowed = ", ".join(sorted(by_name))
                problems.append(IoMismatch(kind, tensor.name, f"unexpected inference {kind} '{tensor.name}', "
                                                              f"allowed {kind}s are: {allowed}"))
                continue
            if tensor.data_type != found.data_type:
                problems.append(IoMismatch(
                    f"{kind}.data_type", tensor.name,
                    f"unable to load model '{name}', configuration expects datatype {mc.DataType.Name(tensor.data_type)} "
                    f"for {kind} '{tensor.name}', model provides TYPE_{datatype_name(found.data_type)}"))
                continue
            if kind == "output" and tensor.name in batch_outputs:
                continue  # a batch output's shape need not match the model
            if kind == "input" and tensor.optional and config.max_batch_size != 0:
                problems.append(IoMismatch("input.optional", tensor.name, f"unable to load model '{name}', optional input "
                                           f"'{tensor.name}' is not supported for models that support batching"))
                continue
            if kind == "input" and tensor.allow_ragged_batch:
                if found.shape != (-1,):
                    problems.append(IoMismatch(
                        "input.allow_ragged_batch", tensor.name,
                        f"unable to load model '{name}', configuration expects model provides input with shape [-1] "
                        f"for ragged input '{tensor.name}', model provides {_shape(found.shape)}"))
                continue
            reshaped = tensor.HasField("reshape")
            dims = list(tensor.reshape.shape) if reshaped else list(tensor.dims)
            problem = _dims_problem(name, tensor.name, found.shape, dims, config.max_batch_size, exact=kind == "output")
            if problem is not None:
                problems.append(IoMismatch(f"{kind}.reshape" if reshaped else f"{kind}.dims", tensor.name, problem))
    expected = len(config.input) + _control_count(config)
    if count_inputs and not problems and expected != len(inputs):
        # Triton checks the count first; auto-complete adds the model inputs a config leaves out, so here a
        # wrong count without a wrong name means inputs are missing from a config that is not completed.
        problems.append(IoMismatch("input", "", f"unable to load model '{name}', configuration expects {expected} "
                                                f"inputs, model provides {len(inputs)}"))
    return problems
