"""Unit tests of the gRPC infer codec and parameter decoding (no server)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import serialize_byte_tensor

from naiad.frontends.grpc.infer_codec import (
    SHM_DISABLED_MESSAGE,
    array_from_contents,
    decode_infer_request,
    encode_infer_response,
)
from naiad.frontends.grpc.params import (
    RESERVED_PREFIX_MESSAGE,
    empty_final_response_flag,
)
from naiad.protocol.errors import ErrorCode, NaiadError
from naiad.protocol.types import InferenceResponse, OutputTensor, SharedMemoryRef

NUMERIC = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
TYPED_FIELD = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


def _request(*inputs: pb.ModelInferRequest.InferInputTensor, raw: list[bytes] | None = None) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(model_name="m", inputs=list(inputs), raw_input_contents=raw or [])


def _tensor(name: str, datatype: str, shape: list[int]) -> pb.ModelInferRequest.InferInputTensor:
    return pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape)


def _sample(datatype: str) -> np.ndarray:
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    dtype = np.dtype(NUMERIC[datatype])
    values = np.arange(6).reshape(2, 3)
    if dtype.kind == "i":
        values = values - 3
    return values.astype(dtype)


def _error(fn, *args, **kwargs) -> NaiadError:
    with pytest.raises(NaiadError) as info:
        fn(*args, **kwargs)
    return info.value


@pytest.mark.parametrize("datatype", sorted(NUMERIC))
def test_raw_input_every_numeric_datatype(datatype: str) -> None:
    array = _sample(datatype)
    request = _request(_tensor("X", datatype, [2, 3]), raw=[array.astype(array.dtype.newbyteorder("<")).tobytes()])
    decoded = decode_infer_request(request, None)
    (inp,) = decoded.inputs
    assert inp.name == "X" and inp.datatype == datatype and inp.shape == (2, 3)
    np.testing.assert_array_equal(inp.data, array)
    assert inp.data.dtype == array.dtype


def test_raw_bf16_keeps_words() -> None:
    words = np.array([0x3F80, 0x4000], dtype=np.uint16)  # 1.0, 2.0 in bfloat16
    decoded = decode_infer_request(_request(_tensor("X", "BF16", [2]), raw=[words.tobytes()]), None)
    np.testing.assert_array_equal(decoded.inputs[0].data, words)


def test_raw_bytes_input() -> None:
    array = np.array([b"a", b"", "\u00e9t\u00e9".encode()], dtype=np.object_)
    raw = serialize_byte_tensor(array).item()
    decoded = decode_infer_request(_request(_tensor("S", "BYTES", [3]), raw=[raw]), None)
    assert list(decoded.inputs[0].data) == [b"a", b"", "\u00e9t\u00e9".encode()]


@pytest.mark.parametrize("datatype", sorted(TYPED_FIELD))
def test_typed_contents_every_datatype(datatype: str) -> None:
    array = _sample(datatype)
    tensor = _tensor("X", datatype, [2, 3])
    getattr(tensor.contents, TYPED_FIELD[datatype]).extend(array.ravel().tolist())
    decoded = decode_infer_request(_request(tensor), None)
    data = decoded.inputs[0].data
    assert data.dtype == np.dtype(NUMERIC[datatype])
    np.testing.assert_array_equal(data, array)


def test_typed_bytes_contents() -> None:
    tensor = _tensor("S", "BYTES", [2, 1])
    tensor.contents.bytes_contents.extend([b"x", b"yz"])
    data = decode_infer_request(_request(tensor), None).inputs[0].data
    assert data.shape == (2, 1) and data.dtype == np.object_
    assert data.ravel().tolist() == [b"x", b"yz"]


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_types_have_no_typed_field(datatype: str) -> None:
    tensor = _tensor("H", datatype, [2])
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    err = _error(decode_infer_request, _request(tensor), None)
    assert err.code is ErrorCode.INVALID_ARG
    assert err.message == (
        f"{datatype} data for input 'H' for model 'm' must be sent in raw_input_contents: "
        "InferTensorContents has no field for it"
    )


def test_empty_half_tensor_needs_no_data() -> None:
    decoded = decode_infer_request(_request(_tensor("H", "FP16", [0, 4])), None)
    assert decoded.inputs[0].data.shape == (0, 4) and decoded.inputs[0].data.dtype == np.float16


def test_mixing_raw_and_contents_is_refused() -> None:
    a = _tensor("A", "INT32", [1])
    b = _tensor("B", "INT32", [1])
    b.contents.int_contents.append(3)
    err = _error(decode_infer_request, _request(a, b, raw=[b"\0\0\0\0"]), None)
    assert err.code is ErrorCode.INVALID_ARG
    assert err.message == "contents field must not be specified when using raw_input_contents for 'B' for model 'm'"


@pytest.mark.parametrize("raw_count", [1, 3])
def test_raw_count_must_match_inputs(raw_count: int) -> None:
    request = _request(_tensor("A", "INT8", [1]), _tensor("B", "INT8", [1]), raw=[b"\1"] * raw_count)
    err = _error(decode_infer_request, request, None)
    assert err.code is ErrorCode.INVALID_ARG
    assert err.message == (
        "expected 2 raw_input_contents entries (one per input not in shared memory) "
        f"but got {raw_count} for model 'm'"
    )


def test_raw_size_must_match_shape() -> None:
    err = _error(decode_infer_request, _request(_tensor("A", "FP32", [2, 2]), raw=[b"\0" * 12]), None)
    assert err.code is ErrorCode.INVALID_ARG
    assert err.message == "unexpected total byte size 12 for input 'A', expecting 16"


def test_absurd_shape_is_refused_before_allocation() -> None:
    start = time.perf_counter()
    for datatype in ("FP32", "BYTES", "INT64"):
        err = _error(decode_infer_request, _request(_tensor("A", datatype, [2**31, 2**31, 2**20]), raw=[b"\0" * 8]), None)
        assert err.code is ErrorCode.INVALID_ARG
    tensor = _tensor("A", "INT32", [2**62, 2**62])
    tensor.contents.int_contents.append(1)
    err = _error(decode_infer_request, _request(tensor), None)
    assert "expecting 21267647932558653966460912964485513216" in err.message
    assert time.perf_counter() - start < 1.0


def test_too_many_dims_is_invalid_not_a_crash() -> None:
    err = _error(decode_infer_request, _request(_tensor("A", "INT8", [1] * 100), raw=[b"\1"]), None)
    assert err.code is ErrorCode.INVALID_ARG
    assert "invalid input tensor for model 'm'" in err.message


def test_negative_dim_and_bad_datatype() -> None:
    err = _error(decode_infer_request, _request(_tensor("A", "INT8", [-1]), raw=[b""]), None)
    assert err.code is ErrorCode.INVALID_ARG and "non-negative" in err.message
    err = _error(decode_infer_request, _request(_tensor("A", "FLOAT", [1]), raw=[b"\0"]), None)
    assert err.code is ErrorCode.INVALID_ARG
    assert err.message == "invalid datatype 'FLOAT' for input 'A'"


def test_contents_count_and_field_checks() -> None:
    tensor = _tensor("A", "INT32", [3])
    tensor.contents.int_contents.extend([1, 2])
    err = _error(decode_infer_request, _request(tensor), None)
    assert err.message == "unexpected number of elements 2 in contents of input 'A' for model 'm', expecting 3 for shape [3]"
    tensor = _tensor("A", "INT32", [1])
    tensor.contents.fp32_contents.append(1.0)
    err = _error(decode_infer_request, _request(tensor), None)
    assert err.message == "unexpected 'fp32_contents' in contents of input 'A' for model 'm': INT32 data goes in 'int_contents'"


def test_narrow_int_contents_range_checked() -> None:
    tensor = _tensor("A", "INT8", [2])
    tensor.contents.int_contents.extend([1, 300])
    err = _error(decode_infer_request, _request(tensor), None)
    assert err.code is ErrorCode.INVALID_ARG
    assert err.message == "value out of range for INT8 in contents of input 'A' for model 'm'"


def test_missing_data_counts_as_empty_contents() -> None:
    err = _error(array_from_contents, "FP32", (2,), pb.InferTensorContents(), "A", "m")
    assert err.message == "unexpected number of elements 0 in contents of input 'A' for model 'm', expecting 2 for shape [2]"


def _shm_tensor(name: str, datatype: str, shape: list[int], **params: object) -> pb.ModelInferRequest.InferInputTensor:
    tensor = _tensor(name, datatype, shape)
    for key, value in params.items():
        if isinstance(value, str):
            tensor.parameters[key].string_param = value
        else:
            tensor.parameters[key].int64_param = value
    return tensor


def test_shared_memory_input_is_a_reference_and_consumes_no_raw_entry() -> None:
    shm = _shm_tensor("A", "FP32", [4], shared_memory_region="r0", shared_memory_byte_size=16, shared_memory_offset=8)
    request = _request(shm, _tensor("B", "INT8", [1]), raw=[b"\7"])
    decoded = decode_infer_request(request, True)
    a = decoded.inputs[0]
    # The core reads the region (core/request_validation.py); the frontend passes the reference on.
    assert (a.name, a.datatype, a.shape, a.data, a.shared_memory) == ("A", "FP32", (4,), None, SharedMemoryRef("r0", 16, 8))
    assert a.parameters == {}
    assert decoded.inputs[1].data.tolist() == [7]


def test_shared_memory_errors() -> None:
    shm = _shm_tensor("A", "FP32", [4], shared_memory_region="r0", shared_memory_byte_size=16)
    err = _error(decode_infer_request, _request(shm), None)
    assert err.code is ErrorCode.UNSUPPORTED and err.message == SHM_DISABLED_MESSAGE
    no_size = _shm_tensor("A", "FP32", [4], shared_memory_region="r0")
    err = _error(decode_infer_request, _request(no_size), lambda *a: None)
    assert err.code is ErrorCode.INVALID_ARG
    assert err.message == (
        "input 'A' for model 'm' must specify both 'shared_memory_region' and 'shared_memory_byte_size' "
        "when using shared memory"
    )
    both = _shm_tensor("A", "FP32", [1], shared_memory_region="r0", shared_memory_byte_size=4)
    both.contents.fp32_contents.append(1.0)
    err = _error(decode_infer_request, _request(both), lambda *a: None)
    assert err.message == "contents field must not be specified when using shared memory for 'A' for model 'm'"
    negative = _shm_tensor("A", "FP32", [1], shared_memory_region="r0", shared_memory_byte_size=-4)
    err = _error(decode_infer_request, _request(negative), lambda *a: None)
    assert err.message == "'shared_memory_byte_size' of input 'A' must be a non-negative int64_param"


def test_requested_outputs() -> None:
    request = _request(_tensor("A", "INT8", [1]), raw=[b"\1"])
    plain = request.outputs.add(name="P")
    plain.parameters["binary_data"].bool_param = True
    cls = request.outputs.add(name="C")
    cls.parameters["classification"].int64_param = 3
    shm = request.outputs.add(name="S")
    shm.parameters["shared_memory_region"].string_param = "out"
    shm.parameters["shared_memory_byte_size"].int64_param = 64
    decoded = decode_infer_request(request, lambda *a: None)
    p, c, s = decoded.outputs
    assert (p.name, p.classification, p.shared_memory, p.parameters) == ("P", 0, None, {"binary_data": True})
    assert (c.name, c.classification, c.shared_memory) == ("C", 3, None)
    assert (s.name, s.shared_memory) == ("S", SharedMemoryRef("out", 64, 0))
    err = _error(decode_infer_request, request, None)
    assert err.code is ErrorCode.UNSUPPORTED
    shm.parameters["classification"].int64_param = 2
    err = _error(decode_infer_request, request, lambda *a: None)
    assert err.message == "output 'S' for model 'm' cannot use both classification and shared memory"


def test_request_parameters() -> None:
    request = _request(_tensor("A", "INT8", [1]), raw=[b"\1"])
    request.id = "r1"
    request.model_version = "2"
    request.parameters["sequence_id"].int64_param = 42
    request.parameters["sequence_start"].bool_param = True
    request.parameters["sequence_end"].bool_param = False
    request.parameters["priority"].uint64_param = 2
    request.parameters["timeout"].int64_param = 5000
    request.parameters["binary_data_output"].bool_param = True
    request.parameters["custom_s"].string_param = "v"
    request.parameters["custom_i"].int64_param = -3
    request.parameters["custom_d"].double_param = 0.5
    decoded = decode_infer_request(request, None)
    assert (decoded.id, decoded.model_version) == ("r1", "2")
    assert (decoded.sequence_id, decoded.sequence_start, decoded.sequence_end) == (42, True, False)
    assert (decoded.priority, decoded.timeout_us) == (2, 5000)
    assert decoded.parameters == {"custom_s": "v", "custom_i": -3, "custom_d": 0.5}
    request.parameters["sequence_id"].string_param = "corr-7"
    assert decode_infer_request(request, None).sequence_id == "corr-7"


@pytest.mark.parametrize(
    ("key", "setter", "message"),
    [
        ("sequence_id", "bool_param", "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."),
        ("sequence_start", "int64_param", "invalid value type for 'sequence_start' parameter, expected bool_param."),
        ("priority", "string_param", "invalid value type for 'priority' parameter, expected int64_param or uint64_param."),
        ("timeout", "double_param", "invalid value type for 'timeout' parameter, expected int64_param."),
        ("timeout", "uint64_param", "invalid value type for 'timeout' parameter, expected int64_param."),
        ("sequence_id", "uint64_param", "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."),
        ("priority", "int64_param", "invalid value for 'priority', expected value >= 0."),
        ("custom", "uint64_param", "invalid value type for 'custom' parameter, expected int64_param, bool_param, or string_param."),
        ("triton_anything", "bool_param", RESERVED_PREFIX_MESSAGE),
        ("triton_final_response", "bool_param", RESERVED_PREFIX_MESSAGE),
        ("triton_enable_empty_final_response", "int64_param",
         "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param."),
    ],
)
def test_bad_request_parameters(key: str, setter: str, message: str) -> None:
    request = _request(_tensor("A", "INT8", [1]), raw=[b"\1"])
    value = {"bool_param": True, "int64_param": 1, "string_param": "x", "double_param": 1.5, "uint64_param": 1}[setter]
    if (key, setter) == ("priority", "int64_param"):
        value = -1
    setattr(request.parameters[key], setter, value)
    err = _error(decode_infer_request, request, None)
    assert err.code is ErrorCode.INVALID_ARG and err.message == message


def test_reserved_prefix_message_is_tritons_grpc_text() -> None:
    assert RESERVED_PREFIX_MESSAGE == (
        "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys starting "
        "with 'triton_' are allowed: triton_enable_empty_final_response"
    )


def test_negative_sequence_id_and_timeout_read_as_triton_reads_them() -> None:
    request = _request(_tensor("A", "INT8", [1]), raw=[b"\1"])
    request.parameters["sequence_id"].int64_param = -1
    request.parameters["timeout"].int64_param = -5
    decoded = decode_infer_request(request, None)
    assert (decoded.sequence_id, decoded.timeout_us) == ((1 << 64) - 1, 0)


def test_empty_final_flag_allowed_on_unary_and_streams() -> None:
    request = _request(_tensor("A", "INT8", [1]), raw=[b"\1"])
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    decoded = decode_infer_request(request, None)
    assert decoded.parameters == {}
    assert empty_final_response_flag(request.parameters) is True
    request.parameters["triton_enable_empty_final_response"].int64_param = 1
    err = _error(empty_final_response_flag, request.parameters)
    assert err.message == "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param."
    assert empty_final_response_flag(pb.ModelInferRequest().parameters) is False


def test_encode_response_puts_every_output_in_raw_contents() -> None:
    big_endian = np.array([1, 2], dtype=">i4")
    response = InferenceResponse(
        model_name="m",
        model_version="3",
        id="abc",
        outputs=[
            OutputTensor("F", "FP32", (2, 2), np.arange(4, dtype=np.float32).reshape(2, 2)),
            OutputTensor("S", "BYTES", (2,), np.array([b"hi", "\u00fc"], dtype=np.object_)),
            OutputTensor("E", "INT32", (0,), np.zeros(0, dtype=np.int32)),
            OutputTensor("B", "INT32", (2,), big_endian),
            OutputTensor("H", "FP16", (1,), np.array([1.5], dtype=np.float16)),
            OutputTensor(
                "M", "FP32", (4,), None  # written to shared memory: no data, no parameters
            ),
        ],
        parameters={"flag": True, "n": 2**63 + 1, "x": 0.25, "s": "t"},
    )
    message = encode_infer_response(response)
    assert (message.model_name, message.model_version, message.id) == ("m", "3", "abc")
    assert [o.name for o in message.outputs] == ["F", "S", "E", "B", "H", "M"]
    assert [list(o.shape) for o in message.outputs] == [[2, 2], [2], [0], [2], [1], [4]]
    assert all(not o.HasField("contents") for o in message.outputs)
    raw = message.raw_output_contents
    assert len(raw) == 6
    assert raw[0] == np.arange(4, dtype="<f4").tobytes()
    assert raw[1] == b"\x02\x00\x00\x00hi\x02\x00\x00\x00\xc3\xbc"
    assert raw[2] == b""
    assert raw[3] == np.array([1, 2], dtype="<i4").tobytes()
    assert raw[4] == np.array([1.5], dtype="<f2").tobytes()
    assert raw[5] == b""
    assert len(message.outputs[5].parameters) == 0
    params = message.parameters
    assert params["flag"].bool_param is True
    assert params["n"].uint64_param == 2**63 + 1
    assert params["x"].double_param == 0.25
    assert params["s"].string_param == "t"
