"""perf's pieces without a server: flags, load splitting, inputs, request bytes, HTTP framing, CSV columns."""

import argparse
import json
import os
import threading
import time
from multiprocessing import Pipe

import numpy as np
import pytest

from naiad.tools.http_wire import ProtocolError, ResponseParser
from naiad.tools.perf.inputs import InputError, build_input_sets, parse_shapes, tensor_bytes
from naiad.tools.perf.load_manager import split_level
from naiad.tools.perf.measurement import WindowStats
from naiad.tools.perf.options import PerfOptions, add_perf_flags, options_from_args, parse_range
from naiad.tools.perf.payloads import RequestOptions, ShmRef, grpc_payload, http_payload, parse_request_parameter
from naiad.tools.perf.report import LevelResult, csv_rows
from naiad.tools.perf.worker import Worker, WorkerSpec
from naiad.tools.v2client import ModelInfo, StatsSnapshot, TensorSpec, split_url

PERF_ANALYZER_HEADER = ("Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
                        "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,"
                        "p50 latency,p90 latency,p95 latency,p99 latency").split(",")


def model(max_batch_size=8, dims=(4,), datatype="FP32"):
    shape = ([-1] if max_batch_size else []) + list(dims)
    return ModelInfo("m", "1", [TensorSpec("IN", datatype, shape)], [TensorSpec("OUT", datatype, shape)],
                     max_batch_size=max_batch_size)


def parse(argv):
    parser = argparse.ArgumentParser()
    add_perf_flags(parser)
    return options_from_args(parser.parse_args(argv))


def test_ranges_and_levels():
    assert parse_range("1:8:2", int) == (1, 8, 2)
    assert parse_range("4", int) == (4, 4, 1)
    assert parse_range("100:300:100", float) == (100.0, 300.0, 100.0)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_range("0:4", int)
    assert PerfOptions("m", concurrency_range=(1, 8, 2)).levels() == [1, 3, 5, 7]
    assert PerfOptions("m").levels() == [1]
    assert PerfOptions("m", request_rate_range=(50.0, 100.0, 25.0)).levels() == [50.0, 75.0, 100.0]


def test_perf_analyzer_flags_parse():
    o = parse(["-m", "add_sub", "-u", "127.0.0.1:9001", "-i", "grpc", "--streaming", "-b", "2",
               "--concurrency-range", "1:4", "-p", "250", "-s", "5", "-r", "7", "--percentile", "95",
               "--shape", "IN:3,4", "--shared-memory", "system", "-f", "x.csv", "-H", "X-Key: v",
               "--request-parameter", "p:3:int"])
    assert (o.model, o.protocol, o.streaming, o.batch_size) == ("add_sub", "grpc", True, 2)
    assert o.concurrency_range == (1, 4, 1) and o.measurement_interval_ms == 250
    assert (o.stability_percentage, o.max_trials, o.percentile) == (5, 7, 95)
    assert o.shapes == ["IN:3,4"] and o.shared_memory == "system" and o.csv_file == "x.csv"
    assert o.headers == {"X-Key": "v"} and o.request_parameters == ["p:3:int"]
    assert o.resolved_url() == "127.0.0.1:9001"
    assert PerfOptions("m", protocol="grpc").resolved_url() == "127.0.0.1:8001"
    with pytest.raises(SystemExit):
        parse(["-m", "x", "--streaming"])  # streaming needs gRPC
    with pytest.raises(SystemExit):
        parse(["-m", "x", "--concurrency-range", "1", "--request-rate-range", "10"])


def test_split_level_over_processes():
    parts = split_level({"mode": "concurrency", "concurrency": 5}, 2)
    assert [p["concurrency"] for p in parts] == [3, 2]
    assert split_level({"mode": "concurrency", "concurrency": 1}, 3)[1:] == [None, None]
    rate = split_level({"mode": "rate", "rate": 100.0, "distribution": "constant"}, 4)
    assert sum(p["rate"] for p in rate) == pytest.approx(100.0)
    assert [p["offset_ns"] for p in rate] == [0, 10_000_000, 20_000_000, 30_000_000]


