"""The core process's CPU per request behind the frontend workers' channel, without HTTP or wrk.

    .venv/bin/python benchmarks/channel_cost.py [REPO] [--uvloop]   (default: a copy of examples/models/add_sub)

A child process plays the workers: it keeps 32 decoded add_sub requests in flight on the channel
(closed loop); this process runs the Server and the core side (Dispatcher) and reports its own CPU
per request. Compare with `request_cost.py`'s `Server.infer_async` figure: the difference is what
the channel costs the core. Core and child are pinned to cores 0 and 1 when there are two.
`--uvloop` runs the core on uvloop, as `naiad serve` does (default: asyncio's own loop).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from naiad import Server
from naiad.frontends.workers import wire
from naiad.frontends.workers.channel import Channel
from naiad.frontends.workers.codec import wire_request
from naiad.frontends.workers.dispatcher import Dispatcher
from naiad.protocol.types import InferenceRequest, InferInput

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "models"
WARMUP, MEASURED, IN_FLIGHT = 2_000, 20_000, 32
ONES = np.ones((1, 16), np.float32)


def _pin(core: int) -> None:
    if len(os.sched_getaffinity(0)) > 1:
        os.sched_setaffinity(0, {core})


async def _feed(sock: socket.socket) -> None:
    """The workers' side: a new request for each answer, until WARMUP + MEASURED answers."""
    request, _ = wire_request(InferenceRequest("add_sub", [InferInput("INPUT0", "FP32", (1, 16), ONES),
                                                           InferInput("INPUT1", "FP32", (1, 16), ONES)]))
    ids = itertools.count(1)
    answered = 0
    finished = asyncio.get_running_loop().create_future()

    def on_answer(message: tuple) -> None:
        nonlocal answered
        answered += 1
        if answered >= WARMUP + MEASURED:
            if not finished.done():
                finished.set_result(None)
        else:
            channel.send_plain((wire.INFER, next(ids), request, ""))  # as CoreClient sends a plain request

    channel = await Channel.open(sock, on_answer)
    for _ in range(IN_FLIGHT):
        channel.send_plain((wire.INFER, next(ids), request, ""))  # as CoreClient sends a plain request
    await finished


async def _core(repo: Path) -> None:
    server = Server(model_repository=str(repo))
    await server.startup()
    ours, theirs = socket.socketpair()
    child = os.fork()
    if child == 0:
        ours.close()
        _pin(1)
        asyncio.run(_feed(theirs))
        os._exit(0)
    theirs.close()
    _pin(0)
    dispatcher = Dispatcher(server.inference, None, None)  # type: ignore[arg-type]  (no relays, no readiness here)
    seen = 0
    start = [0.0, 0.0]

    def on_message(message: tuple) -> None:
        nonlocal seen
        seen += 1
        if seen == WARMUP:
            start[:] = [time.process_time(), time.perf_counter()]
        dispatcher.on_message(message)

    dispatcher.channel = await Channel.open(ours, on_message)
    await dispatcher.channel.closed
    cpu, wall = time.process_time() - start[0], time.perf_counter() - start[1]
    os.waitpid(child, 0)
    print(f"core CPU per request over the channel: {cpu / MEASURED * 1e6:.1f} us ({MEASURED / wall:,.0f} requests/s)")
    await server.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repo", nargs="?", type=Path, help="model repository (default: a copy of examples/models/add_sub)")
    parser.add_argument("--uvloop", action="store_true", help="run the core on uvloop, as `naiad serve` does")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="channel-cost-") as tmp:
        repo = args.repo or Path(tmp)
        if args.repo is None:
            shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
        if args.uvloop:
            import uvloop

            uvloop.run(_core(repo))
        else:
            asyncio.run(_core(repo))
    return 0


if __name__ == "__main__":
    sys.exit(main())
