"""triton_python_backend_utils outside a worker: tensors, dtypes, BYTES, ModelConfig, errors, responses, senders."""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest

import triton_python_backend_utils as pb_utils
from triton_python_backend_utils import _dlpack


def test_tensor_basics():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = pb_utils.Tensor("X", array)
    assert tensor.name() == "X" and tensor.shape() == [2, 3] and tensor.is_cpu()
    assert tensor.as_numpy() is array
    assert tensor.triton_dtype() == 11 and tensor.datatype() == "FP32"


def test_bytes_tensor_from_str_and_bytes():
    tensor = pb_utils.Tensor("S", np.array(["a", "é"], dtype=np.object_))
    assert tensor.datatype() == "BYTES" and tensor.triton_dtype() == 13
    assert pb_utils.Tensor("B", np.array([b"x\x00"], dtype=np.bytes_)).datatype() == "BYTES"
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.Tensor("C", np.array([1 + 2j]))


def test_dlpack_round_trip_numeric():
    tensor = pb_utils.Tensor("X", np.arange(4, dtype=np.int16))
    back = pb_utils.Tensor.from_dlpack("Y", tensor.to_dlpack())
    np.testing.assert_array_equal(back.as_numpy(), np.arange(4, dtype=np.int16))
    from_object = pb_utils.Tensor.from_dlpack("Z", np.ones(3, dtype=np.float64))
    assert from_object.datatype() == "FP64"
    np.testing.assert_array_equal(np.from_dlpack(tensor), np.arange(4, dtype=np.int16))
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.Tensor("B", np.array([b"x"], dtype=np.object_)).to_dlpack()


def test_bf16_through_dlpack():
    words = np.array([[0x3F80, 0x4000], [0xC040, 0x0000]], dtype=np.uint16)  # 1.0, 2.0, -3.0, 0.0
    tensor = pb_utils.Tensor._wrap("BF", words, "BF16")
    capsule = tensor.to_dlpack()
    assert _dlpack.capsule_dtype(capsule)[:2] == (4, 16)
    back = pb_utils.Tensor.from_dlpack("BF2", capsule)
    assert back.datatype() == "BF16" and back.triton_dtype() == 14 and back.shape() == [2, 2]
    with pytest.raises(pb_utils.TritonModelException):
        back.as_numpy()
    unused = tensor.to_dlpack()
    del unused
    gc.collect()
    assert _dlpack._exports == {}


def test_type_conversions():
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.triton_to_numpy_type(8) is np.int32 and pb_utils.triton_to_numpy_type(13) is np.object_
    assert pb_utils.numpy_to_triton_type(np.float16) == 10
    assert pb_utils.numpy_to_triton_type(np.object_) == 13 and pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.numpy_to_triton_type(np.bool_) == 1


def test_serialize_and_deserialize_bytes():
    data = np.array([b"ab", "ç", b""], dtype=np.object_)
    encoded = pb_utils.serialize_byte_tensor(data)
    assert encoded == b"\x02\x00\x00\x00ab\x02\x00\x00\x00\xc3\xa7\x00\x00\x00\x00"
    decoded = pb_utils.deserialize_bytes_tensor(encoded)
    assert list(decoded) == [b"ab", "ç".encode(), b""] and decoded.dtype == np.object_
    assert pb_utils.serialize_byte_tensor(np.array([], dtype=np.object_)) == ()
    assert pb_utils.serialize_byte_tensor(np.array([1.0])) is None


def test_model_config_rules():
    config = pb_utils.ModelConfig(json.dumps({"name": "m", "max_batch_size": 8, "input": [
        {"name": "A", "data_type": "TYPE_FP32", "dims": [4]}], "output": []}))
    config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_input({"name": "B", "data_type": "TYPE_INT32", "dims": [-1], "optional": True})
    config.add_output({"name": "C", "data_type": "TYPE_FP32", "dims": [4]})
    with pytest.raises(ValueError, match="configuration expects datatype TYPE_FP32"):
        config.add_input({"name": "A", "data_type": "TYPE_INT8", "dims": [4]})
    with pytest.raises(ValueError, match="the model expects dims"):
        config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [5]})
    with pytest.raises(ValueError, match="missing 'dims'"):
        config.add_output({"name": "D", "data_type": "TYPE_FP32"})
    with pytest.raises(ValueError, match="max_batch_size 8"):
        config.set_max_batch_size(4)
    config.set_max_batch_size(16)
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": True})
    with pytest.raises(ValueError, match="decoupled"):
        config.set_model_transaction_policy({"decoupled": False})
    as_dict = config.as_dict()
    assert as_dict["max_batch_size"] == 16 and "dynamic_batching" in as_dict
    assert [i["name"] for i in as_dict["input"]] == ["A", "B"] and as_dict["output"][0]["name"] == "C"
    assert pb_utils.using_decoupled_model_transaction_policy(as_dict)
    assert pb_utils.get_input_config_by_name(as_dict, "B")["optional"] is True
    assert pb_utils.get_output_config_by_name(as_dict, "nope") is None
    sequence = pb_utils.ModelConfig({"name": "s", "sequence_batching": {}})
    with pytest.raises(ValueError, match="sequence_batching"):
        sequence.set_dynamic_batching()