def test_inputs_carry_the_batch_dim_and_shapes():
    sets = build_input_sets(model(), 4, "zero", {})
    assert sets[0][0].array.shape == (4, 4) and not sets[0][0].array.any()
    assert build_input_sets(model(0), 1, "random", {})[0][0].array.shape == (4,)
    with pytest.raises(InputError, match="does not support batching"):
        build_input_sets(model(0), 2, "zero", {})
    with pytest.raises(InputError, match="exceeds"):
        build_input_sets(model(2), 4, "zero", {})
    variable = model(8, dims=(-1,))
    with pytest.raises(InputError, match="--shape IN"):
        build_input_sets(variable, 1, "random", {})
    assert build_input_sets(variable, 2, "random", parse_shapes(["IN:7"]))[0][0].array.shape == (2, 7)


def test_json_input_data(tmp_path):
    path = tmp_path / "data.json"
    path.write_text(json.dumps({"data": [{"IN": [1, 2, 3, 4]}, {"IN": {"content": [5, 6, 7, 8], "shape": [4]}}]}))
    sets = build_input_sets(model(), 2, str(path), {})
    assert len(sets) == 2
    assert sets[1][0].array.tolist() == [[5, 6, 7, 8], [5, 6, 7, 8]]
    path.write_text(json.dumps({"data": [{"OTHER": [1]}]}))
    with pytest.raises(InputError, match="no value for input 'IN'"):
        build_input_sets(model(), 1, str(path), {})


def test_bytes_tensor_encoding():
    info = model(0, dims=(2,), datatype="BYTES")
    tensor = build_input_sets(info, 1, "random", {}, string_data="hey")[0][0]
    assert tensor_bytes(tensor) == b"\x03\x00\x00\x00hey" * 2


def test_http_payload_binary_and_shared_memory():
    info = model()
    tensors = build_input_sets(info, 1, "zero", {})[0]
    raw = http_payload("127.0.0.1", 8000, info, tensors, RequestOptions("m", "", {"p": 1}), None, None)
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /v2/models/m/infer HTTP/1.1")
    header_len = int([ln for ln in head.split(b"\r\n") if ln.startswith(b"Inference-Header-Content-Length")][0].split(b":")[1])
    doc = json.loads(body[:header_len])
    assert doc["inputs"][0]["parameters"] == {"binary_data_size": 16}
    assert doc["outputs"] == [{"name": "OUT", "parameters": {"binary_data": True}}] and doc["parameters"] == {"p": 1}
    assert len(body) == header_len + 16
    shm = http_payload("h", 1, info, tensors, RequestOptions("m", "2"), {"IN": ShmRef("in", 8, 16)},
                       {"OUT": ShmRef("out", 0, 16)})
    head, body = shm.split(b"\r\n\r\n", 1)
    doc = json.loads(body)
    assert b"/v2/models/m/versions/2/infer" in head
    assert doc["inputs"][0]["parameters"] == {"shared_memory_region": "in", "shared_memory_byte_size": 16,
                                              "shared_memory_offset": 8}
    assert doc["outputs"][0]["parameters"]["shared_memory_region"] == "out"


def test_grpc_payload():
    from tritonclient.grpc import service_pb2

    info = model()
    tensors = build_input_sets(info, 3, "zero", {})[0]
    request = service_pb2.ModelInferRequest.FromString(
        grpc_payload(info, tensors, RequestOptions("m", "", {"flag": True}, decoupled=True), None, None, streaming=True))
    assert request.model_name == "m" and list(request.inputs[0].shape) == [3, 4]
    assert len(request.raw_input_contents[0]) == 48
    assert request.parameters["flag"].bool_param and request.parameters["triton_enable_empty_final_response"].bool_param


def test_request_parameter_and_url_parsing():
    assert parse_request_parameter("max_tokens:16:int") == ("max_tokens", 16)
    assert parse_request_parameter("t:0.5:double") == ("t", 0.5)
    assert parse_request_parameter("mode:fast:string") == ("mode", "fast")
    with pytest.raises(ValueError):
        parse_request_parameter("x:1:complex")
    assert split_url("http://localhost:9000/", 1) == ("localhost", 9000)
    assert split_url("127.0.0.1", 8001) == ("127.0.0.1", 8001)
    assert split_url("[::1]:5", 1) == ("::1", 5)


