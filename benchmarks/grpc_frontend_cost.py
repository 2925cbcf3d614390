"""CPU per unary ModelInfer call of Naiad's own gRPC server, without the core, sockets or a client.

    .venv/bin/python benchmarks/grpc_frontend_cost.py [--model add_sub|mlp] [--awaits]

One H2Connection of a real H2GrpcServer, with the real servicer, is fed complete calls (HEADERS and
DATA frames of the request load.py sends) straight into `data_received`; the inference facade
answers with a canned response at once (or, with --awaits, one event-loop turn later, as a batched
or threaded model does). What is measured is everything the gRPC frontend does for a call: frame
parsing, header decoding, the protobuf request and its tensors, the response, the answer's frames
and the write (to a transport that only counts). Best and median of 7 rounds of 5,000 calls, in
process CPU time, pinned to one core when there are several. Run it with PYTHONPATH pointing at
another checkout's `src/` to compare trees.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2_grpc as pb_grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import h2grpc
import load

from naiad.frontends.grpc import h2_wire as w
from naiad.frontends.grpc.guard import Guard
from naiad.frontends.grpc.h2_connection import H2Connection
from naiad.frontends.grpc.h2_server import H2GrpcServer
from naiad.frontends.grpc.servicer import InferenceServicer
from naiad.protocol.types import InferenceResponse, OutputTensor

INFER = "/inference.GRPCInferenceService/ModelInfer"
WARMUP, ROUNDS, CALLS = 2_000, 7, 5_000


class _Inference:
    """The facade's inference interface, answering every request with one canned response."""

    def __init__(self, response: InferenceResponse, awaits: bool) -> None:
        self._response, self._awaits = response, awaits

    async def infer(self, request: Any, **_: Any) -> InferenceResponse:
        if self._awaits:
            loop = asyncio.get_running_loop()
            done = loop.create_future()
            loop.call_soon(done.set_result, self._response)
            return await done
        return self._response

    def check_servable(self, *_: Any) -> None:
        return None


class _CountingTransport:
    def __init__(self) -> None:
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def pause_reading(self) -> None:
        return None

    def resume_reading(self) -> None:
        return None

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        return None


def _response(model: str) -> InferenceResponse:
    if model == "add_sub":
        outputs = [OutputTensor(name, "FP32", (1, 16), np.zeros((1, 16), np.float32)) for name in ("OUTPUT0", "OUTPUT1")]
    else:
        outputs = [OutputTensor("PROBABILITIES", "FP32", (1, 10), np.full((1, 10), 0.1, np.float32))]
    return InferenceResponse(model_name=model, model_version="1", outputs=outputs)


async def measure(model: str, awaits: bool) -> tuple[float, float, float]:
    """(best, median) µs of CPU per call, and writes per call."""
    workload = load.make_workload(model)
    server = SimpleNamespace(inference=_Inference(_response(workload.model), awaits),
                             config=SimpleNamespace(allow_client_shm=False))
    h2 = H2GrpcServer(guard=Guard([], ""))
    try:  # as GrpcFrontend builds it for the own server
        servicer = InferenceServicer(server, serialized_responses=True)
    except TypeError:  # a tree from before that option, when comparing trees
        servicer = InferenceServicer(server)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, h2)
    if hasattr(servicer, "serialized_infer_handler"):  # as GrpcFrontend serves ModelInfer (trees that have it)
        h2.add_registered_method_handlers("inference.GRPCInferenceService",
                                          {"ModelInfer": servicer.serialized_infer_handler()})
    conn, transport = H2Connection(h2), _CountingTransport()
    conn.connection_made(transport)
    # as load.py's client does: windows large enough that answers never wait for WINDOW_UPDATE
    conn.data_received(w.PREFACE + w.settings_frame({w.S_INITIAL_WINDOW_SIZE: w.MAX_WINDOW})
                       + w.window_update(0, w.MAX_WINDOW - w.DEFAULT_WINDOW))
    block = h2grpc.request_header_block("127.0.0.1:8001", INFER)
    body = h2grpc.grpc_message(load.grpc_request_bytes(workload))
    sids = iter(range(1, 2**31, 2))
    turns = 3 if awaits else 1

    def calls(n: int) -> list[bytes]:
        return [w.frame(w.HEADERS, w.END_HEADERS, sid, block) + h2grpc.data_frames(sid, body)
                for sid in (next(sids) for _ in range(n))]

    async def run(frames: list[bytes]) -> None:
        for data in frames:
            conn.data_received(data)
            for _ in range(turns):
                await asyncio.sleep(0)

    await run(calls(WARMUP))
    samples = []
    for _ in range(ROUNDS):
        frames = calls(CALLS)
        writes = transport.writes
        start = time.process_time()
        await run(frames)
        samples.append((time.process_time() - start) / CALLS * 1e6)
        per_call_writes = (transport.writes - writes) / CALLS
    await asyncio.sleep(0.01)
    if conn.streams:
        raise SystemExit(f"{len(conn.streams)} calls still open: the answers did not all go out")
    return min(samples), statistics.median(samples), per_call_writes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("add_sub", "mlp"), default="add_sub")
    parser.add_argument("--awaits", action="store_true", help="the answer comes one event-loop turn later")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) > 1:
        os.sched_setaffinity(0, {0})
    best, median, writes = asyncio.run(measure(args.model, args.awaits))
    print(f"{args.model}{' (awaits)' if args.awaits else ''}: {best:.1f} us CPU per call "
          f"(median {median:.1f}), {writes:.2f} writes per call")


if __name__ == "__main__":
    main()