def test_errors_and_responses():
    error = pb_utils.TritonError("nope", pb_utils.TritonError.NOT_FOUND)
    assert error.message() == "nope" and error.code() == 2
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL
    response = pb_utils.InferenceResponse(error=error, parameters={"a": 1})
    assert response.has_error() and response.error() is error and json.loads(response.parameters()) == {"a": 1}
    ok = pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.zeros(1))])
    assert not ok.has_error() and pb_utils.get_output_tensor_by_name(ok, "Y") is not None
    assert pb_utils.get_output_tensor_by_name(ok, "Z") is None
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse(["not a tensor"])
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse(parameters={"a": [1]})
    assert issubclass(pb_utils.TritonModelException, Exception)


def test_bls_request_outside_worker_fails_clearly():
    request = pb_utils.InferenceRequest(model_name="m", inputs=[pb_utils.Tensor("X", np.zeros(1))],
                                        requested_output_names=["Y"], parameters={"k": "v"})
    assert json.loads(request.parameters()) == {"k": "v"} and request.model_version() == -1
    assert pb_utils.get_input_tensor_by_name(request, "X") is not None and not request.is_cancelled()
    with pytest.raises(pb_utils.TritonModelException, match="only works inside"):
        request.exec()
    with pytest.raises(pb_utils.TritonModelException):
        request.get_response_sender()
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceRequest(inputs=[], requested_output_names=[])


class _FakeRuntime:
    def __init__(self, decoupled: bool) -> None:
        self.decoupled = decoupled
        self.sent: list = []

    def send_response(self, handle, requested, response, final):
        self.sent.append((handle, response, final))

    def is_cancelled(self, handle):
        return handle == (1, 0)


def _received(runtime) -> pb_utils.InferenceRequest:
    return pb_utils.InferenceRequest._received(runtime, (1, 0), [], ("Y",), "id", 0, 0, "{}", 0, "m", 1)


def test_received_request_has_cpu_preferred_memory_and_a_trace():
    request = _received(_FakeRuntime(decoupled=False))
    memory = request.preferred_memory()
    assert memory.preferred_memory_type == pb_utils.TRITONSERVER_MEMORY_CPU and memory.preferred_device_id == 0
    assert request.preferred_memory() is memory  # one object per request, kept across calls
    assert isinstance(request.trace(), pb_utils.InferenceTrace) and request.trace() is request.trace()


def test_tensor_datatype_of_native_and_swapped_byte_order():
    for dtype, name in ((np.float32, "FP32"), (np.int64, "INT64"), (np.bool_, "BOOL"), (np.uint16, "UINT16")):
        native = np.zeros(2, dtype)
        assert pb_utils.Tensor("N", native).datatype() == name
        swapped = pb_utils.Tensor("S", native.astype(native.dtype.newbyteorder("S")))
        assert swapped.datatype() == name and swapped.as_numpy().dtype.isnative


def test_decoupled_sender_final_rules():
    runtime = _FakeRuntime(decoupled=True)
    sender = _received(runtime).get_response_sender()
    sender.send(pb_utils.InferenceResponse())
    sender.send(pb_utils.InferenceResponse())
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    with pytest.raises(pb_utils.TritonModelException, match="Response sender has been closed"):
        sender.send(pb_utils.InferenceResponse())
    assert [final for _, _, final in runtime.sent] == [False, False, True]
    assert sender.is_cancelled()
    with pytest.raises(pb_utils.TritonModelException, match="must be provided"):
        _received(runtime).get_response_sender().send()


def test_default_mode_sender_allows_one_response():
    runtime = _FakeRuntime(decoupled=False)
    sender = _received(runtime).get_response_sender()
    sender.send(pb_utils.InferenceResponse(), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert runtime.sent[-1][2] is True
    other = _received(runtime).get_response_sender()
    other.send(pb_utils.InferenceResponse())
    with pytest.raises(pb_utils.TritonModelException, match="more than one response"):
        other.send(pb_utils.InferenceResponse())


def test_logger_and_metrics_outside_worker(caplog):
    with caplog.at_level("INFO", logger="triton_python_backend_utils"):
        pb_utils.Logger.log_info("hello")
        pb_utils.Logger.log("warned", pb_utils.Logger.WARNING)
    assert "hello" in caplog.text and "warned" in caplog.text
    counter = pb_utils.MetricFamily("test_counter_total", "a counter", pb_utils.MetricFamily.COUNTER).Metric({"k": "v"})
    counter.increment(2)
    counter.increment(3)
    assert counter.value() == 5
    with pytest.raises(pb_utils.TritonModelException):
        counter.increment(-1)
    gauge = pb_utils.MetricFamily("test_gauge", "a gauge", pb_utils.MetricFamily.GAUGE).Metric()
    gauge.set(7.5)
    assert gauge.value() == 7.5
    histogram = pb_utils.MetricFamily("test_hist", "h", pb_utils.MetricFamily.HISTOGRAM).Metric(buckets=[1, 10])
    for value in (0.5, 5, 50):
        histogram.observe(value)
    assert histogram.value() == {"sum": 55.5, "count": 3, "buckets": [1, 1, 1]}
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.MetricFamily("bad name", "x", pb_utils.MetricFamily.GAUGE)


def test_constants():
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START == 1 and pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END == 2
    assert pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1
    assert pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL == 1 and pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE == 2
    memory = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)
    assert memory.preferred_memory_type == pb_utils.TRITONSERVER_MEMORY_CPU
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.load_model("m")