def test_response_parser_content_length_in_pieces():
    parser = ResponseParser()
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX: y\r\n\r\nhello"
    assert not parser.feed(raw[:10]) and not parser.feed(raw[10:-2])
    assert parser.feed(raw[-2:])
    assert parser.status == 200 and parser.headers["x"] == "y" and bytes(parser.body) == b"hello"


def test_response_parser_chunked_streaming():
    seen = []
    parser = ResponseParser(on_body=seen.append)
    raw = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"6\r\ndata: \r\na;ext=1\r\n{\"a\": 1}\n\n\r\n0\r\n\r\n")
    done = [parser.feed(raw[i:i + 3]) for i in range(0, len(raw), 3)]
    assert done[-1] and not any(done[:-1])
    assert b"".join(seen) == b'data: {"a": 1}\n\n'
    with pytest.raises(ProtocolError):
        ResponseParser().feed(b"garbage\r\n\r\n")


def level(value, throughput, server=True):
    count = int(throughput)
    m = WindowStats(duration_ns=1_000_000_000, batch_size=1, latencies_ns=np.full(count, 2_000_000, dtype=np.int64),
                    send_ns_total=count * 10_000, recv_ns_total=count * 20_000)
    if server:
        m.server_delta = StatsSnapshot(success_count=count, success_ns=count * 1_000_000, queue_count=count,
                                       queue_ns=count * 100_000, compute_infer_count=count,
                                       compute_infer_ns=count * 800_000)
    return LevelResult("concurrency", value, m, [m], True)


def test_csv_has_perf_analyzer_columns_sorted_by_throughput():
    header, rows = csv_rows([level(4, 900), level(1, 300), level(2, 600)], verbose=False)
    assert header == PERF_ANALYZER_HEADER
    assert [r[0] for r in rows] == ["1", "2", "4"]
    row = dict(zip(header, rows[0]))
    assert row["Client Send"] == "10" and row["Client Recv"] == "20"
    assert row["Server Queue"] == "100" and row["Server Compute Infer"] == "800"
    # the parts add up to the average latency (2000 us)
    parts = ["Client Send", "Network+Server Send/Recv", "Server Queue", "Server Compute Input",
             "Server Compute Infer", "Server Compute Output", "Client Recv"]
    assert sum(int(row[p]) for p in parts) == 2000
    assert row["p99 latency"] == "2000"
    verbose_header, verbose_rows = csv_rows([level(1, 300)], verbose=True)
    assert verbose_header[:13] == PERF_ANALYZER_HEADER and "Server Request Count" in verbose_header
    rate = LevelResult("rate", 50.0, level(1, 50).measurement, [], True)
    assert csv_rows([rate], False)[0][0] == "Request Rate"


def test_a_window_of_records_larger_than_the_pipe_reaches_the_coordinator():
    # uvloop leaves the worker's end of the pipe non-blocking; a big window once failed with EAGAIN
    coordinator, worker_end = Pipe()
    os.set_blocking(worker_end.fileno(), False)
    worker = Worker(worker_end, WorkerSpec(protocol="http", host="127.0.0.1", port=1, payloads=[b""]))
    worker.records = [(i, i + 1, 0, 0, 0, 1, 0) for i in range(200_000)]  # ~11 MB pickled
    received = []

    def coordinator_reads_late():
        time.sleep(0.2)  # a coordinator that reads late, on purpose: the worker's write must fill the pipe
        received.append(coordinator.recv())

    reader = threading.Thread(target=coordinator_reads_late)
    reader.start()
    worker._reply("records")
    reader.join(10)
    kind, rows, errors, _ = received[0]
    assert kind == "records" and rows.shape == (200_000, 7) and rows[-1, 1] == 200_000 and errors == 0
    assert os.get_blocking(worker_end.fileno()) is False  # handed back to the event loop as it was
