"""Python-backend test models shared by several suites."""

from __future__ import annotations

from pathlib import Path

# A decoupled model: COUNT=n streams VALUE 0..n-1 then the final flag; a negative count is an error response.
COUNTER_CONFIG = """\
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "VALUE" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

COUNTER_PY = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            sender = request.get_response_sender()
            if count < 0:
                error = pb_utils.TritonError(f"count must not be negative, got {count}")
                sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            for i in range(count):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("VALUE", np.array([i], dtype=np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def write_counter_model(repo: Path, name: str = "counter", config: str = COUNTER_CONFIG) -> None:
    """`<repo>/<name>/config.pbtxt` and `1/model.py` of the decoupled counter."""
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.py").write_text(COUNTER_PY)


PARAMS_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

# Answers the request's parameters (a JSON object) so a test sees what reached the model.
PARAMS_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = request.parameters().encode()
            tensor = pb_utils.Tensor("PARAMS", np.array([text], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
        return responses
"""


def write_params_model(repo: Path, name: str = "params") -> None:
    """A Python model whose output PARAMS is the request's parameters as JSON text."""
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(PARAMS_CONFIG)
    (repo / name / "1" / "model.py").write_text(PARAMS_PY)


TEXT_ECHO_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

# The smallest model the OpenAI-compatible API serves (text_input -> text_output): it answers the prompt.
TEXT_ECHO_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("text_output", pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy())])
            for r in requests]
"""


def write_text_echo_model(repo: Path, name: str = "text_echo") -> None:
    """A Python model whose text_output is its text_input: an LLM as far as /v1 is concerned."""
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(TEXT_ECHO_CONFIG)
    (repo / name / "1" / "model.py").write_text(TEXT_ECHO_PY)
