"""The real `naiad serve` over gRPC: health, metadata, config, ModelInfer for every datatype, errors, hostile input."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from tests.support.onnx_models import ALL_DATATYPES, standard_repository
from tests.support.servers import RunningServer, start_server
from tests.support.servers import client_error as _client_error

NUMPY = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_,
}
TYPED_FIELD = {
    "BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = standard_repository(tmp_path_factory.mktemp("grpc_infer") / "models")
    with start_server(repo) as running:
        yield running


@pytest.fixture()
def client(grpc_client: grpcclient.InferenceServerClient) -> grpcclient.InferenceServerClient:
    return grpc_client


def _input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    inp = grpcclient.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return inp


def _rpc_error(call: Any, *args: Any, **kwargs: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return info.value


def _sample(datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([[b"alpha", b""], ["\u00fcber".encode(), b"\x00\x01"]], dtype=np.object_)
    if datatype == "BOOL":
        return np.array([[True, False], [False, True]])
    values = np.array([[1, 2], [3, 4]])
    if np.dtype(NUMPY[datatype]).kind == "i":
        values = -values
    return values.astype(NUMPY[datatype])


def _add_sub_inputs(a: np.ndarray, b: np.ndarray, datatype: str = "FP32") -> list[grpcclient.InferInput]:
    return [_input("INPUT0", a, datatype), _input("INPUT1", b, datatype)]


# ---------------------------------------------------------------- health, metadata, config


def test_health_and_server_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() is True
    assert client.is_server_ready() is True
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "triton"
    assert "model_repository" in meta["extensions"] and "classification" in meta["extensions"]


def test_model_ready_and_unknown_models(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_model_ready("add_sub") is True
    assert client.is_model_ready("add_sub", "1") is True
    # Triton 2.51 answers ModelReady for unknown models and versions with OK and ready=false
    assert client.is_model_ready("nope") is False
    assert client.is_model_ready("add_sub", "7") is False
    err = _client_error(client.get_model_metadata, "add_sub", "7")
    assert err.status() == "StatusCode.NOT_FOUND"
    assert err.message() == "Request for unknown model: 'add_sub' version 7 is not found"


def test_model_metadata(client: grpcclient.InferenceServerClient) -> None:
    meta = client.get_model_metadata("add_sub")
    assert (meta.name, list(meta.versions), meta.platform) == ("add_sub", ["1"], "onnxruntime_onnx")
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("INPUT0", "FP32", [-1, 16]), ("INPUT1", "FP32", [-1, 16])
    ]
    nobatch = client.get_model_metadata("add_sub_nobatch")
    assert [list(t.shape) for t in nobatch.outputs] == [[4], [4]]
    err = _client_error(client.get_model_metadata, "nope")
    assert err.status() == "StatusCode.NOT_FOUND"


def test_model_config_is_effective_config(client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config("add_sub", as_json=True)["config"]
    assert config["name"] == "add_sub"
    assert config["max_batch_size"] == 8
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    auto = client.get_model_config("add_sub_auto").config
    assert auto.name == "add_sub_auto"
    assert {i.name for i in auto.input} == {"INPUT0", "INPUT1"}
    err = _client_error(client.get_model_config, "nope")
    assert err.status() == "StatusCode.NOT_FOUND"
    assert err.message() == "Request for unknown model: 'nope' is not found"


def test_statistics_count_requests(client: grpcclient.InferenceServerClient) -> None:
    def successes() -> int:
        (stats,) = client.get_inference_statistics("add_sub_int32").model_stats
        return stats.inference_stats.success.count

    before = successes()
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    for _ in range(3):
        client.infer("add_sub_int32", _add_sub_inputs(a, a, "INT32"))
    assert successes() == before + 3
    everything = client.get_inference_statistics(as_json=True)
    assert "add_sub" in {m["name"] for m in everything["model_stats"]}
    err = _client_error(client.get_inference_statistics, "nope")
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert err.message() == "requested model 'nope' is not available"


def test_repository_index_and_load_refused_outside_explicit(client: grpcclient.InferenceServerClient,
                                                            stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
    assert index["add_sub"] == {"name": "add_sub", "version": "1", "state": "READY"}
    err = _rpc_error(stub.RepositoryIndex, pb.RepositoryIndexRequest(repository_name="elsewhere"))
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED
    assert err.details() == "'repository_name' specification is not supported"
    err = _client_error(client.load_model, "add_sub")
    assert err.status() == "StatusCode.UNAVAILABLE"
    assert err.message() == "explicit model load / unload is not allowed if polling is enabled"
    err = _client_error(client.unload_model, "add_sub")
    assert err.status() == "StatusCode.UNAVAILABLE"


# ---------------------------------------------------------------- ModelInfer


def test_add_sub(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.full((2, 16), 0.5, dtype=np.float32)
    result = client.infer("add_sub", _add_sub_inputs(a, b), request_id="add-1")
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == ("add-1", "add_sub", "1")
    assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert len(response.raw_output_contents) == 2
    assert all(not o.HasField("contents") for o in response.outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_requested_output_subset(client: grpcclient.InferenceServerClient) -> None:
    a = np.ones((1, 16), dtype=np.float32)
    result = client.infer("add_sub", _add_sub_inputs(a, a), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 16), np.float32))


@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_identity_raw_every_datatype(client: grpcclient.InferenceServerClient, datatype: str) -> None:
    array = _sample(datatype)
    result = client.infer(f"identity_{datatype.lower()}", [_input("INPUT0", array, datatype)])
    out = result.as_numpy("OUTPUT0")
    assert result.get_output("OUTPUT0").datatype == datatype
    assert list(result.get_output("OUTPUT0").shape) == [2, 2]
    if datatype == "BYTES":
        assert out.tolist() == array.tolist()
    else:
        assert out.dtype == array.dtype
        np.testing.assert_array_equal(out, array)


@pytest.mark.parametrize("datatype", [d for d in ALL_DATATYPES if d != "FP16"])
def test_identity_typed_contents_every_datatype(stub: pb_grpc.GRPCInferenceServiceStub, datatype: str) -> None:
    array = _sample(datatype)
    request = pb.ModelInferRequest(model_name=f"identity_{datatype.lower()}", id=f"typed-{datatype}")
    tensor = request.inputs.add(name="INPUT0", datatype=datatype, shape=[2, 2])
    getattr(tensor.contents, TYPED_FIELD[datatype]).extend(array.ravel().tolist())
    response = stub.ModelInfer(request)
    assert response.id == f"typed-{datatype}"
    assert len(response.raw_output_contents) == 1
    assert not response.outputs[0].HasField("contents")
    result = grpcclient.InferResult(response)
    out = result.as_numpy("OUTPUT0")
    if datatype == "BYTES":
        assert out.tolist() == array.tolist()
    else:
        np.testing.assert_array_equal(out, array)


def test_fp16_typed_contents_refused(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    request = pb.ModelInferRequest(model_name="identity_fp16")
    request.inputs.add(name="INPUT0", datatype="FP16", shape=[1, 1]).contents.fp32_contents.append(1.0)
    err = _rpc_error(stub.ModelInfer, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == (
        "FP16 data for input 'INPUT0' for model 'identity_fp16' must be sent in raw_input_contents: "
        "InferTensorContents has no field for it"
    )


def test_classification(client: grpcclient.InferenceServerClient) -> None:
    x = np.array([[0.1, 0.2, 0.3, 0.4], [1.0, -1.0, 0.5, 2.0]], dtype=np.float32)
    plain = client.infer("classifier", [_input("INPUT", x, "FP32")]).as_numpy("PROBS")
    result = client.infer(
        "classifier", [_input("INPUT", x, "FP32")], outputs=[grpcclient.InferRequestedOutput("PROBS", class_count=2)]
    )
    assert result.get_output("PROBS").datatype == "BYTES"
    classes = result.as_numpy("PROBS")
    assert classes.shape == (2, 2)
    for row, probs in zip(classes, plain):
        top = np.argsort(-probs)[:2]
        assert [int(item.decode().split(":")[1]) for item in row] == top.tolist()
        assert [item.decode().split(":")[2] for item in row] == [f"class_{i}" for i in top]


def test_request_parameters_and_reserved_keys(client: grpcclient.InferenceServerClient,
                                              stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    a = np.ones((1, 16), dtype=np.float32)
    result = client.infer("add_sub", _add_sub_inputs(a, a), priority=1, timeout=10_000_000,
                          parameters={"custom": "value", "n": 3, "f": 0.5, "b": True})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    request = pb.ModelInferRequest(model_name="add_sub", raw_input_contents=[a.tobytes(), a.tobytes()])
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
    request.parameters["triton_secret"].bool_param = True
    err = _rpc_error(stub.ModelInfer, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == (
        "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys "
        "starting with 'triton_' are allowed: triton_enable_empty_final_response"
    )
    del request.parameters["triton_secret"]
    request.parameters["sequence_start"].string_param = "yes"
    err = _rpc_error(stub.ModelInfer, request)
    assert err.details() == "invalid value type for 'sequence_start' parameter, expected bool_param."


def test_unary_infer_accepts_the_empty_final_response_flag(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """perf_analyzer sends `triton_enable_empty_final_response` on every ModelInfer; Triton 2.51 answers it."""
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    request = pb.ModelInferRequest(model_name="add_sub", raw_input_contents=[a.tobytes(), a.tobytes()])
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
    for flag in (True, False):
        request.parameters["triton_enable_empty_final_response"].bool_param = flag
        response = stub.ModelInfer(request)
        outputs = {o.name: np.frombuffer(raw, dtype=np.float32) for o, raw in zip(response.outputs, response.raw_output_contents)}
        np.testing.assert_array_equal(outputs["OUTPUT0"], (a + a).ravel())
        assert "triton_final_response" not in response.parameters
    request.parameters["triton_enable_empty_final_response"].string_param = "true"
    err = _rpc_error(stub.ModelInfer, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param."


BAD_VERSION = "failed to get model version from specified version string '{}' (details: stol), version should be an integral value > 0"


@pytest.mark.parametrize(("version", "message"), [
    ("wrong_specification", BAD_VERSION.format("wrong_specification")),
    ("99999999999999999999", BAD_VERSION.format("99999999999999999999")),
    ("-1", "invalid model version specified '-1' , version should be an integral value > 0"),
])
def test_bad_version_string_gets_tritons_text(stub: pb_grpc.GRPCInferenceServiceStub, version: str, message: str) -> None:
    """Triton's grpc_explicit_int8_content_client.py matches this text; every per-model RPC gives it."""
    a = np.ones((1, 16), dtype=np.float32)
    request = pb.ModelInferRequest(model_name="add_sub", model_version=version, raw_input_contents=[a.tobytes(), a.tobytes()])
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
    calls = [
        lambda: stub.ModelInfer(request),
        lambda: stub.ModelMetadata(pb.ModelMetadataRequest(name="add_sub", version=version)),
        lambda: stub.ModelConfig(pb.ModelConfigRequest(name="add_sub", version=version)),
        lambda: stub.ModelReady(pb.ModelReadyRequest(name="add_sub", version=version)),
        lambda: stub.ModelStatistics(pb.ModelStatisticsRequest(name="add_sub", version=version)),
        lambda: stub.ModelInfer(pb.ModelInferRequest(model_name="no_such_model", model_version=version)),
    ]
    for call in calls:
        err = _rpc_error(call)
        assert (err.code(), err.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)
    request.model_version = "1x"  # Triton reads the leading integer, like C's stol
    assert len(stub.ModelInfer(request).outputs) == 2


