"""Model repositories for the Python-backend tests: Triton model.py files written verbatim (no tests here)."""

from __future__ import annotations

import os
from pathlib import Path
from textwrap import dedent

ALL_TYPES = {
    "BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16", "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64", "INT8": "TYPE_INT8", "INT16": "TYPE_INT16", "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64", "FP16": "TYPE_FP16", "FP32": "TYPE_FP32", "FP64": "TYPE_FP64", "BYTES": "TYPE_STRING",
}


def write_model(repo: Path, name: str, config: str, model_py: str, version: int = 1) -> Path:
    model_dir = repo / name
    (model_dir / str(version)).mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(dedent(config))
    (model_dir / str(version) / "model.py").write_text(dedent(model_py))
    return model_dir


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


ADD_SUB_CONFIG = """
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: {dt} dims: [ 16 ] }}, {{ name: "INPUT1" data_type: {dt} dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: {dt} dims: [ 16 ] }}, {{ name: "OUTPUT1" data_type: {dt} dims: [ 16 ] }} ]
"""

ADD_SUB_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.config = json.loads(args["model_config"])
        out0 = pb_utils.get_output_config_by_name(self.config, "OUTPUT0")
        self.dtype = pb_utils.triton_string_to_numpy(out0["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if a.dtype == np.object_:
                out0 = np.array([x + y for x, y in zip(a.ravel(), b.ravel())], dtype=np.object_).reshape(a.shape)
                out1 = np.array([x[::-1] for x in a.ravel()], dtype=np.object_).reshape(a.shape)
            else:
                out0, out1 = (a + b).astype(self.dtype), (a - b).astype(self.dtype)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", out0), pb_utils.Tensor("OUTPUT1", out1)]))
        return responses
"""


def add_sub(repo: Path, name: str = "add_sub", datatype: str = "TYPE_FP32") -> Path:
    return write_model(repo, name, ADD_SUB_CONFIG.format(dt=datatype), ADD_SUB_PY)


IDENTITY_ALL_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = [pb_utils.Tensor(t.name().replace("IN_", "OUT_"), t.as_numpy()) for t in request.inputs()]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""


def identity_all_types(repo: Path, name: str = "identity_all") -> Path:
    inputs = ", ".join(f'{{ name: "IN_{d}" data_type: {t} dims: [ -1 ] }}' for d, t in ALL_TYPES.items())
    outputs = ", ".join(f'{{ name: "OUT_{d}" data_type: {t} dims: [ -1 ] }}' for d, t in ALL_TYPES.items())
    config = f'backend: "python"\nmax_batch_size: 0\ninput [ {inputs} ]\noutput [ {outputs} ]\n'
    return write_model(repo, name, config, IDENTITY_ALL_PY)


SIMPLE_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

ERROR_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        code = pb_utils.TritonError.INVALID_ARG if requests[0].request_id() == "bad-arg" else pb_utils.TritonError.INTERNAL
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("custom error response", code)) for _ in requests]
"""

RAISE_PY = """
def _helper():
    raise ValueError("boom from execute")


class TritonPythonModel:
    def execute(self, requests):
        _helper()
"""

INIT_RAISE_PY = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("init exploded")

    def execute(self, requests):
        return []
"""

REPEAT_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

REPEAT_PY = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            threading.Thread(target=self._respond, args=(sender, count)).start()
        return None

    def _respond(self, sender, count):
        for i in range(count):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], dtype=np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        try:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except pb_utils.TritonModelException as exc:
            assert "Response sender has been closed" in str(exc)
"""

PID_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "SLEEP" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { count: %d kind: KIND_CPU } ]
"""

PID_PY = """
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.marker_dir = os.path.join(args["model_repository"], "markers")
        os.makedirs(self.marker_dir, exist_ok=True)

    def execute(self, requests):
        seconds = float(pb_utils.get_input_tensor_by_name(requests[0], "SLEEP").as_numpy()[0])
        open(os.path.join(self.marker_dir, f"executing-{os.getpid()}"), "w").close()
        time.sleep(seconds)  # the execution time the request asks for
        pid = np.array([os.getpid()], dtype=np.int64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", pid)]) for _ in requests]

    def finalize(self):
        open(os.path.join(self.marker_dir, f"finalized-{os.getpid()}"), "w").close()
"""
