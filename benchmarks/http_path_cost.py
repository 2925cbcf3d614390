"""Server CPU per HTTP JSON infer request, whole path but the sockets: C closed-loop clients in-process.

    .venv/bin/python benchmarks/http_path_cost.py --models mlp add_sub_onnx --variants plain batched -c 8 32

Each client is one Naiad HTTP connection (naiad/frontends/http/connection.py) fed wrk's JSON request
body (wrk_load.json_body) by a transport that reads every answer (a 200 is required) and sends the
next request a loop turn later, as a socket read would arrive. Everything else is the server's own:
HTTP parsing, routing, the JSON codec, validation, scheduling and dynamic batching, the model
(one onnxruntime thread), the answer's head and body. What a served run (matrix_bench.py, wrk) adds
is the kernel's part: socket reads and writes, epoll.

Reported per cell: process CPU and event-loop thread CPU per request, and wall time per request.
Unlike a run under wrk, this does not depend on a load generator or on what else the host runs at
the time (pin it like the servers, `taskset -c 0`). To compare two checkouts, run it with each one's
`src/` first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import matrix_models
import wrk_load

from naiad.config.collector import freeze_startup_heap
from naiad.config.server_config import ServerConfig
from naiad.core.server import Server
from naiad.frontends.http.app import HttpApp
from naiad.frontends.http.connection import HttpConnection

RESULT_TAG = "HTTP_PATH_COST "
DEFAULT_HEADERS = [(b"date", b"Wed, 25 Nov 2026 20:00:00 GMT"), (b"server", b"naiad")]


class _ClosedLoopTransport(asyncio.Transport):
    """Takes the connection's answers; each complete 200 answer makes the client send its next request."""

    def __init__(self, loop: asyncio.AbstractEventLoop, request: bytes, answered: Any) -> None:
        super().__init__()
        self.loop = loop
        self.request = request
        self.answered = answered
        self.conn: HttpConnection | None = None
        self.stopped = False  # the client sends nothing more

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not bytes(data[:13]) == b"HTTP/1.1 200 ":
            raise RuntimeError(f"unexpected answer: {bytes(data[:300])!r}")
        self.answered()
        self.loop.call_soon(self._send_next)

    def _send_next(self) -> None:
        if not self.stopped:
            self.conn.data_received(self.request)  # type: ignore[union-attr]

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 0) if name in ("sockname", "peername") else default

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def http_request(model: str) -> bytes:
    body = wrk_load.json_body(model)
    head = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


class ClosedLoopClients:
    """`clients` closed-loop connections to `app`, each sending the model's request again when answered.

    `transport(loop, request, answered)` makes each connection's transport (a _ClosedLoopTransport).
    """

    def __init__(self, app: HttpApp, model: str, clients: int, requests: int, transport: Any = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.requests = requests
        config = types.SimpleNamespace(loaded=True, loaded_app=app, timeout_keep_alive=60, root_path="")
        state = types.SimpleNamespace(connections=set(), tasks=set(), default_headers=DEFAULT_HEADERS, total_requests=0)
        request = http_request(model)
        self.count = 0
        self.reached: asyncio.Future[None] = self.loop.create_future()
        make = transport or _ClosedLoopTransport
        self.connections, self.transports = [], []
        for _ in range(clients):
            conn = HttpConnection(config, state, {}, self.loop)
            transport_ = make(self.loop, request, self._answered)
            transport_.conn = conn
            conn.connection_made(transport_)
            self.connections.append(conn)
            self.transports.append(transport_)

    def _answered(self) -> None:
        self.count += 1
        if self.count == self.requests and not self.reached.done():
            self.reached.set_result(None)

    async def window(self) -> None:
        """Wait for the next `requests` answers (the first call sends every client's first request)."""
        if self.count == 0 and not self.reached.done():
            for transport in self.transports:
                transport._send_next()
        else:
            self.count, self.reached = 0, self.loop.create_future()
        await self.reached

    async def close(self) -> None:
        for transport in self.transports:
            transport.stopped = True
        await asyncio.sleep(0.05)  # the requests still in flight are answered
        for conn in self.connections:
            conn.connection_lost(None)


async def measure(app: HttpApp, model: str, clients: int, requests: int) -> dict[str, float]:
    """CPU and wall microseconds per request over `requests` answers (after as many for warm-up)."""
    clients_ = ClosedLoopClients(app, model, clients, requests)
    await clients_.window()  # warm-up
    cpu, thread, wall = time.process_time(), time.thread_time(), time.perf_counter()
    await clients_.window()
    cpu, thread, wall = time.process_time() - cpu, time.thread_time() - thread, time.perf_counter() - wall
    await clients_.close()
    return {"cpu_us": cpu / requests * 1e6, "loop_cpu_us": thread / requests * 1e6, "wall_us": wall / requests * 1e6}


async def run(repo: Path, cells: list[tuple[str, int]], requests: int) -> list[dict[str, Any]]:
    server = Server(ServerConfig(model_repositories=[str(repo)]))
    await server.startup()
    try:
        app = HttpApp(server)
        freeze_startup_heap()
        results = []
        for model, clients in cells:
            figures = await measure(app, model, clients, requests)
            results.append({"model": model, "clients": clients, "requests": requests, **figures})
            print(RESULT_TAG + json.dumps(results[-1]), flush=True)
        return results
    finally:
        await server.shutdown(timeout=5)


def cell_arguments(description: str, requests: int) -> argparse.ArgumentParser:
    """The options that choose the cells (models, variants, clients) and the requests measured in each."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--models", nargs="+", default=["mlp", "add_sub_onnx"], choices=["mlp", "add_sub", "add_sub_onnx", "xgboost"])
    parser.add_argument("--variants", nargs="+", default=list(matrix_models.VARIANTS), choices=matrix_models.VARIANTS)
    parser.add_argument("-c", "--clients", nargs="+", type=int, default=[8, 32])
    parser.add_argument("--requests", type=int, default=requests, help="measured per cell (after as many for warm-up)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = cell_arguments(__doc__.split("\n\n")[0], 20_000)
    args = parser.parse_args(argv)
    import uvloop

    with tempfile.TemporaryDirectory(prefix="http-path-cost-") as tmp:
        matrix = matrix_models.build(Path(tmp), args.models, args.variants)
        cells = [(matrix_models.served_name(m, v), c) for m in args.models for v in args.variants for c in args.clients]
        results = uvloop.run(run(matrix.naiad_repo, cells, args.requests))
    print(f"\n{'model':24s} {'c':>3s} {'CPU us/req':>11s} {'loop thread':>12s} {'wall us/req':>12s}")
    for r in results:
        print(f"{r['model']:24s} {r['clients']:3d} {r['cpu_us']:11.1f} {r['loop_cpu_us']:12.1f} {r['wall_us']:12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
