"""Triton semantics the core keeps for Python models: error responses, missing outputs, mid-stream errors."""

import queue
import textwrap
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.servers import start_server

ERRORS = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            if x[0] < 0:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative input", pb_utils.TritonError.INVALID_ARG)))
            elif x[0] == 0:
                raise ValueError("zero is not allowed")
            else:
                # only Y: Z is declared but not produced; Y as float64 although the config says FP32
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x.astype(np.float64) * 2)]))
        return out
'''

REPEAT = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(r, "N").as_numpy()[0])
            for i in range(n):
                if i == 1:
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("bad step 1")))
                else:
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


def _model(repo, name, source, config):
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(source))
    (repo / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    _model(repo, "errors", ERRORS, 'backend: "python"\nmax_batch_size: 0\n'
           'input [{ name: "X" data_type: TYPE_FP32 dims: [1] }]\n'
           'output [{ name: "Y" data_type: TYPE_FP32 dims: [1] }, { name: "Z" data_type: TYPE_FP32 dims: [1] }]\n')
    _model(repo, "repeat", REPEAT, 'backend: "python"\nmax_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n'
           'input [{ name: "N" data_type: TYPE_INT32 dims: [1] }]\noutput [{ name: "OUT" data_type: TYPE_INT32 dims: [1] }]\n')
    with start_server(repo) as running:
        yield running


def _x(value):
    inp = httpclient.InferInput("X", [1], "FP32")
    inp.set_data_from_numpy(np.array([value], np.float32))
    return [inp]


def test_error_response_vs_exception_in_statistics(server):
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException) as err:
        client.infer("errors", _x(-1.0))
    assert err.value.status() == "400" and "negative input" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.infer("errors", _x(0.0))
    assert err.value.status() == "500" and "zero is not allowed" in err.value.message()
    stats = client.get_inference_statistics("errors")["model_stats"][0]["inference_stats"]
    assert stats["success"]["count"] == 1 and stats["fail"]["count"] == 1  # as Triton counts them


def test_missing_outputs_are_left_out_and_real_dtype_kept(server):
    client = httpclient.InferenceServerClient(server.http_url)
    result = client.infer("errors", _x(2.0))
    response = result.get_response()
    assert [o["name"] for o in response["outputs"]] == ["Y"]
    assert response["outputs"][0]["datatype"] == "FP64" and result.as_numpy("Y").tolist() == [4.0]


def test_error_in_the_middle_of_a_stream_keeps_it_going(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    inp = grpcclient.InferInput("N", [1], "INT32")
    inp.set_data_from_numpy(np.array([3], np.int32))
    client.async_stream_infer("repeat", [inp], enable_empty_final_response=True)
    received = [results.get(timeout=30) for _ in range(4)]
    client.stop_stream()
    values = [r.as_numpy("OUT").tolist() if e is None and r.as_numpy("OUT") is not None else ("error", str(e)) for r, e in received]
    assert values[0] == [0] and values[1][0] == "error" and "bad step 1" in values[1][1] and values[2] == [2]
    final_result, final_error = received[3]
    assert final_error is None and final_result.get_response().parameters["triton_final_response"].bool_param


METRICS = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        family = pb_utils.MetricFamily(name="requests_seen", description="requests this model saw",
                                       kind=pb_utils.MetricFamily.COUNTER)
        self.counter = family.Metric(labels={"model": args["model_name"]})
        hist = pb_utils.MetricFamily(name="input_value", description="input values", kind=pb_utils.MetricFamily.HISTOGRAM)
        self.hist = hist.Metric(labels={}, buckets=[1.0, 10.0])

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            self.counter.increment(1)
            self.hist.observe(float(x[0]))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return out
'''


def test_custom_metrics_reach_the_metrics_endpoint(tmp_path):
    _model(tmp_path, "counted", METRICS, 'backend: "python"\nmax_batch_size: 0\n'
           'input [{ name: "X" data_type: TYPE_FP32 dims: [1] }]\noutput [{ name: "Y" data_type: TYPE_FP32 dims: [1] }]\n')
    with start_server(tmp_path) as srv:
        client = httpclient.InferenceServerClient(srv.http_url)
        for value in (0.5, 5.0, 50.0):
            client.infer("counted", _x(value))
        text = urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10).read().decode()
    assert "# TYPE requests_seen counter" in text and 'requests_seen{model="counted"} 3' in text
    assert 'input_value_bucket{le="1.0"} 1' in text and 'input_value_bucket{le="+Inf"} 3' in text
    assert "input_value_count 3" in text
