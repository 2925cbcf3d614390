"""What every ensemble step needs: the internal request it sends and how its errors read."""

from __future__ import annotations

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.protocol.datatypes import datatype_of_array
from naiad.protocol.errors import NaiadError
from naiad.protocol.types import InferenceRequest, InferenceResponse, InferInput, RequestedOutput


def step_request(step: mc.ModelEnsembling.Step, inputs: dict[str, np.ndarray], parent: InferenceRequest | None) -> InferenceRequest:
    """The composing model's request: inputs by model input name; id, sequence, priority, timeout and parameters inherited."""
    tensors = [InferInput(name, datatype_of_array(array), tuple(array.shape), array) for name, array in inputs.items()]
    return InferenceRequest(
        model_name=step.model_name,
        model_version=str(step.model_version) if step.model_version >= 0 else "",
        inputs=tensors,
        outputs=[RequestedOutput(name) for name in step.output_map],
        id=parent.id if parent else "",
        parameters=dict(parent.parameters) if parent else {},
        priority=parent.priority if parent else 0,
        timeout_us=parent.timeout_us if parent else 0,
        sequence_id=parent.sequence_id if parent else 0,
        sequence_start=parent.sequence_start if parent else False,
        sequence_end=parent.sequence_end if parent else False,
    )


def step_outputs(response: InferenceResponse) -> dict[str, np.ndarray]:
    """A step's outputs by model output name (step requests never ask for shared memory, so all carry data)."""
    return {out.name: out.data for out in response.outputs if out.data is not None}


def step_error(ensemble: str, index: int, step: mc.ModelEnsembling.Step, exc: NaiadError) -> NaiadError:
    """A step's error as the ensemble request reports it: same code, the step named."""
    return NaiadError(exc.code, f"in ensemble '{ensemble}', step {index} ('{step.model_name}'): {exc.message}")
