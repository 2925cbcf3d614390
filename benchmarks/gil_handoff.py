"""Does an instance thread wait for the GIL (CPython's switch interval) before the event loop gets its result?

    taskset -c 0 .venv/bin/python benchmarks/gil_handoff.py --models mlp add_sub_onnx -c 8 32 --rounds 3
    taskset -c 0 .venv/bin/python benchmarks/gil_handoff.py --never-inline -c 8 32 64 --rounds 2

The question: ONNX Runtime releases the GIL while it computes; when it returns, the instance thread
must take the GIL back, and a loop thread that never lets go of it is only asked to after
`sys.getswitchinterval()` (5 ms by default): would that put up to 5 ms into executions, and would a
lower interval cut the tail? This runs the real server in-process, driven by the closed-loop HTTP
JSON clients of http_path_cost.py, with the switch intervals interleaved round after round (a noisy
host affects them alike), and records for every execution on an instance thread:

- start: from the loop handing the batch over to the instance thread running Python (GIL taken);
- off-CPU: the thread's wall time in the execution minus its CPU time, split with the thread's
  Linux schedstat into run-queue wait (runnable, the OS gave the core to another thread) and asleep
  (neither running nor runnable: with one ONNX Runtime thread, waiting for the GIL);
- hand-back: from the thread holding the result to the loop resuming the awaiting task;

and per request the wall time from send to answer, process CPU, and the loop thread's run-queue wait.

Found (2-core shared host, pinned to one core; benchmarks/results/2026-11-25-gil-handoff*.json):
of 159,458 thread executions, 2 were asleep over 100 us (the longest 283 us), at every interval
from 5 ms to 0.25 ms. uvloop runs libuv without the GIL and takes it per callback batch, so a
waiting thread gets it within one loop turn, not one switch interval. Against 5 ms, the medians of
interleaved p99, p50, CPU per request and throughput at 1, 0.5 and 0.25 ms are 0.93-1.17x, with
quartiles 0.66-1.46x: noise, no trend. What orders the p99 of the cells is the loop thread's own run-queue wait
(the share of the time the OS ran something else on the core).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import http_path_cost
import matrix_models

from naiad.backends.base import ExecutionBatch
from naiad.config.collector import freeze_startup_heap
from naiad.config.server_config import ServerConfig
from naiad.core.server import Server
from naiad.frontends.http.app import HttpApp
from naiad.runtime.thread_instance import ThreadInstance

RESULT_TAG = "GIL_HANDOFF "
INTERVALS_US = (5000, 1000, 500, 250)
NEVER_INLINE = '\nparameters { key: "inline_threshold_us" value { string_value: "0" } }\n'


def run_delay_ns() -> int:
    """This thread's time runnable but not running since it started (Linux schedstat): the OS's share
    of a wait. Time waiting for the GIL is time asleep, not runnable: not in it."""
    with open("/proc/thread-self/schedstat", "rb") as f:
        return int(f.read().split()[1])


class Probe:
    """Per-execution timings of every ThreadInstance, taken by wrapping its two methods."""

    def __init__(self) -> None:
        # (rows, start ns, wall ns, thread CPU ns, run-queue wait ns, hand-back ns)
        self.executions: list[tuple[int, ...]] = []
        self._pending: dict[int, tuple[int, ...]] = {}

    def install(self) -> None:
        probe = self

        def timed(inst: ThreadInstance, batch: ExecutionBatch, submitted: int) -> dict[str, np.ndarray]:
            started = time.perf_counter_ns()
            delay = run_delay_ns()
            wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
            try:
                return inst.instance.execute(batch)
            finally:
                cpu_end = time.thread_time_ns()
                done = time.perf_counter_ns()
                delay = run_delay_ns() - delay
                inst.last_thread_ns = cpu_end - cpu
                probe._pending[id(inst)] = (batch.batch_size, started - submitted, done - wall, cpu_end - cpu, delay, done)

        async def execute(inst: ThreadInstance, batch: ExecutionBatch) -> dict[str, np.ndarray]:
            outputs = await asyncio.wrap_future(inst._executor.submit(timed, inst, batch, time.perf_counter_ns()))
            seen = time.perf_counter_ns()
            rows, start, wall, cpu, delay, done = probe._pending.pop(id(inst))
            probe.executions.append((rows, start, wall, cpu, delay, seen - done))
            return outputs

        ThreadInstance.execute = execute  # type: ignore[method-assign]


class _TimedTransport(http_path_cost._ClosedLoopTransport):
    """The closed-loop client, also timing each request from its send to its answer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, request: bytes, answered: Any, latencies: list[int]) -> None:
        super().__init__(loop, request, answered)
        self.latencies = latencies
        self.sent = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.latencies.append(time.perf_counter_ns() - self.sent)
        super().write(data)

    def _send_next(self) -> None:
        self.sent = time.perf_counter_ns()
        super()._send_next()


