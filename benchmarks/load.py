"""Closed-loop load generator for KServe v2 inference servers (HTTP JSON, HTTP binary, gRPC).

    python benchmarks/load.py --url 127.0.0.1:8000 --protocol http-json --model add_sub -c 8
    python benchmarks/load.py --url 127.0.0.1:8001 --protocol grpc --model mlp_classifier -c 32 --json

Each of the N concurrent clients sends its next request as soon as the previous answer is
complete (closed loop). A run is bounded by --requests (total) and --duration (measured
seconds, after --warmup seconds whose requests are not measured), and aborted after a hard
timeout, so it always ends. Only loopback addresses are accepted.

To keep the generator itself off the critical path:
- HTTP uses raw asyncio protocols (uvloop when installed) over persistent HTTP/1.1
  connections, one per client; the request bytes are built once, responses are framed by
  Content-Length (or chunked) without being decoded.
- gRPC uses grpc.aio with pre-serialized ModelInferRequest bytes and undecoded responses.
- --procs P splits the clients over P processes.
Before timing, one request is sent and its response fully decoded and checked (values against
numpy, or against onnxruntime with --reference-model), so a server answering garbage fails.
`benchmarks/trivial_server.py` gives the generator's own ceiling (see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import multiprocessing as mp
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

PROTOCOLS = ("http-json", "http-binary", "grpc")
NUMPY_OF = {"FP32": np.float32, "FP64": np.float64, "INT32": np.int32, "INT64": np.int64,
            "FP16": np.float16, "UINT8": np.uint8, "INT8": np.int8, "BOOL": np.bool_}
MAX_RECONNECTS = 100
TREE_FEATURES = 32  # xgboost*: a binary classifier on 32 FP32 features (input__0 -> output__0)


# ---------------------------------------------------------------- workloads

@dataclass
class Workload:
    model: str
    inputs: list[tuple[str, str, np.ndarray]]  # (name, datatype, array incl. batch dim)
    outputs: list[str]
    check: Callable[[dict[str, np.ndarray]], None]


def _check_add_sub(a: np.ndarray, b: np.ndarray) -> Callable[[dict[str, np.ndarray]], None]:
    def check(out: dict[str, np.ndarray]) -> None:
        np.testing.assert_allclose(out["OUTPUT0"].reshape(a.shape), a + b, rtol=1e-6)
        np.testing.assert_allclose(out["OUTPUT1"].reshape(a.shape), a - b, rtol=1e-6)
    return check


def _check_probabilities(out: dict[str, np.ndarray]) -> None:
    p = out["PROBABILITIES"]
    assert p.shape == (1, 10), f"PROBABILITIES shape {p.shape}, expected (1, 10)"
    assert np.all(p >= 0) and abs(float(p.sum()) - 1.0) < 1e-4, f"not a distribution: {p}"


def _check_probability(out: dict[str, np.ndarray]) -> None:
    p = out["output__0"]
    assert p.size == 1 and 0.0 <= float(p.ravel()[0]) <= 1.0, f"output__0 {p} is not one probability"


def make_workload(model: str, seed: int = 0) -> Workload:
    """The request used for a model of the example repository (batch 1)."""
    rng = np.random.default_rng(seed)
    if model.startswith("add_sub"):
        a = rng.standard_normal((1, 16)).astype(np.float32)
        b = rng.standard_normal((1, 16)).astype(np.float32)
        return Workload(model, [("INPUT0", "FP32", a), ("INPUT1", "FP32", b)],
                        ["OUTPUT0", "OUTPUT1"], _check_add_sub(a, b))
    if model.startswith("mlp"):
        x = rng.standard_normal((1, 256)).astype(np.float32)
        return Workload(model, [("INPUT", "FP32", x)], ["PROBABILITIES"], _check_probabilities)
    if model.startswith("xgboost"):
        x = rng.standard_normal((1, TREE_FEATURES)).astype(np.float32)
        return Workload(model, [("input__0", "FP32", x)], ["output__0"], _check_probability)
    raise SystemExit(f"load.py: no workload defined for model {model!r} (known: add_sub*, mlp*, xgboost*)")


def with_reference(workload: Workload, onnx_path: str) -> Workload:
    """Replace the workload's check by a comparison with onnxruntime run in this process."""
    import onnxruntime as ort

    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    expected = dict(zip(workload.outputs, session.run(
        workload.outputs, {name: arr for name, _, arr in workload.inputs})))
    basic = workload.check

    def check(out: dict[str, np.ndarray]) -> None:
        basic(out)
        for name, ref in expected.items():
            np.testing.assert_allclose(out[name].reshape(ref.shape), ref, rtol=1e-4, atol=1e-6)
    return Workload(workload.model, workload.inputs, workload.outputs, check)


