"""Cost of one Python-model execution through its worker process, without HTTP, gRPC or the scheduler.

    .venv/bin/python benchmarks/python_ipc_cost.py                       # this tree, c=1 and c=8
    .venv/bin/python benchmarks/python_ipc_cost.py --src OTHER/src --src src --rounds 3 --pin 0

Drives one ProcessInstance of the add_sub FP32[16] Python model directly (execute_requests, as the
default scheduler calls it: one batch at a time, `--concurrency` requests waiting) for `--seconds`
per measurement, and reports per request: wall time (mean and p50), CPU and context switches of the
server process and of the worker process (all threads, from /proc/<pid>/task/*/schedstat and status;
the server's figure includes this driver's queue and futures, the same for every tree), and, for
batches of one request, where the time goes (medians): server to worker (encode, send, worker
wake-up), in the worker (decode into pb_utils objects + execute), and back (encode outputs, send,
server wake-up, decode).

With several `--src` trees (e.g. a checkout of another revision), each measurement runs in a fresh
process importing that tree, and the trees take turns round after round, so that a noisy machine
affects them alike; the summary gives each tree's median over the rounds and its ratio to the first.
`--pin CORE` runs the server and its worker on one core, as the benchmark matrix does; `--batch N`
hands the instance batches of up to N waiting requests (a dynamic batcher's); `--dynamic` gives the
model a dynamic_batching block (its instance then holds one batch at a time, not a pipeline);
`--server` goes through Server.infer_async instead (scheduler, statistics and responses included).
`--uvloop` runs on uvloop, as `naiad serve` does (default: asyncio's own loop).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from python_backend_bench import ADD_SUB_CONFIG, ADD_SUB_PY  # noqa: E402


def _cpu_ns(pid: int) -> int:
    """CPU time of every thread of a process so far, in ns (scheduler accounting, not clock ticks)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def _switches(pid: int) -> int:
    """Context switches (voluntary and not) of every thread of a process so far."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as status:
                total += sum(int(line.split()[1]) for line in status if "ctxt_switches:" in line)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def _usage(pids: tuple[int, int]) -> tuple[int, ...]:
    """CPU ns and context switches of the server and the worker."""
    return (_cpu_ns(pids[0]), _cpu_ns(pids[1]), _switches(pids[0]), _switches(pids[1]))


def _per_request(before: tuple[int, ...], after: tuple[int, ...], count: int) -> dict[str, float]:
    used = [b - a for a, b in zip(before, after)]
    return {"server_cpu_us": used[0] / count / 1e3, "worker_cpu_us": used[1] / count / 1e3,
            "server_switches": used[2] / count, "worker_switches": used[3] / count}


async def _measure(repo: Path, concurrency: int, seconds: float, batch: int = 1) -> dict[str, float]:
    from tritonclient.grpc import model_config_pb2 as mc

    from naiad.backends.base import BackendRequest, InstanceSpec, ModelSource
    from naiad.config.model_config import load_config_file
    from naiad.runtime.memory import keep_freed_buffers
    from naiad.runtime.process.instance import start_process_instance

    keep_freed_buffers()  # as `naiad serve` does

    model_dir = repo / "add_sub"
    config = load_config_file(model_dir / "config.pbtxt")
    config.name = "add_sub"
    source = ModelSource(config, 1, model_dir, model_dir / "1", model_dir / "1" / "model.py", {})
    group = mc.ModelInstanceGroup(name="add_sub", kind=mc.ModelInstanceGroup.KIND_CPU, count=1)
    instance = await start_process_instance(source, InstanceSpec("add_sub_0", group, group.kind, 0))
    loop = asyncio.get_running_loop()
    inputs = {"INPUT0": np.ones((1, 16), np.float32), "INPUT1": np.full((1, 16), 2, np.float32)}
    queue: asyncio.Queue = asyncio.Queue()
    latencies: list[int] = []
    phases: list[tuple[int, int, int]] = []

    async def scheduler() -> None:
        """Batches handed to the instance one at a time, as a scheduler does: of one request, or with
        `batch` > 1 of up to that many of the requests waiting (as a dynamic batcher forms them)."""
        while True:
            items = [await queue.get()]
            while len(items) < batch and not queue.empty():
                items.append(queue.get_nowait())
            submitted = time.perf_counter_ns()
            futures = [future for _, future in items]

            def respond(index: int, response, futures=futures, submitted=submitted) -> None:
                future = futures[index]
                if response.error is not None:
                    future.set_exception(RuntimeError(response.error.message))
                    return
                answered = time.perf_counter_ns()
                if response.execution_ns is not None and len(futures) == 1:
                    start, end = response.execution_ns
                    phases.append((start - submitted, end - start, answered - end))
                future.set_result(response.outputs)

            await instance.execute_requests([request for request, _ in items], respond)

    async def client(stop_at: float, record: bool) -> None:
        while time.perf_counter() < stop_at:
            future = loop.create_future()
            started = time.perf_counter_ns()
            queue.put_nowait((BackendRequest(dict(inputs), ["OUTPUT0", "OUTPUT1"]), future))
            outputs = await future
            if record:
                latencies.append(time.perf_counter_ns() - started)
        assert float(outputs["OUTPUT0"][0, 0]) == 3.0

    runner = loop.create_task(scheduler())
    await asyncio.gather(*(client(time.perf_counter() + 0.5, False) for _ in range(concurrency)))  # warm-up
    phases.clear()
    pids = (os.getpid(), instance.pid)
    before = _usage(pids)
    started = time.perf_counter()
    await asyncio.gather(*(client(started + seconds, True) for _ in range(concurrency)))
    wall = time.perf_counter() - started
    after = _usage(pids)
    runner.cancel()
    await instance.aclose()
    count = len(latencies)
    result = {
        "requests_per_s": count / wall,
        "wall_us": wall / count * 1e6 * concurrency,
        "p50_us": statistics.median(latencies) / 1e3,
        **_per_request(before, after, count),
    }
    if phases:
        for i, name in enumerate(("to_worker_us", "in_worker_us", "back_us")):
            result[name] = statistics.median(p[i] for p in phases) / 1e3
    return result


async def _measure_server(repo: Path, concurrency: int, seconds: float) -> dict[str, float]:
    """The same through the whole server (Server.infer_async: scheduler, statistics, responses)."""
    from naiad import Server
    from naiad.protocol.types import InferenceRequest, InferInput
    from naiad.runtime.memory import keep_freed_buffers

    keep_freed_buffers()
    server = Server(model_repository=str(repo))
    await server.startup()
    pid = server.models.lookup("add_sub").pool.instances[0].pid
    inputs = [InferInput("INPUT0", "FP32", (1, 16), np.ones((1, 16), np.float32)),
              InferInput("INPUT1", "FP32", (1, 16), np.full((1, 16), 2, np.float32))]
    latencies: list[int] = []

    async def client(stop_at: float, record: bool) -> None:
        while time.perf_counter() < stop_at:
            started = time.perf_counter_ns()
            response = await server.infer_async(InferenceRequest("add_sub", list(inputs)))
            if record:
                latencies.append(time.perf_counter_ns() - started)
        assert float(response.outputs[0].data[0, 0]) == 3.0

    await asyncio.gather(*(client(time.perf_counter() + 0.5, False) for _ in range(concurrency)))  # warm-up
    pids = (os.getpid(), pid)
    before = _usage(pids)
    started = time.perf_counter()
    await asyncio.gather(*(client(started + seconds, True) for _ in range(concurrency)))
    wall = time.perf_counter() - started
    after = _usage(pids)
    await server.shutdown()
    count = len(latencies)
    return {
        "requests_per_s": count / wall,
        "wall_us": wall / count * 1e6 * concurrency,
        "p50_us": statistics.median(latencies) / 1e3,
        **_per_request(before, after, count),
    }


def _event_loop_runner(uvloop_: bool) -> Callable[[Coroutine[object, object, dict]], dict]:
    """asyncio.run, or uvloop.run: `naiad serve` runs on uvloop, so its figures compare with served runs."""
    if uvloop_:
        import uvloop

        return uvloop.run
    return asyncio.run


def _child(args: argparse.Namespace) -> int:
    if args.pin is not None:
        os.sched_setaffinity(0, {args.pin})  # the worker inherits it: both share one core, as in the matrix
    with tempfile.TemporaryDirectory(prefix="ipc-cost-") as tmp:
        repo = Path(tmp)
        (repo / "add_sub" / "1").mkdir(parents=True)
        # With a dynamic_batching block the instance is not pipelined: one batch at its worker at a time.
        config = ADD_SUB_CONFIG + ("dynamic_batching { }\n" if args.dynamic else "")
        (repo / "add_sub" / "config.pbtxt").write_text(config)
        (repo / "add_sub" / "1" / "model.py").write_text(ADD_SUB_PY)
        run = _event_loop_runner(args.uvloop)
        if args.server:
            result = run(_measure_server(repo, args.concurrency[0], args.seconds))
        else:
            result = run(_measure(repo, args.concurrency[0], args.seconds, args.batch))
    print(json.dumps(result))
    return 0


COLUMNS = ("requests_per_s", "wall_us", "p50_us", "server_cpu_us", "worker_cpu_us", "server_switches", "worker_switches",
           "to_worker_us", "in_worker_us", "back_us")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", action="append", help="a source tree to measure (repeatable; default: this one)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1, help="requests per batch at most (add_sub's max_batch_size is 8)")
    parser.add_argument("--dynamic", action="store_true", help="give the model a dynamic_batching block")
    parser.add_argument("--server", action="store_true", help="go through Server.infer_async (scheduler included)")
    parser.add_argument("--pin", type=int, help="run the server and its worker on this one core")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop, as `naiad serve` does (default: asyncio's loop)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args)
    trees = [str(Path(s).resolve()) for s in (args.src or [str(HERE.parent / "src")])]
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    for round_ in range(args.rounds):
        for concurrency in args.concurrency:
            for tree in trees:
                env = {**os.environ, "PYTHONPATH": tree}
                command = [sys.executable, __file__, "--child", "--seconds", str(args.seconds), "--concurrency", str(concurrency)]
                if args.pin is not None:
                    command += ["--pin", str(args.pin)]
                if args.server:
                    command.append("--server")
                command += ["--batch", str(args.batch)] + (["--dynamic"] if args.dynamic else [])
                command += ["--uvloop"] if args.uvloop else []
                out = subprocess.run(command, env=env, capture_output=True, text=True)
                if out.returncode != 0:
                    print(out.stderr, file=sys.stderr)
                    return 1
                row = json.loads(out.stdout.strip().splitlines()[-1])
                results.setdefault((tree, concurrency), []).append(row)
                print(f"round {round_ + 1} c={concurrency} {tree}: "
                      + " ".join(f"{k}={row[k]:.{2 if 'switches' in k else 1}f}" for k in COLUMNS if k in row), flush=True)
    print("\nmedian over rounds; ratio = tree / first tree")
    for concurrency in args.concurrency:
        base = None
        for tree in trees:
            rows = results[(tree, concurrency)]
            med = {k: statistics.median(r[k] for r in rows) for k in COLUMNS if k in rows[0]}
            base = base or med
            cells = " ".join(f"{k}={v:.{2 if 'switches' in k else 1}f}" + (f" ({v / base[k]:.2f}x)" if tree != trees[0] and base[k] else "")
                             for k, v in med.items())
            print(f"c={concurrency} {tree}: {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