def test_core_validation_errors(client: grpcclient.InferenceServerClient) -> None:
    a = np.ones((1, 8), dtype=np.float32)
    err = _client_error(client.infer, "add_sub", _add_sub_inputs(a, a), request_id="v1")
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert err.message().startswith(
        "[request id: v1] unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [-1,16], got [1,8]."
    )
    i = np.ones((1, 16), dtype=np.int32)
    err = _client_error(client.infer, "add_sub", _add_sub_inputs(i, i, "INT32"))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert err.message() == (
        "[request id: <id_unknown>] inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'"
    )
    f = np.ones((1, 16), dtype=np.float32)
    err = _client_error(client.infer, "add_sub", _add_sub_inputs(f, f), outputs=[grpcclient.InferRequestedOutput("NOPE")])
    assert err.message() == "unexpected inference output 'NOPE' for model 'add_sub'"
    big = np.ones((9, 16), dtype=np.float32)
    err = _client_error(client.infer, "add_sub", _add_sub_inputs(big, big))
    assert err.message() == "[request id: <id_unknown>] inference request batch-size must be <= 8 for 'add_sub'"
    err = _client_error(client.infer, "nope", _add_sub_inputs(f, f))
    assert err.status() == "StatusCode.NOT_FOUND"
    assert err.message() == "Request for unknown model: 'nope' is not found"


