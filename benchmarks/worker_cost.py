"""A frontend worker's CPU per HTTP JSON infer request, without wrk: its app and its channel to a core.

    .venv/bin/python benchmarks/worker_cost.py [-c 8] [--requests 20000]

This process plays an HTTP worker: http_path_cost.py's closed-loop clients (Naiad HTTP connections
fed wrk's add_sub JSON body, no sockets) drive the worker's own app (frontends/workers/worker_app.py),
which hands each request over the channel (a real unix socket pair) to a child process standing in
for the core: it answers every request at once with add_sub's response (two FP32[1,16] outputs).
Reported: this process's CPU per request, HTTP parsing and the JSON codec included; the core's side
of the channel is channel_cost.py's. Pin it (`taskset -c 0`) and compare two checkouts by running it
with each one's `src/` first on PYTHONPATH, alternately.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from http_path_cost import ClosedLoopClients

from naiad.config.server_config import ServerConfig
from naiad.frontends.workers import wire
from naiad.frontends.workers.channel import Channel
from naiad.frontends.workers.codec import wire_response
from naiad.frontends.workers.core_client import CoreClient
from naiad.frontends.workers.worker_app import WorkerApp
from naiad.protocol.types import InferenceResponse, OutputTensor


def _add_sub_answer() -> tuple:
    ones = np.ones((1, 16), np.float32)
    wired, _ = wire_response(InferenceResponse("add_sub", "1", [OutputTensor("OUTPUT0", "FP32", (1, 16), ones + ones),
                                                                OutputTensor("OUTPUT1", "FP32", (1, 16), ones - ones)]))
    return wired


async def _core(sock: socket.socket) -> None:
    """The core's side: every infer request answered at once, until the worker closes the channel."""
    answer = _add_sub_answer()

    def on_message(message: tuple) -> None:
        if message[0] == wire.INFER:
            channel.send_plain((wire.RESULT, message[1], answer))  # as the Dispatcher sends a plain response

    channel = await Channel.open(sock, on_message)
    await channel.closed


async def _worker(sock: socket.socket, clients: int, requests: int) -> float:
    """CPU microseconds per request over `requests` answers, after as many for warm-up."""
    core = CoreClient()
    core.channel = await Channel.open(sock, core.on_message)
    loop = ClosedLoopClients(WorkerApp(ServerConfig(), core), "add_sub", clients, requests)  # type: ignore[arg-type]
    await loop.window()
    cpu = time.process_time()
    await loop.window()
    cpu = time.process_time() - cpu
    await loop.close()
    core.channel.close()
    return cpu / requests * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=20_000, help="measured (after as many for warm-up)")
    args = parser.parse_args(argv)
    import uvloop

    ours, theirs = socket.socketpair()
    child = os.fork()
    if child == 0:
        ours.close()
        uvloop.run(_core(theirs))
        os._exit(0)
    theirs.close()
    per_request = uvloop.run(_worker(ours, args.clients, args.requests))
    os.waitpid(child, 0)
    print(f"worker CPU per request (c={args.clients}): {per_request:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
