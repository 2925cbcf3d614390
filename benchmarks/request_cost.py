"""Server CPU per request without sockets: Server.infer_async on add_sub (ONNX, inline), and the HTTP codec.

    .venv/bin/python benchmarks/request_cost.py [REPO]   (default: a copy of examples/models/add_sub)

Compare with the CPU per request of a served run (run_onnx_bench.py, python_backend_bench.py): what
is left is the transport (sockets, event loop, HTTP or gRPC framing). Pin it like the servers
(`taskset -c 0`) for comparable figures.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from naiad import Server
from naiad.frontends.http.infer_codec import decode_infer_request, encode_infer_response
from naiad.protocol.types import InferenceRequest, InferInput

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "models"
CALLS = 20_000
ONES = np.ones((1, 16), np.float32)


def add_sub_request() -> InferenceRequest:
    return InferenceRequest("add_sub", [InferInput("INPUT0", "FP32", (1, 16), ONES),
                                        InferInput("INPUT1", "FP32", (1, 16), ONES)])


def binary_body() -> tuple[bytes, int]:
    """The HTTP body load.py sends for add_sub (binary tensors both ways) and its JSON header length."""
    inputs = [{"name": n, "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}}
              for n in ("INPUT0", "INPUT1")]
    outputs = [{"name": n, "parameters": {"binary_data": True}} for n in ("OUTPUT0", "OUTPUT1")]
    header = json.dumps({"inputs": inputs, "outputs": outputs}).encode()
    return header + ONES.tobytes() * 2, len(header)


def cpu_us(call: Callable[[], object]) -> float:
    started = time.process_time()
    for _ in range(CALLS):
        call()
    return (time.process_time() - started) / CALLS * 1e6


async def measure(repo: str) -> None:
    server = Server(model_repository=repo)
    await server.startup()
    try:
        for _ in range(2000):  # warm-up: the instance settles on inline execution
            await server.infer_async(add_sub_request())
        started = time.process_time()
        for _ in range(CALLS):
            await server.infer_async(add_sub_request())
        core = (time.process_time() - started) / CALLS * 1e6
        body, header_length = binary_body()
        request, plan = decode_infer_request("add_sub", "", body, header_length)
        response = await server.infer_async(request)
        decode = cpu_us(lambda: decode_infer_request("add_sub", "", body, header_length))
        encode = cpu_us(lambda: encode_infer_response(response, plan))
        print(f"Server.infer_async (onnxruntime inline included) {core:.1f} us; "
              f"HTTP binary decode {decode:.1f} us; encode {encode:.1f} us")
    finally:
        await server.shutdown()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        if len(sys.argv) > 1:
            target = sys.argv[1]
        else:
            target = str(Path(tmp) / "models")
            shutil.copytree(EXAMPLES / "add_sub", Path(target) / "add_sub")
        asyncio.run(measure(target))
