"""perf's user data (JSON streams, b64, directories), sequence planning and Prometheus metrics, without a server."""

import base64
import json
import struct

import numpy as np
import pytest

from naiad.tools.perf.inputs import InputError, build_input_data
from naiad.tools.perf.payloads import RequestOptions, grpc_parameters, grpc_payload, http_template, render_http
from naiad.tools.perf.sequences import SequencePlanner, SequenceSpec
from naiad.tools.perf.server_metrics import aggregate, metrics_url, parse_prometheus
from naiad.tools.v2client import ModelInfo, TensorSpec


def model(datatype="FP32", dims=(2,), max_batch_size=4):
    shape = [-1, *dims] if max_batch_size else list(dims)
    return ModelInfo("m", "1", [TensorSpec("IN", datatype, shape)], [TensorSpec("OUT", datatype, shape)],
                     max_batch_size=max_batch_size)


def test_streams_entries_and_b64(tmp_path):
    streams = tmp_path / "streams.json"
    streams.write_text(json.dumps({"data": [[{"IN": [1, 2]}, {"IN": [3, 4]}], [{"IN": {"content": [5, 6], "shape": [2]}}]]}))
    data = build_input_data(model(), 1, str(streams), {})
    assert data.streams == [[0, 1], [2]] and data.sets[2][0].array.tolist() == [[5, 6]]
    raw = base64.b64encode(np.array([7, 8], np.float32).tobytes()).decode()
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"data": [{"IN": {"b64": raw}}, {"IN": {"content": {"b64": raw}, "shape": [2]}}]}))
    both = build_input_data(model(), 2, [str(flat), str(streams)], {})  # repeated --input-data appends streams
    assert both.streams == [[0, 1], [2, 3], [4]] and both.sets[0][0].array.tolist() == [[7, 8], [7, 8]]
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps({"data": [[{"IN": [1, 2]}], {"IN": [1, 2]}]}))
    with pytest.raises(InputError, match="mixes"):
        build_input_data(model(), 1, str(mixed), {})


def test_b64_strings_are_length_prefixed_and_directories_hold_raw_files(tmp_path):
    raw = b"".join(struct.pack("<I", len(s)) + s for s in (b"ab", b"cde"))
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"data": [{"IN": {"b64": base64.b64encode(raw).decode()}}]}))
    assert build_input_data(model("BYTES", (2,), 0), 1, str(path), {}).sets[0][0].array.tolist() == [b"ab", b"cde"]
    folder = tmp_path / "dir"
    folder.mkdir()
    (folder / "IN").write_bytes(np.array([1.5, 2.5], np.float32).tobytes())
    assert build_input_data(model(), 1, str(folder), {}).sets[0][0].array.tolist() == [[1.5, 2.5]]


def test_sequence_lengths_ids_and_flags():
    spec = SequenceSpec([[0, 1, 2]], length=10, variation=20, id_start=5, id_end=9)
    planner = SequencePlanner(spec, index=1, count=2, seed=0)  # process 1 of 2 owns ids 6 and 8
    first, second = planner.new(), planner.new()
    assert {first.id, second.id} == {6, 8}
    with pytest.raises(RuntimeError, match="sequence-id-range"):
        planner.new()
    planner.finished(first)
    assert planner.new().id == first.id
    sizes = [len(SequencePlanner(spec, 0, 1, seed).new().steps) for seed in range(40)]
    assert min(sizes) >= 8 and max(sizes) <= 12 and len(set(sizes)) > 1
    own = SequencePlanner(SequenceSpec([[3, 4, 5]], length=0), 0, 1, 0).new()  # user data: the stream's length
    steps = [own.next_step() for _ in range(3)]
    assert [index for index, _ in steps] == [3, 4, 5]
    assert [(p["sequence_start"], p["sequence_end"]) for _, p in steps] == [(True, False), (False, False), (False, True)]
    early = SequencePlanner(SequenceSpec([[0, 1, 2]], length=3, variation=0), 0, 1, 0).new()
    early.next_step()
    assert early.end_now()[1] == {"sequence_id": 1, "sequence_start": False, "sequence_end": True} and early.done


