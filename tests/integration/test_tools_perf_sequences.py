"""`naiad perf` on a sequence-batched model: ids, start/end flags, lengths, JSON data streams, id ranges."""

import json
import os

import numpy as np
import pytest
import tritonclient.http as httpclient

from naiad.tools.perf import PerfError, PerfOptions, run_perf
from tests.support.onnx_models import accumulator_model
from tests.support.servers import client_error, start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    accumulator_model(repo, "acc", idle_us=60_000_000)  # an unended sequence would stay open for the whole test
    with start_server(repo) as running:
        yield running


def quiet(**kwargs) -> PerfOptions:
    defaults = dict(model="acc", measurement_interval_ms=200, stability_percentage=100, max_trials=3, progress="off")
    defaults.update(kwargs)
    return PerfOptions(**defaults)


def continue_sequence(server, sequence_id: int) -> None:
    """A request without START for an id perf used: refused only if perf ended that sequence."""
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("INPUT", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 1), np.float32))
    try:
        error = client_error(client.infer, "acc", [tensor], sequence_id=sequence_id)
    finally:
        client.close()
    assert "START" in str(error)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_concurrency_mode_plays_whole_sequences(server, protocol):
    url = server.http_url if protocol == "http" else server.grpc_url
    with open(os.devnull, "w") as sink:
        result = run_perf(quiet(url=url, protocol=protocol, concurrency_range=(2, 2, 1), sequence_length=5,
                                sequence_length_variation=0, sequence_id_range=(100, 104)), out=sink)
    # every request was accepted by the sequence batcher (a missing START fails the run) and counted
    assert result.levels[0].measurement.count > 0
    assert result.client_completed == result.server_delta.success_count
    for sequence_id in range(100, 104):  # every sequence the run opened was also ended
        continue_sequence(server, sequence_id)


def test_json_streams_in_request_rate_mode(server, tmp_path):
    data = tmp_path / "streams.json"
    data.write_text(json.dumps({"data": [[{"INPUT": [1]}, {"INPUT": [2]}, {"INPUT": [3]}], [{"INPUT": [4]}]]}))
    with open(os.devnull, "w") as sink:
        result = run_perf(quiet(url=server.grpc_url, protocol="grpc", request_rate_range=(100.0, 100.0, 1.0),
                                input_data=str(data), num_of_sequences=2, serial_sequences=True,
                                sequence_id_range=(500, 510)), out=sink)
    assert result.levels[0].measurement.count > 0
    assert result.client_completed == result.server_delta.success_count
    for sequence_id in range(500, 510):
        continue_sequence(server, sequence_id)


def test_id_range_smaller_than_the_load_is_refused(server):
    with pytest.raises(PerfError, match="sequence-id-range"):
        run_perf(quiet(url=server.http_url, concurrency_range=(4, 4, 1), sequence_id_range=(1, 3)),
                 out=open(os.devnull, "w"))
