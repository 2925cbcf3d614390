"""Start and stop the servers the benchmarks compare: Naiad, real Triton 2.51, MLServer and KServe.

Every server is started in its own session (so stopping it stops its children: Python-backend
stubs, worker processes) under `taskset -c <core>`, waits until its models are ready, and is
described by a RunningServer. Each starter takes a repository already written by the caller.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
START_TIMEOUT = 120.0
TRITON_START_TIMEOUT = 240.0


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunningServer:
    name: str
    proc: subprocess.Popen
    http_port: int
    grpc_port: int
    log_path: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # our own session: the server and its children
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        try:  # children that outlived their parent (same process group)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def spawn(cmd: list[str], core: str, log_path: Path, cwd: Path, env: dict | None = None) -> subprocess.Popen:
    log_file = open(log_path, "wb")
    return subprocess.Popen(["taskset", "-c", core, *cmd], stdout=log_file, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, cwd=cwd, env=env, start_new_session=True)


def wait_until(check: Callable[[], object], what: str, proc: subprocess.Popen, log_path: Path,
               timeout: float = START_TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; log {log_path}:\n"
                               + log_path.read_text(errors="replace")[-3000:])
        result = check()
        if result:
            return result
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready after {timeout:.0f} s; log {log_path}")


def http_ready(port: int, models: list[str]) -> bool:
    for m in models:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{m}/ready", timeout=2) as r:
                if r.status != 200:
                    return False
        except OSError:
            return False
    return True


def grpc_ready(port: int) -> bool:
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            return stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=2).ready
    except grpc.RpcError:
        return False


def _stop_on_failure(server: RunningServer, wait: Callable[[], object]) -> RunningServer:
    try:
        wait()
    except BaseException:
        server.stop()
        raise
    return server


def start_naiad(work: Path, repo: Path, core: str, models: list[str], grpc_impl: str = "naiad",
                python: str = sys.executable, tag: str = "naiad", src: Path | None = None,
                extra: tuple[str, ...] = ()) -> RunningServer:
    """`python -m naiad serve` on `repo` with OS-chosen ports (read from its NAIAD_READY line);
    `src`: the `src/` folder of another checkout to run instead of the installed package; `extra` flags."""
    out_path, log_path = work / f"{tag}.stdout", work / f"{tag}.log"
    cmd = [os.path.abspath(python), "-m", "naiad", "serve", "--model-repository", str(repo), "--http-port", "0",
           "--grpc-port", "0", "--metrics-port", "0", "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
           "--metrics-address", "127.0.0.1", "--grpc-server-impl", grpc_impl, *extra]
    env = {**os.environ, "PYTHONPATH": str(src.resolve())} if src else None
    proc = subprocess.Popen(["taskset", "-c", core, *cmd], stdout=open(out_path, "wb"), stderr=open(log_path, "wb"),
                            stdin=subprocess.DEVNULL, cwd=work, start_new_session=True, env=env)
    holder = RunningServer(tag, proc, 0, 0, log_path)

    def ready():
        for line in out_path.read_text(errors="replace").splitlines():
            if line.startswith("NAIAD_READY "):
                return json.loads(line.split(" ", 1)[1])
        return None

    def wait() -> None:
        ports = wait_until(ready, tag, proc, log_path)
        holder.http_port, holder.grpc_port = ports["http_port"], ports["grpc_port"]
        wait_until(lambda: http_ready(holder.http_port, models), f"{tag} models", proc, log_path)

    return _stop_on_failure(holder, wait)


def start_triton(work: Path, repo: Path, core: str, models: list[str], venv: Path | None = None) -> RunningServer:
    """Real Triton 2.51 through start_triton.sh (TRITON_VENV: `venv` when given, else the environment's)."""
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    log_path = work / "triton.log"
    env = {**os.environ, "TRITON_VENV": str(venv)} if venv else None
    cmd = ["bash", str(HERE / "start_triton.sh"), str(repo), str(http_port), str(grpc_port), str(metrics_port)]
    proc = spawn(cmd, core, log_path, work, env)
    server = RunningServer("triton", proc, http_port, grpc_port, log_path)
    return _stop_on_failure(server, lambda: wait_until(
        lambda: http_ready(http_port, models) and grpc_ready(grpc_port), "triton", proc, log_path,
        TRITON_START_TIMEOUT))


def start_mlserver(work: Path, core: str, venvs: Path, models: dict[str, dict]) -> RunningServer:
    """`mlserver start` with debug off and inference in the server process (parallel_workers 0).

    `models` maps each model name to the rest of its model-settings.json (implementation, parameters,
    adaptive batching fields); implementations are looked up in benchmarks/peers/ first."""
    root = work / "mlserver_repo"
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    root.mkdir(parents=True, exist_ok=True)
    (root / "settings.json").write_text(json.dumps({
        "debug": False, "parallel_workers": 0, "host": "127.0.0.1", "http_port": http_port,
        "grpc_port": grpc_port, "metrics_port": metrics_port, "load_models_at_startup": True}))
    for name, settings in models.items():
        (root / name).mkdir(exist_ok=True)
        (root / name / "model-settings.json").write_text(json.dumps({"name": name, **settings}))
    env = {**os.environ, "PYTHONPATH": str(HERE / "peers")}
    log_path = work / "mlserver.log"
    proc = spawn([str(venvs / "mlserver" / "bin" / "mlserver"), "start", str(root)], core, log_path, root, env)
    server = RunningServer("mlserver", proc, http_port, grpc_port, log_path)
    return _stop_on_failure(server, lambda: wait_until(
        lambda: http_ready(http_port, list(models)) and grpc_ready(grpc_port), "mlserver", proc, log_path))


def start_kserve(work: Path, core: str, venvs: Path, models: dict[str, Path]) -> RunningServer:
    """peers/kserve_server.py serving each model file (by name) with latency logging off."""
    http_port, grpc_port = free_port(), free_port()
    cmd = [str(venvs / "kserve" / "bin" / "python"), str(HERE / "peers" / "kserve_server.py"),
           "--http_port", str(http_port), "--grpc_port", str(grpc_port),
           "--configure_logging", "false", "--enable_latency_logging", "false"]
    for name, path in models.items():
        cmd += ["--model", f"{name}={path}"]
    log_path = work / "kserve.log"
    proc = spawn(cmd, core, log_path, work)
    server = RunningServer("kserve", proc, http_port, grpc_port, log_path)
    return _stop_on_failure(server, lambda: wait_until(
        lambda: http_ready(http_port, list(models)) and grpc_ready(grpc_port), "kserve", proc, log_path))


def process_tree(pid: int) -> list[int]:
    """A process and all its descendants (those alive now)."""
    pids, found = [pid], []
    while pids:
        current = pids.pop()
        found.append(current)
        try:
            with open(f"/proc/{current}/task/{current}/children") as children:
                pids.extend(int(c) for c in children.read().split())
        except OSError:
            continue
    return found


def _proc_files(pid: int, name: str) -> list[str]:
    """The text of /proc/<p>/<name> for a process and each of its descendants still alive."""
    texts = []
    for current in process_tree(pid):
        try:
            with open(f"/proc/{current}/{name}") as handle:
                texts.append(handle.read())
        except OSError:
            continue
    return texts


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, every thread) used so far by one process, without its children."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) used so far by a process and all its descendants."""
    total = 0.0
    for stat in _proc_files(pid, "stat"):
        fields = stat.rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def tree_rss_mib(pid: int) -> float:
    """Resident memory (VmRSS) of a process and all its descendants in MiB; shared pages count in each."""
    total = 0
    for status in _proc_files(pid, "status"):
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total / 1024


def machine_line() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else ["?"]
    return (f"{datetime.date.today().isoformat()}, {os.cpu_count()} cores ({cpu}), Python "
            f"{platform.python_version()}, load average at start {' '.join(load)}")