def test_sequence_parameters_merge_into_requests():
    from tritonclient.grpc import service_pb2

    info = model()
    tensors = build_input_data(info, 1, "zero", {}).sets[0]
    base = grpc_payload(info, tensors, RequestOptions("m", "", {"user": 1}), None, None)
    merged = service_pb2.ModelInferRequest.FromString(base + grpc_parameters({"sequence_id": 7, "sequence_start": True}))
    assert merged.parameters["sequence_id"].int64_param == 7 and merged.parameters["sequence_start"].bool_param
    assert merged.parameters["user"].int64_param == 1 and len(merged.raw_input_contents) == 1
    raw = render_http(http_template("h", 1, info, tensors, RequestOptions("m", "", {"user": 1}), None, None),
                      {"sequence_id": "abc", "sequence_end": True})
    head, body = raw.split(b"\r\n\r\n", 1)
    length = int(next(line for line in head.split(b"\r\n") if line.startswith(b"Inference-Header")).split(b":")[1])
    assert json.loads(body[:length])["parameters"] == {"user": 1, "sequence_id": "abc", "sequence_end": True}
    assert int(next(line for line in head.split(b"\r\n") if line.startswith(b"Content-Length")).split(b":")[1]) == len(body)


def test_prometheus_metrics_are_aggregated_like_perf_analyzer():
    text = """# HELP nv_gpu_utilization GPU utilization rate
nv_gpu_utilization{gpu_uuid="GPU-a"} %s
nv_gpu_power_usage{gpu_uuid="GPU-a"} %s
nv_gpu_memory_used_bytes{gpu_uuid="GPU-a"} %s
nv_gpu_memory_total_bytes{gpu_uuid="GPU-a"} 1000
nv_cpu_utilization %s
nv_cpu_memory_used_bytes %s
nv_inference_count{model="m",version="1"} 5
"""
    samples = [parse_prometheus(text % (0.5, 100, 300, 0.2, 10)), parse_prometheus(text % (0.7, 200, 200, 0.4, 30))]
    result = aggregate(samples)
    assert result.gpu_utilization == {"GPU-a": pytest.approx(0.6)} and result.gpu_power_watts == {"GPU-a": 150}
    assert result.gpu_memory_used == {"GPU-a": 300} and result.gpu_memory_total == {"GPU-a": 1000}
    assert result.cpu_utilization == pytest.approx(0.3) and result.cpu_memory_used == 30
    assert result.csv_cells()[:2] == ["GPU-a:0.600;", "GPU-a:150.0;"]
    assert metrics_url("", "10.0.0.2:8000") == "http://10.0.0.2:8002/metrics"
    assert metrics_url("h:9/m", "x") == "http://h:9/m"


def test_sequence_and_metrics_flags_parse():
    import argparse

    from naiad.tools.perf.options import add_perf_flags, options_from_args

    parser = argparse.ArgumentParser()
    add_perf_flags(parser)
    o = options_from_args(parser.parse_args(
        ["-m", "acc", "--sequence-length", "7", "--sequence-length-variation", "0", "--sequence-id-range", "10:20",
         "--num-of-sequences", "3", "--serial-sequences", "--collect-metrics", "--metrics-interval", "250",
         "--input-data", "a.json", "--input-data", "b.json"]))
    assert (o.sequence_length, o.sequence_length_variation, o.sequence_id_range) == (7, 0, (10, 20))
    assert o.num_of_sequences == 3 and o.serial_sequences and o.collect_metrics and o.metrics_interval_ms == 250
    assert o.input_data == ["a.json", "b.json"]
    assert options_from_args(parser.parse_args(["-m", "x", "--sequence-id-range", "5"])).sequence_id_range == (5, 0)
    with pytest.raises(SystemExit):
        parser.parse_args(["-m", "x", "--sequence-id-range", "9:3"])
    with pytest.raises(SystemExit, match="CUDA GPU"):
        options_from_args(parser.parse_args(["-m", "x", "--shared-memory", "cuda"]))