# ---------------------------------------------------------------- request encoding

def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def http_request_bytes(workload: Workload, host: str, port: int, binary: bool) -> bytes:
    """One complete HTTP/1.1 request (headers + body) for the v2 infer endpoint."""
    if binary:
        inputs = [{"name": n, "shape": list(a.shape), "datatype": d,
                   "parameters": {"binary_data_size": a.nbytes}} for n, d, a in workload.inputs]
        outputs = [{"name": n, "parameters": {"binary_data": True}} for n in workload.outputs]
        header = _dumps({"inputs": inputs, "outputs": outputs})
        body = header + b"".join(np.ascontiguousarray(a).tobytes() for _, _, a in workload.inputs)
        extra = (f"Content-Type: application/octet-stream\r\n"
                 f"Inference-Header-Content-Length: {len(header)}\r\n")
    else:
        inputs = [{"name": n, "shape": list(a.shape), "datatype": d, "data": a.ravel().tolist()}
                  for n, d, a in workload.inputs]
        body = _dumps({"inputs": inputs})
        extra = "Content-Type: application/json\r\n"
    head = (f"POST /v2/models/{workload.model}/infer HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"{extra}Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


def decode_http_response(headers: dict[str, str], body: bytes) -> dict[str, np.ndarray]:
    json_len = int(headers.get("inference-header-content-length", len(body)))
    doc = json.loads(body[:json_len])
    out, offset = {}, json_len
    for o in doc["outputs"]:
        dtype = NUMPY_OF[o["datatype"]]
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            arr = np.frombuffer(body[offset:offset + size], dtype=dtype)
            offset += size
        else:
            arr = np.asarray(o["data"], dtype=dtype)
        out[o["name"]] = arr.reshape(o["shape"])
    return out


def grpc_request_bytes(workload: Workload) -> bytes:
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name=workload.model)
    for name, datatype, arr in workload.inputs:
        tensor = req.inputs.add()
        tensor.name, tensor.datatype = name, datatype
        tensor.shape.extend(arr.shape)
        req.raw_input_contents.append(np.ascontiguousarray(arr).tobytes())
    for name in workload.outputs:
        req.outputs.add().name = name
    return req.SerializeToString()


def decode_grpc_response(raw: bytes) -> dict[str, np.ndarray]:
    from tritonclient.grpc import service_pb2

    resp = service_pb2.ModelInferResponse.FromString(raw)
    out = {}
    for i, o in enumerate(resp.outputs):
        dtype = NUMPY_OF[o.datatype]
        if i < len(resp.raw_output_contents):
            arr = np.frombuffer(resp.raw_output_contents[i], dtype=dtype)
        else:  # typed contents (fp32_contents, int_contents, ...)
            field_name = {"FP32": "fp32_contents", "FP64": "fp64_contents", "INT32": "int_contents",
                          "INT64": "int64_contents", "BOOL": "bool_contents"}[o.datatype]
            arr = np.asarray(getattr(o.contents, field_name), dtype=dtype)
        out[o.name] = arr.reshape(tuple(o.shape))
    return out


GRPC_INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"


# ---------------------------------------------------------------- one checked request

