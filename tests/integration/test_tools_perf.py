"""`naiad perf` against the real server on loopback: CSV columns, counts against the server's statistics,
gRPC, streaming, system shared memory, request-rate mode, errors."""

import csv
import json
import subprocess
import sys

import pytest

from naiad.tools.perf import PerfError, PerfOptions, run_perf
from naiad.tools.v2client import HttpControl
from tests.support.onnx_models import add_sub_model
from tests.support.python_models import write_counter_model
from tests.support.servers import start_server

HEADER = ("Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
          "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency")
# Short windows and a loose stability bar: the CI machine is small and shared.
QUICK = ["-p", "200", "-s", "100", "-r", "4"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    add_sub_model(repo, "add_sub", dims=16, max_batch_size=8)
    with start_server(repo) as running:
        yield running


def quiet(**kwargs) -> PerfOptions:
    defaults = dict(measurement_interval_ms=200, stability_percentage=100, max_trials=4, progress="off")
    defaults.update(kwargs)
    return PerfOptions(**defaults)


def server_count(server) -> int:
    control = HttpControl(server.http_url)
    try:
        return control.stats("add_sub").success_count
    finally:
        control.close()


def test_cli_concurrency_sweep_writes_perf_analyzer_csv(server, tmp_path):
    before = server_count(server)
    csv_path, json_path = tmp_path / "out.csv", tmp_path / "out.json"
    done = subprocess.run(
        [sys.executable, "-m", "naiad", "perf", "-m", "add_sub", "-u", server.http_url, "--concurrency-range", "1:2",
         *QUICK, "-f", str(csv_path), "--json-report-file", str(json_path), "--progress", "on"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Request concurrency: 1" in done.stdout and "Request concurrency: 2" in done.stdout
    assert "Avg request latency:" in done.stdout  # the server-side breakdown
    assert "concurrency 1 | window 1 |" in done.stderr  # the live progress line
    rows = list(csv.reader(csv_path.open()))
    assert ",".join(rows[0]) == HEADER
    assert sorted(r[0] for r in rows[1:]) == ["1", "2"]
    assert all(float(r[1]) > 0 and int(r[12]) >= int(r[9]) > 0 for r in rows[1:])
    report = json.loads(json_path.read_text())
    totals = report["totals"]
    # every request the tool completed is one the server counted, and nothing else reached the server
    assert totals["client_request_count"] == totals["server_request_count"] == server_count(server) - before
    for level in report["levels"]:
        client, counted = level["request_count"], level["server"]["request_count"]
        # per window, the statistics snapshot is taken a round trip after the client's boundary, so
        # requests completing meanwhile land in the neighbouring window (the totals above are exact)
        assert abs(client - counted) <= 2 * int(level["value"]) + 2 + client // 100, level
        assert level["server"]["compute_infer_us"] > 0


def test_grpc_with_system_shared_memory(server):
    result = run_perf(quiet(model="add_sub", url=server.grpc_url, protocol="grpc", shared_memory="system",
                            batch_size=4, concurrency_range=(2, 2, 1)), out=open("/dev/null", "w"))
    level = result.levels[0]
    assert level.measurement.count > 0 and level.measurement.throughput > 0
    assert result.client_completed == result.server_delta.success_count
    # batch 4 per request: the server counts 4 inferences per request
    assert result.server_delta.inference_count == 4 * result.server_delta.success_count
    control = HttpControl(server.http_url)
    try:
        assert control.system_shm_regions() == []  # regions were unregistered
    finally:
        control.close()


def test_http_shared_memory_and_grpc_streaming(server):
    for options in (quiet(model="add_sub", url=server.http_url, shared_memory="system"),
                    quiet(model="add_sub", url=server.grpc_url, protocol="grpc", streaming=True)):
        result = run_perf(options, out=open("/dev/null", "w"))
        assert result.levels[0].measurement.count > 0
        assert result.client_completed == result.server_delta.success_count


def test_constant_request_rate(server):
    result = run_perf(quiet(model="add_sub", url=server.http_url, request_rate_range=(100.0, 100.0, 1.0),
                            measurement_interval_ms=500), out=open("/dev/null", "w"))
    m = result.levels[0].measurement
    assert 70 <= m.request_rate <= 130, m.request_rate
    assert result.client_completed == result.server_delta.success_count


def test_errors_are_reported(server, tmp_path):
    done = subprocess.run([sys.executable, "-m", "naiad", "perf", "-m", "missing", "-u", server.http_url, *QUICK],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("naiad perf: error: model 'missing' is not ready")
    with pytest.raises(PerfError, match="exceeds the model's max_batch_size"):
        run_perf(quiet(model="add_sub", url=server.http_url, batch_size=64), out=open("/dev/null", "w"))


def test_binary_search_count_windows_warmup_and_percentile(server):
    result = run_perf(quiet(model="add_sub", url=server.http_url, concurrency_range=(1, 4, 1), binary_search=True,
                            latency_threshold_ms=10_000, percentile=95, warmup_request_count=20,
                            measurement_mode="count_windows", measurement_request_count=40),
                      out=open("/dev/null", "w"))
    # within the threshold at both ends: the search measures the two ends only
    assert [level.value for level in result.levels] == [1, 4]
    assert all(level.measurement.count >= 40 for level in result.levels)
    assert result.client_completed == result.server_delta.success_count


def test_decoupled_model_over_grpc_streaming(tmp_path):
    pytest.importorskip("naiad.backends.python")
    write_counter_model(tmp_path / "repo")
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"data": [{"COUNT": [3]}]}))
    with start_server(tmp_path / "repo") as running:
        with pytest.raises(PerfError, match="decoupled"):
            run_perf(quiet(model="counter", url=running.http_url, input_data=str(data)), out=open("/dev/null", "w"))
        out = tmp_path / "out.txt"
        result = run_perf(quiet(model="counter", url=running.grpc_url, protocol="grpc", streaming=True,
                                input_data=str(data), csv_file=str(tmp_path / "pa.csv")), out=out.open("w"))
    m = result.levels[0].measurement
    assert m.count > 0 and m.responses == 3 * m.count
    assert result.client_completed == result.server_delta.success_count
    # perf_analyzer's decoupled columns and lines: responses per second beside inferences per second
    rows = list(csv.reader((tmp_path / "pa.csv").open()))
    assert rows[0][:3] == ["Concurrency", "Inferences/Second", "Response Throughput"]
    assert rows[0][3:] == HEADER.split(",")[2:]
    assert float(rows[1][2]) == pytest.approx(3 * float(rows[1][1]), rel=0.01)
    text = out.read_text()
    assert "Response Throughput: " in text and "First response latency: avg " in text


def test_collect_metrics_reads_the_prometheus_endpoint(server, tmp_path):
    csv_path = tmp_path / "metrics.csv"
    done = subprocess.run(
        [sys.executable, "-m", "naiad", "perf", "-m", "add_sub", "-u", server.http_url, *QUICK, "--progress", "off",
         "--collect-metrics", "--metrics-url", f"127.0.0.1:{server.metrics_port}/metrics", "--metrics-interval", "50",
         "-f", str(csv_path), "--verbose-csv"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Server Prometheus Metrics:" in done.stdout and "Avg CPU Utilization:" in done.stdout
    assert "No GPU metrics" in done.stdout  # this machine has none: said, not invented
    rows = list(csv.DictReader(csv_path.open()))
    assert rows[0]["Avg GPU Utilization"] == ""  # perf_analyzer's column, empty without GPUs
    assert 0.0 <= float(rows[0]["Avg CPU Utilization"]) <= 1.0 and int(rows[0]["Max CPU Memory Usage"]) > 0


def test_cuda_shared_memory_is_explained():
    done = subprocess.run([sys.executable, "-m", "naiad", "perf", "-m", "add_sub", "--shared-memory", "cuda"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "needs a CUDA GPU" in done.stderr and "--shared-memory system" in done.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_wrong_protocol_or_port_is_said_in_one_line(server):
    cases = [
        ([ "-u", server.grpc_url], "answered with HTTP/2 (gRPC?): use -i grpc"),
        (["-u", server.http_url, "-i", "grpc"], "answered with HTTP/1.1, not gRPC: drop -i grpc"),
        (["-u", f"127.0.0.1:{_free_port()}"], "nothing is listening on 127.0.0.1:"),
        (["-u", server.http_url, "--shape", "INPUT0:x"], "naiad perf: error: "),
    ]
    for args, message in cases:
        done = subprocess.run([sys.executable, "-m", "naiad", "perf", "-m", "add_sub", *args, *QUICK],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("naiad perf: error: ") and message in lines[0], (args, lines)
    assert HttpControl(server.http_url).ready()  # the server kept serving


def test_progress_lines_when_not_on_a_terminal(server):
    done = subprocess.run([sys.executable, "-m", "naiad", "perf", "-m", "add_sub", "-u", server.http_url, *QUICK],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stderr.splitlines() if line.startswith("naiad perf: ")]
    assert progress and progress[0].startswith("naiad perf: concurrency 1 |")
    assert "\r" not in done.stderr  # plain lines for a log, no in-place rewriting
