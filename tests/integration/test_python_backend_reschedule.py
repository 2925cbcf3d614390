"""Request rescheduling (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) of Python models behind `naiad serve`."""

from __future__ import annotations

import json
import queue
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.test_python_backend_support import write_model
from tests.support.servers import client_error, start_server

# Default mode: IN = how many times the request is rescheduled before it is answered; OUT = executions seen,
# LOG = [flags, correlation id] of every execution of that request.
RESCHEDULE_N_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            key = (request.request_id(), str(request.correlation_id()))
            wanted = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)[0])
            log = self.seen.setdefault(key, [])
            log.append([request.flags(), str(request.correlation_id())])
            if len(log) <= wanted:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
                continue
            del self.seen[key]
            shape = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().shape
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.full(shape, len(log), dtype=np.int32)),
                pb_utils.Tensor("LOG", np.full(shape, json.dumps(log).encode(), dtype=object)),
            ]))
        return responses
"""

# Decoupled: one response per execution counting down from IN - 1; rescheduled until 0 is sent (FINAL).
COUNTDOWN_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.left = {}

    def execute(self, requests):
        for request in requests:
            key = (request.request_id(), str(request.correlation_id()))
            if key not in self.left:
                self.left[key] = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)[0])
            self.left[key] -= 1
            left = self.left[key]
            sender = request.get_response_sender()
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([left], dtype=np.int32))])
            if left > 0:
                sender.send(response)
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            else:
                del self.left[key]
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

WRONG_RETURN_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], dtype=np.int32))]))
        return responses
"""


def _config(scheduling: str, decoupled: bool = False, max_batch_size: int = 0, with_log: bool = True) -> str:
    outputs = '{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }'
    if with_log:
        outputs += ', { name: "LOG" data_type: TYPE_STRING dims: [ 1 ] }'
    policy = "model_transaction_policy { decoupled: true }" if decoupled else ""
    return f"""
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {outputs} ]
{scheduling}
{policy}
"""


ITERATIVE = "sequence_batching { iterative_sequence: true }"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repo = tmp_path_factory.mktemp("pyresched")
    write_model(repo, "iterative", _config(ITERATIVE), RESCHEDULE_N_PY)
    write_model(repo, "iterative_batched", _config(ITERATIVE, max_batch_size=4), RESCHEDULE_N_PY)
    write_model(repo, "iterative_countdown", _config(ITERATIVE, decoupled=True, with_log=False), COUNTDOWN_PY)
    write_model(repo, "plain_countdown", _config("", decoupled=True, with_log=False), COUNTDOWN_PY)
    write_model(repo, "plain_reschedule", _config(""), RESCHEDULE_N_PY)
    write_model(repo, "dynamic_reschedule", _config("dynamic_batching { }", max_batch_size=4), RESCHEDULE_N_PY)
    write_model(repo, "wrong_return", _config(ITERATIVE, with_log=False), WRONG_RETURN_PY)
    server = start_server(repo)
    try:
        yield server
    finally:
        server.stop()


def _http_infer(server, model: str, value: int, batched: bool = False, **kwargs):
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=30)
    array = np.array([[value]] if batched else [value], dtype=np.int32)
    tensor = httpclient.InferInput("IN", list(array.shape), "INT32")
    tensor.set_data_from_numpy(array)
    return client.infer(model, [tensor], **kwargs)


def _log(result) -> list:
    return json.loads(result.as_numpy("LOG").reshape(-1)[0])


def test_default_mode_request_rescheduled_n_times_then_answered(served):
    result = _http_infer(served, "iterative", 3)
    assert result.as_numpy("OUT").tolist() == [4]
    log = _log(result)
    # First execution starts the (internal) sequence; the rescheduled ones carry no flags, same correlation id.
    assert [flags for flags, _ in log] == [1, 0, 0, 0]
    assert len({cid for _, cid in log}) == 1 and log[0][1] != "0"


def test_explicit_correlation_id_is_kept(served):
    result = _http_infer(served, "iterative", 2, sequence_id=77, sequence_start=True)
    assert result.as_numpy("OUT").tolist() == [3]
    assert _log(result) == [[1, "77"], [0, "77"], [0, "77"]]


def test_concurrent_iterative_requests_interleave_in_batches(served):
    counts = [1, 5, 2, 7, 0, 3]
    with ThreadPoolExecutor(len(counts)) as pool:
        results = list(pool.map(lambda n: _http_infer(served, "iterative_batched", n, batched=True), counts))
    assert [r.as_numpy("OUT").tolist() for r in results] == [[[n + 1]] for n in counts]
    assert len({_log(r)[0][1] for r in results}) == len(counts)  # one internal sequence each


def _stream(server, model: str, value: int) -> list:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    received: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: received.put((result, error)))
    try:
        tensor = grpcclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
        client.async_stream_infer(model, [tensor], enable_empty_final_response=True)
        items = []
        while True:
            result, error = received.get(timeout=30)
            if error is not None:
                items.append(str(error))
                return items
            final = result.get_response().parameters["triton_final_response"].bool_param
            if result.as_numpy("OUT") is not None:
                items.append(int(result.as_numpy("OUT")[0]))
            if final:
                return items
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("model", ["iterative_countdown", "plain_countdown"])
def test_decoupled_request_rescheduled_until_final(served, model):
    assert _stream(served, model, 4) == [3, 2, 1, 0]


def test_default_scheduler_reschedules_too(served):
    assert _http_infer(served, "plain_reschedule", 2).as_numpy("OUT").tolist() == [3]


def test_dynamic_batcher_cannot_reschedule(served):
    error = client_error(_http_infer, served, "dynamic_reschedule", 2, batched=True)
    assert "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE" in str(error)
    # The model still serves requests that are not rescheduled.
    assert _http_infer(served, "dynamic_reschedule", 0, batched=True, request_id="fresh").as_numpy("OUT").tolist() == [[1]]


def test_rescheduled_request_must_get_none(served):
    error = client_error(_http_infer, served, "wrong_return", 1)
    assert "Expected a None object in the execute function return list for reschduled request" in str(error)