async def measure(app: HttpApp, probe: Probe, model: str, clients: int, requests: int) -> dict[str, Any]:
    latencies: list[int] = []
    clients_ = http_path_cost.ClosedLoopClients(
        app, model, clients, requests,
        lambda loop, request, answered: _TimedTransport(loop, request, answered, latencies))
    await clients_.window()  # warm-up
    latencies.clear()
    probe.executions.clear()
    cpu, wall, delay = time.process_time(), time.perf_counter(), run_delay_ns()
    await clients_.window()
    cpu, wall, delay = time.process_time() - cpu, time.perf_counter() - wall, run_delay_ns() - delay
    executions = list(probe.executions)
    measured = latencies[:requests]
    await clients_.close()
    return {"cpu_us": cpu / requests * 1e6, "rate": requests / wall, "loop_run_delay_ms": delay / 1e6,
            "wall_ms": wall * 1e3, **_summary(measured, executions)}


def _pct(values: list[int] | np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) / 1e3 if len(values) else float("nan")


def _summary(latencies: list[int], executions: list[tuple[int, ...]]) -> dict[str, Any]:
    table = np.array(executions, dtype=np.int64).reshape(-1, 6)
    rows, start, ex = table[:, 0], table[:, 1], table[:, 1:]  # ex: start, wall, CPU, run-queue wait, hand-back
    off_cpu = ex[:, 1] - ex[:, 2]
    asleep = np.maximum(off_cpu - ex[:, 3], 0)  # neither running nor runnable: waiting for the GIL
    return {"p50_us": _pct(latencies, 50), "p99_us": _pct(latencies, 99), "p999_us": _pct(latencies, 99.9),
            "thread_executions": len(ex), "mean_rows": float(rows.mean()) if len(ex) else 0.0,
            "start_p50_us": _pct(start, 50), "start_p99_us": _pct(start, 99),
            "exec_cpu_p50_us": _pct(ex[:, 2], 50), "exec_wall_p50_us": _pct(ex[:, 1], 50),
            "exec_wall_p99_us": _pct(ex[:, 1], 99),
            "off_cpu_p50_us": _pct(off_cpu, 50), "off_cpu_p99_us": _pct(off_cpu, 99),
            "off_cpu_max_us": float(off_cpu.max()) / 1e3 if len(ex) else float("nan"),
            "asleep_p50_us": _pct(asleep, 50), "asleep_p99_us": _pct(asleep, 99),
            "asleep_max_us": float(asleep.max()) / 1e3 if len(ex) else float("nan"),
            "asleep_over_100us": int((asleep > 100_000).sum()),
            "handback_p50_us": _pct(ex[:, 4], 50), "handback_p99_us": _pct(ex[:, 4], 99)}


async def run(repo: Path, cells: list[tuple[str, int]], intervals: list[int], rounds: int,
              requests: int) -> list[dict[str, Any]]:
    probe = Probe()
    probe.install()
    server = Server(ServerConfig(model_repositories=[str(repo)]))
    await server.startup()
    default = sys.getswitchinterval()
    try:
        app = HttpApp(server)
        freeze_startup_heap()
        results = []
        for round_ in range(rounds):
            for model, clients in cells:
                order = intervals[round_ % len(intervals):] + intervals[:round_ % len(intervals)]
                for interval in order:
                    sys.setswitchinterval(interval / 1e6)
                    figures = await measure(app, probe, model, clients, requests)
                    results.append({"round": round_, "model": model, "clients": clients, "switch_us": interval,
                                    **figures})
                    print(RESULT_TAG + json.dumps(results[-1]), flush=True)
        return results
    finally:
        sys.setswitchinterval(default)
        await server.shutdown(timeout=5)


def main(argv: list[str] | None = None) -> int:
    parser = http_path_cost.cell_arguments(__doc__.split("\n\n")[0], 5_000)
    parser.add_argument("--intervals-us", nargs="+", type=int, default=list(INTERVALS_US))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--never-inline", action="store_true",
                        help="every execution on the instance thread (inline_threshold_us 0), never on the loop")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args(argv)
    import uvloop

    with tempfile.TemporaryDirectory(prefix="gil-handoff-") as tmp:
        matrix = matrix_models.build(Path(tmp), args.models, args.variants)
        if args.never_inline:
            for config in matrix.naiad_repo.glob("*/config.pbtxt"):
                config.write_text(config.read_text() + NEVER_INLINE)
        cells = [(matrix_models.served_name(m, v), c) for m in args.models for v in args.variants for c in args.clients]
        results = uvloop.run(run(matrix.naiad_repo, cells, args.intervals_us, args.rounds, args.requests))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    keys = ("cpu_us", "rate", "p50_us", "p99_us", "p999_us", "thread_executions", "mean_rows", "exec_cpu_p50_us",
            "start_p50_us", "start_p99_us", "off_cpu_p50_us", "off_cpu_p99_us", "asleep_p99_us", "asleep_max_us", "asleep_over_100us",
            "handback_p50_us", "handback_p99_us", "loop_run_delay_ms", "wall_ms")
    print(f"\nmedians over rounds\n{'model':24s} {'c':>3s} {'sw us':>6s} " + " ".join(f"{k[:12]:>12s}" for k in keys))
    for model, clients in cells:
        for interval in args.intervals_us:
            rows = [r for r in results if (r["model"], r["clients"], r["switch_us"]) == (model, clients, interval)]
            print(f"{model:24s} {clients:3d} {interval:6d} "
                  + " ".join(f"{float(np.nanmedian([r[k] for r in rows])):12.1f}" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
