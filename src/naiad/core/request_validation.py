"""Checks a decoded request against the model config (Triton's messages) and shapes it for the model."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

import numpy as np

from naiad.core.model_version import ModelVersion, TensorSpec
from naiad.protocol.errors import invalid_arg, request_prefix, unsupported
from naiad.protocol.types import InferenceRequest, InferInput
from naiad.runtime.shared_memory import DISABLED_MESSAGE, SystemSharedMemoryRegistry
from naiad.scheduling.base import WorkItem

# At most this many distinct shapes are remembered per input as valid (a bound on what clients can make it hold).
REMEMBERED_SHAPES = 64

_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended "
    "to each input shape. If you want to specify the full shape including the batch dim in your input dims "
    "config, try setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size."
)


def _fmt(shape: Iterable[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _shape_matches(expected: tuple[int, ...], got: tuple[int, ...]) -> bool:
    if len(expected) != len(got):
        return False
    for e, g in zip(expected, got):  # a plain loop: no generator per request
        if e != g and e != -1:
            return False
    return True


def _model_facing(array: np.ndarray, spec: TensorSpec, batched: bool) -> np.ndarray:
    """Apply `reshape`: the backend sees reshape.shape (after the batch dim) instead of dims."""
    if spec.reshape is None:
        return array
    lead = array.shape[:1] if batched else ()
    target = list(spec.reshape)
    if target.count(-1) > 1:
        # Variable reshape dims take the values of the input's variable dims, in order.
        variable = iter(d for d, e in zip(array.shape[len(lead):], spec.dims) if e == -1)
        target = [next(variable, 1) if d == -1 else d for d in target]
    return array.reshape(tuple(lead) + tuple(target))


def _names(names: list[str]) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"


def _check_input_count(model: ModelVersion, request: InferenceRequest, prefix: str) -> None:
    """Triton checks the number of inputs before anything else, naming the missing ones."""
    given = [inp.name for inp in request.inputs]
    count = len(given)
    missing = [n for n, spec in model.inputs.items() if not spec.optional and n not in given]
    if model.required_inputs == len(model.inputs):
        expected = f"expected {len(model.inputs)} inputs but got {count} inputs for model '{model.name}'"
    else:
        expected = (
            f"expected number of inputs between {model.required_inputs} and {len(model.inputs)} but got {count} "
            f"inputs for model '{model.name}'"
        )
    raise invalid_arg(
        f"{prefix}{expected}. Got input(s) {_names(given)}, but missing required input(s) {_names(missing)}. "
        "Please provide all required input(s)."
    )


def _read_shared(inp: InferInput, shared_memory: SystemSharedMemoryRegistry | None) -> np.ndarray:
    """An input sent by reference, as a view into its registered region (sizes checked against the shape)."""
    if inp.shared_memory is None:
        raise invalid_arg(f"input '{inp.name}' has neither data nor a shared memory region")
    if shared_memory is None:
        raise unsupported(DISABLED_MESSAGE)
    return shared_memory.read_tensor(inp.shared_memory, inp.datatype, inp.shape, inp.name)


def _check_shape(model: ModelVersion, request: InferenceRequest, input_name: str, shape: tuple[int, ...]) -> None:
    """Raise INVALID_ARG with Triton's message unless `shape` fits the input's dims and the batch limits;
    a shape that fits is remembered (`ModelVersion.accepted_shapes`): the next request with it skips these checks."""
    expected = model.input_shapes[input_name]
    batched = model.max_batch_size > 0
    if not _shape_matches(expected, shape):
        note = _BATCH_NOTE if batched else ""
        raise invalid_arg(
            f"{request_prefix(request.id)}unexpected shape for input '{input_name}' for model '{model.name}'. Expected "
            f"{_fmt(expected)}, got {_fmt(shape)}. {note}"
        )
    if batched:
        if shape[0] > model.max_batch_size:
            raise invalid_arg(
                f"{request_prefix(request.id)}inference request batch-size must be <= {model.max_batch_size} for '{model.name}'"
            )
        if shape[0] < 1:
            raise invalid_arg(f"{request_prefix(request.id)}inference request batch-size must be >= 1 for '{model.name}'")
    accepted = model.accepted_shapes[input_name]
    if len(accepted) < REMEMBERED_SHAPES:
        accepted.add(shape)


def validate_request(
    model: ModelVersion, request: InferenceRequest, shared_memory: SystemSharedMemoryRegistry | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
) -> WorkItem:
    """Return the WorkItem for a valid request, or raise INVALID_ARG with Triton's message.

    Inputs sent by shared-memory reference are read from `shared_memory` here (and kept in
    `InferInput.data`, for the response cache and traces). The item's future is made on `loop`
    (the server's; by default the running one)."""
    name = model.name
    batched = model.max_batch_size > 0
    specs = model.inputs
    if not model.required_inputs <= len(request.inputs) <= len(specs):
        _check_input_count(model, request, request_prefix(request.id))
    accepted = model.accepted_shapes
    inputs: dict[str, np.ndarray] = {}
    batch_size = 1
    for inp in request.inputs:
        data = inp.data
        if data is None:
            data = inp.data = _read_shared(inp, shared_memory)
        spec = specs.get(inp.name)
        if spec is None:
            raise invalid_arg(f"unexpected inference input '{inp.name}' for model '{name}'")
        if inp.name in inputs:
            raise invalid_arg(f"{request_prefix(request.id)}input '{inp.name}' already exists in request")
        if inp.datatype != spec.datatype:
            raise invalid_arg(
                f"{request_prefix(request.id)}inference input '{inp.name}' data-type is '{inp.datatype}', but model "
                f"'{name}' expects '{spec.datatype}'"
            )
        shape = tuple(inp.shape)
        if shape not in accepted[inp.name]:  # a set lookup, for the shapes this input took before
            _check_shape(model, request, inp.name, shape)
        if batched:
            rows = shape[0]
            if inputs and rows != batch_size:
                raise invalid_arg(
                    f"{request_prefix(request.id)}input '{inp.name}' batch size does not match other inputs for '{name}'"
                )
            batch_size = rows
        inputs[inp.name] = data if spec.reshape is None else _model_facing(data, spec, batched)
    if request.outputs:
        wanted = set()
        for out in request.outputs:
            if out.name not in model.outputs:
                raise invalid_arg(f"unexpected inference output '{out.name}' for model '{name}'")
            wanted.add(out.name)
        output_names = []  # responses follow the model's output order
        for n in model.outputs:  # a loop, not a comprehension: no function call per request (3.11)
            if n in wanted:
                output_names.append(n)
    else:
        output_names = list(model.outputs)
    future = (asyncio.get_running_loop() if loop is None else loop).create_future()
    now = time.perf_counter_ns()
    received = request.received_ns
    enqueued = received if 0 < received <= now else now
    return WorkItem(inputs, output_names, batch_size, request, None, future, enqueued)  # positional: a faster __init__
