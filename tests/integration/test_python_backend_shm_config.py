"""--backend-config python,shm-default-byte-size / shm-growth-byte-size / shm-region-prefix-name shape the worker's segments."""

from __future__ import annotations

import uuid

import numpy as np
import tritonclient.http as httpclient

from tests.integration.test_python_backend_support import write_model
from tests.support.servers import start_server

IDENTITY_PID_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""

IDENTITY_PID_PY = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy().copy()),
            pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
        ]) for r in requests]
"""


def _infer(server, array: np.ndarray):
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("IN", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return client.infer("identity", [tensor])


def _segment_sizes(pid: int, prefix: str) -> list[int]:
    """Sizes of the shared-memory segments with our prefix mapped by the worker (its own and the server's)."""
    sizes = []
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5].startswith(f"/dev/shm/{prefix}"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                sizes.append(end - start)
    return sizes


def test_small_default_and_growth_size_the_blocks(tmp_path):
    prefix = f"nq{uuid.uuid4().hex[:8]}_"
    write_model(tmp_path, "identity", IDENTITY_PID_CONFIG, IDENTITY_PID_PY)
    server = start_server(tmp_path, f"--backend-config=python,shm-region-prefix-name={prefix}",
                          "--backend-config=python,shm-default-byte-size=8192",
                          "--backend-config=python,shm-growth-byte-size=65536")
    try:
        small = np.arange(16, dtype=np.float32)
        result = _infer(server, small)
        np.testing.assert_array_equal(result.as_numpy("OUT"), small)
        pid = int(result.as_numpy("PID")[0])
        assert set(_segment_sizes(pid, prefix)) == {8192}  # everything fits the tiny default blocks

        big = np.random.default_rng(0).random(25_600, dtype=np.float32)  # 100 KiB: more than the default
        result = _infer(server, big)
        np.testing.assert_array_equal(result.as_numpy("OUT"), big)
        # Grown by whole 64 KiB increments: 8 KiB + 2 x 64 KiB, for the input block and the output block.
        sizes = _segment_sizes(pid, prefix)
        assert sizes.count(8192 + 2 * 65536) == 2
        assert all(size == 8192 or (size - 8192) % 65536 == 0 for size in sizes)
    finally:
        server.stop()


def test_invalid_byte_size_fails_the_load_with_a_clear_error(tmp_path):
    write_model(tmp_path, "identity", IDENTITY_PID_CONFIG, IDENTITY_PID_PY)
    server = start_server(tmp_path, "--backend-config=python,shm-growth-byte-size=0")
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        assert not client.is_model_ready("identity")
        index = client.get_model_repository_index()
        reason = next(m for m in index if m["name"] == "identity").get("reason", "")
        assert "shm-growth-byte-size must be a positive number of bytes" in reason
    finally:
        server.stop()
