"""perf_analyzer's command-line flags and the options object the profiler runs from."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field


@dataclass
class PerfOptions:
    model: str
    version: str = ""
    url: str = ""
    protocol: str = "http"
    streaming: bool = False
    batch_size: int = 1
    concurrency_range: tuple[int, int, int] | None = None
    request_rate_range: tuple[float, float, float] | None = None
    request_distribution: str = "constant"
    request_intervals_ns: list[int] = field(default_factory=list)
    shapes: list[str] = field(default_factory=list)
    input_data: str | list[str] = "random"  # zero | random | JSON files / directories (repeatable)
    string_length: int = 128
    string_data: str | None = None
    shared_memory: str = "none"
    output_shared_memory_size: int = 102400
    headers: dict[str, str] = field(default_factory=dict)
    request_parameters: list[str] = field(default_factory=list)
    measurement_mode: str = "time_windows"
    measurement_interval_ms: float = 5000.0
    measurement_request_count: int = 50
    stability_percentage: float = 10.0
    max_trials: int = 10
    percentile: float = -1
    warmup_request_count: int = 0
    request_count: int = 0
    latency_threshold_ms: float = 0.0
    binary_search: bool = False
    csv_file: str = ""
    verbose_csv: bool = False
    json_file: str = ""
    processes: int = 0  # 0 = choose from the load
    max_connections: int = 1024
    progress: str = "auto"  # auto | on | off
    verbose: bool = False
    seed: int = 0
    levels_override: list[float] = field(default_factory=list)  # explicit load values (e.g. powers of two)
    sequence_length: int = 0  # 0 = the data stream's length with user data, else 20
    sequence_length_variation: float = 20.0
    sequence_id_range: tuple[int, int] = (1, 0)  # [start, end); end 0 = unbounded
    num_of_sequences: int = 4
    serial_sequences: bool = False
    collect_metrics: bool = False
    metrics_url: str = ""
    metrics_interval_ms: float = 1000.0

    @property
    def mode(self) -> str:
        return "rate" if (self.request_rate_range or self.request_intervals_ns) else "concurrency"

    def resolved_url(self) -> str:
        return self.url or ("127.0.0.1:8001" if self.protocol == "grpc" else "127.0.0.1:8000")

    def levels(self) -> list[float]:
        """The load values of the sweep (concurrency counts or requests/s)."""
        if self.levels_override:
            return list(self.levels_override)
        if self.request_intervals_ns:
            return [0.0]
        if self.request_rate_range:
            start, end, step = self.request_rate_range
            return _sweep(start, end, step)
        start, end, step = self.concurrency_range or (1, 1, 1)
        return [int(v) for v in _sweep(start, end, step)]

    def process_count(self) -> int:
        if self.processes > 0:
            return self.processes
        top = max(self.levels() or [1])
        per_process = 4000.0 if self.mode == "rate" else 64.0
        return max(1, min(os.cpu_count() or 1, int(-(-top // per_process))))


def _sweep(start: float, end: float, step: float) -> list[float]:
    if end < start:
        end = start
    if step <= 0:
        raise ValueError("range step must be positive")
    values, value = [], start
    for _ in range(100_000):  # bounded sweep
        if value > end + 1e-9:
            break
        values.append(value)
        value += step
    return values


def parse_range(text: str, kind: type) -> tuple:
    """'start[:end[:step]]' -> (start, end, step)."""
    parts = text.split(":")
    if not 1 <= len(parts) <= 3 or not parts[0]:
        raise argparse.ArgumentTypeError(f"expected start[:end[:step]], got '{text}'")
    try:
        start = kind(parts[0])
        end = kind(parts[1]) if len(parts) > 1 and parts[1] else start
        step = kind(parts[2]) if len(parts) > 2 and parts[2] else kind(1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad range '{text}'") from None
    if start <= 0 or step <= 0:
        raise argparse.ArgumentTypeError(f"range '{text}': start and step must be positive")
    return start, end, step


def _id_range(text: str) -> tuple[int, int]:
    """'start[:end]' for --sequence-id-range (end excluded; no end = unbounded)."""
    start, _, end = text.partition(":")
    try:
        first, last = int(start), int(end) if end else 0
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected start[:end], got '{text}'") from None
    if first < 1 or (last and last <= first):
        raise argparse.ArgumentTypeError(f"'{text}': ids start at 1 or more and the end must be above the start")
    return first, last


def add_perf_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("-m", "--model-name", dest="model", required=True, help="model to profile")
    add("-x", "--model-version", dest="version", default="", help="model version (default: the server's choice)")
    add("-u", "--url", default="", help="server address host:port (default 127.0.0.1:8000 HTTP, :8001 gRPC)")
    add("-i", "--protocol", choices=["http", "grpc", "HTTP", "gRPC", "GRPC"], default="http")
    add("--service-kind", choices=["triton"], default="triton", help="only the v2 (Triton) service kind")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("-a", "--async", dest="async_mode", action="store_true",
                      help="accepted for compatibility: each concurrency slot always keeps one request outstanding")
    mode.add_argument("--sync", dest="async_mode", action="store_false")
    add("--streaming", action="store_true", help="gRPC bidirectional streaming (needed for decoupled models)")
    add("-b", "--batch-size", type=int, default=1)
    add("--concurrency-range", type=lambda t: parse_range(t, int), default=None, metavar="START:END:STEP")
    add("--request-rate-range", type=lambda t: parse_range(t, float), default=None, metavar="START:END:STEP")
    add("--request-distribution", choices=["constant", "poisson"], default="constant")
    add("--request-intervals", default="", metavar="FILE", help="microseconds between requests, one per line")
    add("--shape", action="append", default=[], metavar="NAME:D1,D2", help="dims of a variable-shape input")
    add("--input-data", action="append", default=None,
        help="zero, random, a JSON data file or a directory of raw input files (files are repeatable)")
    add("--string-length", type=int, default=128)
    add("--string-data", default=None)
    add("--shared-memory", choices=["none", "system", "cuda"], default="none",
        help="pass tensors through system shared memory (cuda needs a GPU and is refused with the reason)")
    add("--output-shared-memory-size", type=int, default=102400)
    add("--input-tensor-format", choices=["binary"], default="binary")
    add("--output-tensor-format", choices=["binary"], default="binary")
    add("-H", dest="headers", action="append", default=[], metavar="'Name: value'", help="extra HTTP header")
    add("--request-parameter", action="append", default=[], metavar="NAME:VALUE:TYPE")
    add("--measurement-mode", choices=["time_windows", "count_windows"], default="time_windows")
    add("-p", "--measurement-interval", type=float, default=5000.0, metavar="MS")
    add("--measurement-request-count", type=int, default=50)
    add("-s", "--stability-percentage", type=float, default=10.0)
    add("-r", "--max-trials", type=int, default=10)
    add("--percentile", type=float, default=-1, help="use pN latency for stability and reports (default: average)")
    add("--warmup-request-count", type=int, default=0)
    add("--request-count", type=int, default=0, help="measure exactly this many requests per load level")
    add("-l", "--latency-threshold", type=float, default=0.0, metavar="MS",
        help="stop the sweep once latency exceeds this")
    add("--binary-search", action="store_true", help="binary-search the range for the latency threshold")
    seq = parser.add_argument_group("sequence models")
    seq.add_argument("--sequence-length", type=int, default=0,
                     help="requests per sequence (default 20, or the data stream's length with --input-data FILE)")
    seq.add_argument("--sequence-length-variation", type=float, default=20.0, metavar="PERCENT")
    seq.add_argument("--sequence-id-range", type=_id_range, default=(1, 0), metavar="START[:END]")
    seq.add_argument("--num-of-sequences", type=int, default=4, help="live sequences in request-rate mode")
    seq.add_argument("--serial-sequences", action="store_true", help="at most one live request per sequence")
    metrics = parser.add_argument_group("server metrics")
    metrics.add_argument("--collect-metrics", action="store_true", help="read the server's Prometheus metrics")
    metrics.add_argument("--metrics-url", default="", help="default: the server's host, port 8002, /metrics")
    metrics.add_argument("--metrics-interval", type=float, default=1000.0, metavar="MS")
    add("-f", "--latency-report-file", dest="csv_file", default="", metavar="CSV")
    add("--verbose-csv", action="store_true")
    add("--json-report-file", dest="json_file", default="", metavar="JSON", help="(naiad) every level as JSON")
    add("--processes", type=int, default=0, help="(naiad) load-generating processes (default: from the load)")
    add("--max-threads", dest="max_connections", type=int, default=1024,
        help="most requests outstanding per process in request-rate mode")
    add("--progress", choices=["auto", "on", "off"], default="auto",
        help="progress on stderr (auto: a live line on a terminal, else a line every 5 s; on: always the live line)")
    add("-v", "--verbose", action="store_true", help="print every measurement window")


def options_from_args(args: argparse.Namespace) -> PerfOptions:
    headers = {}
    for item in args.headers:
        name, sep, value = item.partition(":")
        if not sep:
            raise SystemExit(f"naiad perf: -H expects 'Name: value', got '{item}'")
        headers[name.strip()] = value.strip()
    intervals: list[int] = []
    if args.request_intervals:
        with open(args.request_intervals) as handle:
            intervals = [int(float(line) * 1000) for line in handle if line.strip()]
        if not intervals or any(v < 0 for v in intervals):
            raise SystemExit(f"naiad perf: {args.request_intervals}: expected non-negative microseconds, one per line")
    if args.concurrency_range and args.request_rate_range:
        raise SystemExit("naiad perf: --concurrency-range and --request-rate-range cannot be combined")
    if args.binary_search and args.latency_threshold <= 0:
        raise SystemExit("naiad perf: --binary-search needs -l/--latency-threshold")
    protocol = args.protocol.lower()
    if args.shared_memory == "cuda":
        raise SystemExit("naiad perf: --shared-memory cuda needs a CUDA GPU and CUDA IPC handles, which this client "
                         "does not create; use --shared-memory system (same API, host memory) or none")
    input_data: str | list[str] = args.input_data or "random"
    if isinstance(input_data, list):
        if len(input_data) > 1 and any(item in ("zero", "random") for item in input_data):
            raise SystemExit("naiad perf: --input-data zero/random cannot be combined with data files")
        input_data = input_data[0] if len(input_data) == 1 else input_data
    if args.sequence_length < 0 or not 0 <= args.sequence_length_variation <= 100 or args.num_of_sequences < 1:
        raise SystemExit("naiad perf: --sequence-length >= 0, --sequence-length-variation 0..100 and "
                         "--num-of-sequences >= 1 are expected")
    if args.streaming and protocol != "grpc":
        raise SystemExit("naiad perf: --streaming is only available with -i grpc")
    return PerfOptions(
        model=args.model, version=args.version, url=args.url, protocol=protocol, streaming=args.streaming,
        batch_size=args.batch_size, concurrency_range=args.concurrency_range,
        request_rate_range=args.request_rate_range, request_distribution=args.request_distribution,
        request_intervals_ns=intervals, shapes=args.shape, input_data=input_data,
        string_length=args.string_length, string_data=args.string_data, shared_memory=args.shared_memory,
        output_shared_memory_size=args.output_shared_memory_size, headers=headers,
        request_parameters=args.request_parameter, measurement_mode=args.measurement_mode,
        measurement_interval_ms=args.measurement_interval, measurement_request_count=args.measurement_request_count,
        stability_percentage=args.stability_percentage, max_trials=args.max_trials, percentile=args.percentile,
        warmup_request_count=args.warmup_request_count, request_count=args.request_count,
        latency_threshold_ms=args.latency_threshold, binary_search=args.binary_search, csv_file=args.csv_file,
        verbose_csv=args.verbose_csv, json_file=args.json_file, processes=args.processes,
        max_connections=args.max_connections, progress=args.progress, verbose=args.verbose,
        sequence_length=args.sequence_length, sequence_length_variation=args.sequence_length_variation,
        sequence_id_range=args.sequence_id_range, num_of_sequences=args.num_of_sequences,
        serial_sequences=args.serial_sequences, collect_metrics=args.collect_metrics, metrics_url=args.metrics_url,
        metrics_interval_ms=args.metrics_interval,
    )