def test_mixing_raw_and_contents(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    a = np.ones((1, 16), dtype=np.float32)
    request = pb.ModelInferRequest(model_name="add_sub", raw_input_contents=[a.tobytes()])
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    typed = request.inputs.add(name="INPUT1", datatype="FP32", shape=[1, 16])
    typed.contents.fp32_contents.extend([1.0] * 16)
    err = _rpc_error(stub.ModelInfer, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == (
        "contents field must not be specified when using raw_input_contents for 'INPUT1' for model 'add_sub'"
    )


def test_large_tensor_above_default_grpc_limit(client: grpcclient.InferenceServerClient) -> None:
    array = np.arange(3 * 1024 * 1024, dtype=np.float32).reshape(3, -1)  # 12 MiB each way
    result = client.infer("identity_fp32", [_input("INPUT0", array, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), array)


def test_concurrent_async_infers(client: grpcclient.InferenceServerClient) -> None:
    import queue

    done: queue.Queue[tuple[Any, Any]] = queue.Queue()
    for i in range(32):
        a = np.full((1, 16), i, dtype=np.float32)
        client.async_infer("add_sub", _add_sub_inputs(a, a), lambda result, error: done.put((result, error)),
                           request_id=str(i))
    results = [done.get(timeout=30) for _ in range(32)]
    assert all(error is None for _, error in results)
    for result, _ in results:
        i = int(result.get_response().id)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 2 * i, np.float32))


def _hostile() -> list[tuple[pb.ModelInferRequest, str]]:
    def req(raw: list[bytes], *tensors: tuple[str, str, list[int]], model: str = "add_sub") -> pb.ModelInferRequest:
        message = pb.ModelInferRequest(model_name=model, raw_input_contents=raw)
        for name, datatype, shape in tensors:
            message.inputs.add(name=name, datatype=datatype, shape=shape)
        return message

    ok = np.ones((1, 16), np.float32).tobytes()
    cases = [
        (req([b"\0" * 64, ok], ("INPUT0", "FP32", [2**31, 2**31]), ("INPUT1", "FP32", [1, 16])),
         "unexpected total byte size 64 for input 'INPUT0', expecting 18446744073709551616"),
        (req([b"\0" * 8], ("INPUT0", "BYTES", [2**60]), model="identity_bytes"),
         "unexpected number of string elements for input 'INPUT0'"),
        (req([b"\xff\xff\xff\x7fx"], ("INPUT0", "BYTES", [1, 1]), model="identity_bytes"),
         "element byte size 2147483647 for input 'INPUT0' exceeds the remaining 1 bytes"),
        (req([ok, ok], ("INPUT0", "FP33", [1, 16]), ("INPUT1", "FP32", [1, 16])), "invalid datatype 'FP33' for input 'INPUT0'"),
        (req([ok, ok], ("INPUT0", "FP32", [1, -16]), ("INPUT1", "FP32", [1, 16])), "must contain only non-negative integers"),
        (req([ok], ("INPUT0", "FP32", [1, 16]), ("INPUT1", "FP32", [1, 16])),
         "expected 2 raw_input_contents entries (one per input not in shared memory) but got 1 for model 'add_sub'"),
        (req([ok, ok, ok], ("INPUT0", "FP32", [1, 16]), ("INPUT1", "FP32", [1, 16])),
         "expected 2 raw_input_contents entries (one per input not in shared memory) but got 3 for model 'add_sub'"),
        (req([ok, ok], ("INPUT0", "FP32", [1] * 90 + [16]), ("INPUT1", "FP32", [1, 16])),
         "invalid input tensor for model 'add_sub'"),
        (req([ok[:-1], ok], ("INPUT0", "FP32", [1, 16]), ("INPUT1", "FP32", [1, 16])),
         "unexpected total byte size 63 for input 'INPUT0', expecting 64"),
    ]
    typed = req([], ("INPUT0", "INT32", [2**62, 2**62]), model="identity_int32")
    typed.inputs[0].contents.int_contents.extend([1, 2, 3])
    cases.append((typed, "unexpected number of elements 3 in contents of input 'INPUT0' for model 'identity_int32'"))
    return cases


def test_hostile_storm_then_good_request(client: grpcclient.InferenceServerClient,
                                         stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    for _ in range(10):
        for request, expected in _hostile():
            err = _rpc_error(stub.ModelInfer, request)
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, expected
            assert expected in err.details()
    a = np.ones((1, 16), dtype=np.float32)
    result = client.infer("add_sub", _add_sub_inputs(a, a))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    assert client.is_server_ready() is True


def test_garbage_bytes_do_not_hurt_the_server(server: RunningServer, client: grpcclient.InferenceServerClient) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for garbage in (b"\xff" * 32, b"\x0a\xff\xff\xff\xff\x0f", bytes(range(256))):
            err = _rpc_error(call, garbage)
            assert err.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNKNOWN)
        unknown = channel.unary_unary("/inference.GRPCInferenceService/NoSuchRpc")
        assert _rpc_error(unknown, b"").code() == grpc.StatusCode.UNIMPLEMENTED
    assert client.is_server_live() is True


def test_cuda_shared_memory_is_unsupported(client: grpcclient.InferenceServerClient) -> None:
    assert client.get_cuda_shared_memory_status(as_json=True) == {}
    err = _client_error(client.register_cuda_shared_memory, "c0", b"\0" * 64, 0, 1024)
    assert err.status() == "StatusCode.UNIMPLEMENTED"
    assert err.message() == "CUDA shared memory is not supported: this server has no CUDA device"


def test_log_and_trace_settings_over_grpc(client: grpcclient.InferenceServerClient) -> None:
    settings = client.get_log_settings(as_json=True)["settings"]
    assert settings["log_info"]["bool_param"] is True and settings["log_format"]["string_param"] == "default"
    updated = client.update_log_settings({"log_verbose_level": 1}, as_json=True)["settings"]
    assert updated["log_verbose_level"]["uint32_param"] == 1
    err = _client_error(client.update_log_settings, {"log_file": "/tmp/x"})
    assert err.status() == "StatusCode.UNIMPLEMENTED"
    trace = client.get_trace_settings(as_json=True)["settings"]
    assert trace["trace_level"]["value"] == ["OFF"] and trace["trace_rate"]["value"] == ["1000"]
    updated = client.update_trace_settings(model_name="add_sub", settings={"trace_rate": "7"}, as_json=True)["settings"]
    assert updated["trace_rate"]["value"] == ["7"]
    assert client.get_trace_settings(as_json=True)["settings"]["trace_rate"]["value"] == ["1000"]
    err = _client_error(client.update_trace_settings, settings={"trace_rate": "abc"})
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "Unable to parse 'trace_rate', got: abc" in err.message()


def test_standard_health_service_reports_serving(server: RunningServer) -> None:
    channel = grpc.insecure_channel(server.grpc_url)
    check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda b: b, response_deserializer=lambda b: b)
    assert check(b"", timeout=10) == b"\x08\x01"  # HealthCheckResponse{status: SERVING}
    channel.close()


def test_an_unknown_model_is_not_found_before_its_tensors_are_checked(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """As Triton 2.51 answers (probed): NOT_FOUND, not the tensors' INVALID_ARGUMENT."""
    for model, version, message in (("nope", "", "Request for unknown model: 'nope' is not found"),
                                    ("add_sub", "9", "Request for unknown model: 'add_sub' version 9 is not found")):
        request = pb.ModelInferRequest(model_name=model, model_version=version)
        request.inputs.add(name="INPUT0", datatype="FP99", shape=[1, 16])
        request.raw_input_contents.append(b"\0" * 10)
        err = _rpc_error(stub.ModelInfer, request)
        assert err.code() == grpc.StatusCode.NOT_FOUND and err.details() == message