def _http_roundtrip(host: str, port: int, request: bytes, timeout: float) -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(request)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed before the response headers")
            buf += chunk
        head, body = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while not body.endswith(b"0\r\n\r\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                body += chunk
            body = _dechunk(body)
        else:
            length = int(headers.get("content-length", "0"))
            while len(body) < length:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError("connection closed before the end of the body")
                body += chunk
        return status, headers, body


def _dechunk(data: bytes) -> bytes:
    out, pos = [], 0
    while True:
        end = data.index(b"\r\n", pos)
        size = int(data[pos:end].split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(data[end + 2:end + 2 + size])
        pos = end + 2 + size + 2


def check_once(protocol: str, host: str, port: int, workload: Workload, timeout: float = 30.0) -> None:
    """Send the benchmark request once, decode the answer fully, and check its values."""
    if protocol == "grpc":
        import grpc

        with grpc.insecure_channel(f"{host}:{port}") as channel:
            call = channel.unary_unary(GRPC_INFER_METHOD)
            outputs = decode_grpc_response(call(grpc_request_bytes(workload), timeout=timeout))
    else:
        request = http_request_bytes(workload, host, port, binary=protocol == "http-binary")
        status, headers, body = _http_roundtrip(host, port, request, timeout)
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {body[:300]!r}")
        outputs = decode_http_response(headers, body)
    missing = [n for n in workload.outputs if n not in outputs]
    if missing:
        raise RuntimeError(f"response lacks outputs {missing}; got {sorted(outputs)}")
    workload.check(outputs)


# ---------------------------------------------------------------- the load loop

@dataclass
class Budget:
    """Shared by the clients of one process: stop issuing at the deadline or when the count is used."""
    remaining: int
    deadline: float  # perf_counter seconds

    def take(self) -> bool:
        if self.remaining <= 0 or time.perf_counter() >= self.deadline:
            return False
        self.remaining -= 1
        return True


@dataclass
class Samples:
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""

    def error(self, text: str) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = text[:300]


class _HttpClient(asyncio.Protocol):
    """One persistent connection that sends the same request again as each response completes."""

    def __init__(self, request: bytes, budget: Budget, samples: Samples, done: asyncio.Future) -> None:
        self.request, self.budget, self.samples, self.done = request, budget, samples, done
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.need = -1          # body bytes still expected; -1 = reading headers
        self.chunked = False
        self.status = 0
        self.close_after = False
        self.sent_at = 0
        self.in_flight = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._send_next()

    def _send_next(self) -> None:
        if not self.budget.take():
            self.in_flight = False
            self.transport.close()
            if not self.done.done():
                self.done.set_result(None)
            return
        self.in_flight = True
        self.sent_at = time.perf_counter_ns()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            if self.need < 0:
                idx = self.buf.find(b"\r\n\r\n")
                if idx < 0:
                    return
                head = bytes(self.buf[:idx]).lower()
                del self.buf[:idx + 4]
                self.status = int(head[9:12])
                self.chunked = b"\r\ntransfer-encoding: chunked" in head
                self.close_after = b"\r\nconnection: close" in head
                if self.chunked:
                    self.need = 0
                else:
                    pos = head.find(b"\r\ncontent-length:")
                    if pos < 0:
                        self.need = 0
                    else:
                        end = head.find(b"\r\n", pos + 2)
                        self.need = int(head[pos + 17:end if end > 0 else len(head)])
            if self.chunked:
                if not self._consume_chunks():
                    return
            else:
                if len(self.buf) < self.need:
                    return
                del self.buf[:self.need]
            self._complete()
            if not self.in_flight:
                return

    def _consume_chunks(self) -> bool:
        while True:
            end = self.buf.find(b"\r\n")
            if end < 0:
                return False
            size = int(bytes(self.buf[:end]).split(b";")[0], 16)
            if size == 0:
                if len(self.buf) < end + 4:
                    return False
                del self.buf[:end + 4]
                return True
            if len(self.buf) < end + 2 + size + 2:
                return False
            del self.buf[:end + 2 + size + 2]

    def _complete(self) -> None:
        now = time.perf_counter_ns()
        self.need = -1
        if self.status == 200:
            self.samples.starts.append(self.sent_at)
            self.samples.ends.append(now)
        else:
            self.samples.error(f"HTTP {self.status}")
        if self.close_after:
            self.in_flight = False
            self.transport.close()
            return
        self._send_next()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.in_flight:
            self.samples.error(f"connection lost: {exc}")
        if not self.done.done():
            # the caller reconnects if the budget is not used up
            self.done.set_result("reconnect" if self.in_flight or self.close_after else None)


async def _http_client_loop(host: str, port: int, request: bytes, budget: Budget, samples: Samples) -> None:
    loop = asyncio.get_running_loop()
    for _ in range(MAX_RECONNECTS):
        done = loop.create_future()
        await loop.create_connection(lambda done=done: _HttpClient(request, budget, samples, done), host, port)
        if await done is None or budget.remaining <= 0 or time.perf_counter() >= budget.deadline:
            return
    samples.error("too many reconnects")


async def _grpc_client_loop(call, request: bytes, budget: Budget, samples: Samples) -> None:
    import grpc

    while budget.take():
        start = time.perf_counter_ns()
        try:
            await call(request)
        except grpc.RpcError as exc:
            samples.error(f"gRPC {exc.code()}: {exc.details()}")
            continue
        samples.starts.append(start)
        samples.ends.append(time.perf_counter_ns())


async def _raw_grpc_clients(host: str, port: int, request: bytes, concurrency: int, budget: Budget,
                            samples: Samples, connections: int) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from h2grpc import H2GrpcClient

    def record(start: int, end: int, ok: bool, why: str) -> None:
        if ok:
            samples.starts.append(start)
            samples.ends.append(end)
        else:
            samples.error(why)

    loop = asyncio.get_running_loop()
    connections = max(1, min(connections, concurrency))
    slots = [concurrency // connections + (1 if i < concurrency % connections else 0) for i in range(connections)]
    waits = []
    for n in slots:
        done = loop.create_future()
        await loop.create_connection(
            lambda n=n, done=done: H2GrpcClient(f"{host}:{port}", GRPC_INFER_METHOD, request, n,
                                                budget.take, record, done), host, port)
        waits.append(done)
    await asyncio.gather(*waits)


async def _run_clients(protocol: str, host: str, port: int, workload: Workload, concurrency: int,
                       budget: Budget, samples: Samples, hard_timeout: float, channels: int,
                       grpc_client: str = "raw") -> None:
    if protocol == "grpc" and grpc_client == "raw":
        request = grpc_request_bytes(workload)
        await asyncio.wait_for(_raw_grpc_clients(host, port, request, concurrency, budget, samples, channels),
                               hard_timeout)
    elif protocol == "grpc":
        import grpc

        request = grpc_request_bytes(workload)
        opts = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        chans = [grpc.aio.insecure_channel(f"{host}:{port}", options=opts + [("grpc.channel_id", i)])
                 for i in range(max(1, channels))]
        calls = [c.unary_unary(GRPC_INFER_METHOD) for c in chans]
        try:
            tasks = [_grpc_client_loop(calls[i % len(calls)], request, budget, samples)
                     for i in range(concurrency)]
            await asyncio.wait_for(asyncio.gather(*tasks), hard_timeout)
        finally:
            for c in chans:
                await c.close()
    else:
        request = http_request_bytes(workload, host, port, binary=protocol == "http-binary")
        tasks = [_http_client_loop(host, port, request, budget, samples) for _ in range(concurrency)]
        await asyncio.wait_for(asyncio.gather(*tasks), hard_timeout)


def _new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


def _worker(args: dict, conn) -> None:
    """Runs one process's share of the clients; sends back its samples."""
    workload = make_workload(args["model"])
    samples = Samples()
    conn.send("ready")
    start_at = conn.recv()
    while time.perf_counter() < start_at:
        time.sleep(min(0.01, max(0.0, start_at - time.perf_counter())))
    budget = Budget(args["requests"], start_at + args["warmup"] + args["duration"])
    loop = _new_event_loop()
    try:
        loop.run_until_complete(_run_clients(
            args["protocol"], args["host"], args["port"], workload, args["concurrency"], budget,
            samples, args["warmup"] + args["duration"] + 60, args["channels"], args["grpc_client"]))
    except Exception as exc:  # reported to the parent, counted as an error
        samples.error(f"{type(exc).__name__}: {exc}")
    finally:
        loop.close()
    conn.send((np.asarray(samples.starts, np.int64), np.asarray(samples.ends, np.int64),
               samples.errors, samples.first_error))
    conn.close()


@dataclass
class LoadResult:
    protocol: str
    model: str
    concurrency: int
    completed: int
    errors: int
    infer_per_sec: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    window_s: float
    first_error: str = ""

    def line(self) -> str:
        text = (f"{self.protocol:11s} {self.model:16s} c={self.concurrency:<3d} "
                f"{self.infer_per_sec:9.1f} infer/s  p50 {self.p50_ms:.3f} ms  p90 {self.p90_ms:.3f} ms  "
                f"p99 {self.p99_ms:.3f} ms  ({self.completed} ok, {self.errors} errors, {self.window_s:.1f} s)")
        return text + (f"  first error: {self.first_error}" if self.errors else "")


def summarize(protocol: str, model: str, concurrency: int, starts: np.ndarray, ends: np.ndarray,
              errors: int, first_error: str, measure_from: float, deadline: float) -> LoadResult:
    t_w = int(measure_from * 1e9)
    if len(ends) == 0:
        return LoadResult(protocol, model, concurrency, 0, errors, 0.0, *[float("nan")] * 4, 0.0, first_error)
    t_end = min(int(deadline * 1e9), int(ends.max()))
    in_window = (ends >= t_w) & (ends <= t_end)
    window = (t_end - t_w) / 1e9
    measured = starts >= t_w
    lat_ms = (ends[measured] - starts[measured]) / 1e6
    if window <= 0 or len(lat_ms) == 0:
        raise SystemExit("load.py: nothing completed inside the measured window "
                         "(raise --requests or --duration, or lower --warmup)")
    p50, p90, p99 = np.percentile(lat_ms, [50, 90, 99])
    return LoadResult(protocol, model, concurrency, int(in_window.sum()), errors,
                      float(in_window.sum() / window), float(p50), float(p90), float(p99),
                      float(lat_ms.mean()), window, first_error)


def run_load(protocol: str, host: str, port: int, model: str, concurrency: int, duration: float,
             warmup: float = 1.0, requests: int = 1_000_000, procs: int = 1, channels: int = 1,
             reference_model: str | None = None, verify: bool = True, grpc_client: str = "raw") -> LoadResult:
    """Check one request, then run the closed loop and return throughput and latency."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}")
    if not ipaddress.ip_address(socket.gethostbyname(host)).is_loopback:
        raise SystemExit(f"load.py: {host} is not a loopback address; this tool only targets 127.0.0.0/8")
    if verify:
        workload = make_workload(model)
        if reference_model:
            workload = with_reference(workload, reference_model)
        check_once(protocol, host, port, workload)
    procs = max(1, min(procs, concurrency))
    ctx = mp.get_context("spawn") if procs > 1 else None
    shares = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
    req_shares = [requests // procs + (1 if i < requests % procs else 0) for i in range(procs)]
    base = {"protocol": protocol, "host": host, "port": port, "model": model, "warmup": warmup,
            "duration": duration, "channels": channels, "grpc_client": grpc_client}
    hard = warmup + duration + 90
    if procs == 1:
        parent, child = mp.Pipe()
        import threading
        t = threading.Thread(target=_worker, args=({**base, "concurrency": concurrency, "requests": requests}, child))
        t.start()
        children = [(parent, t)]
    else:
        children = []
        for share, reqs in zip(shares, req_shares):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=({**base, "concurrency": share, "requests": reqs}, child))
            p.start()
            children.append((parent, p))
    for parent, _ in children:
        if not parent.poll(60) or parent.recv() != "ready":
            raise SystemExit("load.py: a load process did not start")
    start_at = time.perf_counter() + 0.2
    for parent, _ in children:
        parent.send(start_at)
    starts, ends, errors, first_error = [], [], 0, ""
    for parent, proc in children:
        if not parent.poll(hard):
            raise SystemExit("load.py: a load process did not finish in time")
        s, e, err, first = parent.recv()
        starts.append(s)
        ends.append(e)
        errors += err
        first_error = first_error or first
        proc.join(30)
    return summarize(protocol, model, concurrency, np.concatenate(starts), np.concatenate(ends),
                     errors, first_error, start_at + warmup, start_at + warmup + duration)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="host:port (loopback only), e.g. 127.0.0.1:8000")
    parser.add_argument("--protocol", choices=PROTOCOLS, default="http-json")
    parser.add_argument("--model", default="add_sub",
                        help="add_sub* or mlp* (the example repository's models), xgboost* (a 32-feature classifier)")
    parser.add_argument("-c", "--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds (default 5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds first (default 1)")
    parser.add_argument("--requests", type=int, default=1_000_000, help="cap on requests sent, warmup included")
    parser.add_argument("--procs", type=int, default=1, help="client processes (default 1)")
    parser.add_argument("--channels", type=int, default=1, help="gRPC connections per process (default 1)")
    parser.add_argument("--grpc-client", choices=("raw", "grpcio"), default="raw",
                        help="raw: h2grpc.py's HTTP/2 framing (default, cheapest); grpcio: grpc.aio")
    parser.add_argument("--reference-model", help="ONNX file: check the first response against onnxruntime")
    parser.add_argument("--no-verify", action="store_true", help="skip the checked first request")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args(argv)
    host, _, port = args.url.rpartition(":")
    if args.concurrency < 1 or args.duration <= 0 or args.requests < 1:
        parser.error("--concurrency, --duration and --requests must be positive")
    result = run_load(args.protocol, host or "127.0.0.1", int(port), args.model, args.concurrency,
                      args.duration, args.warmup, args.requests, args.procs, args.channels,
                      args.reference_model, not args.no_verify, args.grpc_client)
    print(json.dumps(result.__dict__) if args.json else result.line())
    return 0 if result.completed else 1


if __name__ == "__main__":
    sys.exit(main())
