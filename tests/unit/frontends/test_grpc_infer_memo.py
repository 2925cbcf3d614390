"""Unit tests of InferDecoder and InferEncoder: what they remember gives exactly what the full codec gives."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from naiad.frontends.grpc import infer_memo
from naiad.frontends.grpc.infer_codec import decode_infer_request, encode_infer_response, raw_bytes
from naiad.frontends.grpc.infer_memo import MEMO_LIMIT, InferDecoder, InferEncoder
from naiad.protocol.errors import ErrorCode, NaiadError
from naiad.protocol.types import InferenceResponse, OutputTensor


def _request(a: np.ndarray, b: np.ndarray, model: str = "add_sub", request_id: str = "") -> pb.ModelInferRequest:
    tensors = [pb.ModelInferRequest.InferInputTensor(name=name, datatype="FP32", shape=list(arr.shape))
               for name, arr in (("INPUT0", a), ("INPUT1", b))]
    outputs = [pb.ModelInferRequest.InferRequestedOutputTensor(name=n) for n in ("OUTPUT0", "OUTPUT1")]
    return pb.ModelInferRequest(model_name=model, model_version="1", id=request_id, inputs=tensors, outputs=outputs,
                                raw_input_contents=[a.tobytes(), b.tobytes()])


def _same(decoded: object, expected: object) -> None:
    """Field by field, arrays by value, dtype and shape."""
    assert decoded.model_name == expected.model_name  # type: ignore[attr-defined]
    assert (decoded.model_version, decoded.id) == (expected.model_version, expected.id)  # type: ignore[attr-defined]
    assert decoded.outputs == expected.outputs  # type: ignore[attr-defined]
    assert decoded.parameters == expected.parameters  # type: ignore[attr-defined]
    for got, want in zip(decoded.inputs, expected.inputs, strict=True):  # type: ignore[attr-defined]
        assert (got.name, got.datatype, got.shape, got.parameters, got.shared_memory) == (
            want.name, want.datatype, want.shape, want.parameters, want.shared_memory)
        assert got.data.dtype == want.data.dtype and got.data.shape == want.data.shape
        np.testing.assert_array_equal(got.data, want.data)


def test_a_repeated_request_decodes_its_own_tensors() -> None:
    decoder = InferDecoder(allow_shared_memory=False)
    rng = np.random.default_rng(0)
    for i in range(3):  # the first is decoded in full; the others (with other ids) from the remembered layout
        a, b = rng.standard_normal((1, 16), np.float32), rng.standard_normal((1, 16), np.float32)
        request = _request(a, b, request_id=str(i))
        expected = decode_infer_request(request, False)
        decoded = decoder.decode(request)
        _same(decoded, expected)
        assert decoded.id == request.id == str(i)
        np.testing.assert_array_equal(decoded.inputs[0].data, a)
        np.testing.assert_array_equal(decoded.inputs[1].data, b)
    assert len(decoder._memo) == 1


def test_remembered_layout_with_wrong_tensor_bytes_gets_the_full_error() -> None:
    decoder = InferDecoder(allow_shared_memory=False)
    a = np.zeros((1, 16), np.float32)
    decoder.decode(_request(a, a))
    bad = _request(a, a)
    bad.raw_input_contents[1] = bytes(60)
    with pytest.raises(NaiadError) as full:
        decode_infer_request(bad, False)
    with pytest.raises(NaiadError) as caught:
        decoder.decode(bad)
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert caught.value.message == full.value.message
    missing = _request(a, a)
    del missing.raw_input_contents[1]
    with pytest.raises(NaiadError, match="raw_input_contents"):
        decoder.decode(missing)
    decoded = decoder.decode(_request(a + 1, a))  # and the layout still serves good requests
    np.testing.assert_array_equal(decoded.inputs[0].data, a + 1)


def test_requests_with_parameters_or_typed_contents_are_decoded_in_full() -> None:
    decoder = InferDecoder(allow_shared_memory=False)
    a = np.ones((1, 16), np.float32)
    for _ in range(2):
        request = _request(a, a)
        request.parameters["priority"].uint64_param = 3
        request.inputs[0].parameters["custom"].string_param = "x"
        decoded = decoder.decode(request)
        assert decoded.priority == 3
        assert decoded.inputs[0].parameters == {"custom": "x"}
    typed = pb.ModelInferRequest(model_name="m", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="IN", datatype="INT32", shape=[2], contents=pb.InferTensorContents(int_contents=[4, 5]))])
    for _ in range(2):
        np.testing.assert_array_equal(decoder.decode(typed).inputs[0].data, [4, 5])


def test_parameters_without_effect_on_a_unary_call_are_remembered_and_others_are_not() -> None:
    # perf_analyzer's requests carry triton_enable_empty_final_response; HTTP hints are ignored on gRPC
    decoder = InferDecoder(allow_shared_memory=False)
    rng = np.random.default_rng(3)
    zeros = np.zeros((1, 16), np.float32)

    def with_params(request: pb.ModelInferRequest, **kinds: tuple[str, object]) -> pb.ModelInferRequest:
        for key, (kind, value) in kinds.items():
            setattr(request.parameters[key], kind, value)
        return request

    # (one parameter each: protobuf writes a map's entries in no set order, so bytes of several may differ)
    for plain in (dict(triton_enable_empty_final_response=("bool_param", True)),
                  dict(binary_data_output=("bool_param", True))):
        first = with_params(_request(zeros, zeros), **plain).SerializeToString()
        decoder.decode(pb.ModelInferRequest.FromString(first), first)
        a, b = rng.standard_normal((1, 16), np.float32), rng.standard_normal((1, 16), np.float32)
        again = with_params(_request(a, b), **plain)
        decoded = decoder.decode_serialized(again.SerializeToString())
        assert decoded is not None
        _same(decoded, decode_infer_request(again, False))
        assert decoded.parameters == {} and decoded.priority == 0 and decoded.sequence_id == 0
        np.testing.assert_array_equal(decoded.inputs[1].data, b)
    # a parameter with an effect, or a custom one, is never remembered: each such request is decoded in full
    for kinds in (dict(priority=("uint64_param", 3)), dict(custom=("string_param", "x")),
                  dict(triton_enable_empty_final_response=("bool_param", True), sequence_id=("int64_param", 7))):
        message = with_params(_request(zeros, zeros), **kinds).SerializeToString()
        full = decoder.decode(pb.ModelInferRequest.FromString(message), message)
        assert decoder.decode_serialized(message) is None
        assert (full.priority, full.parameters.get("custom"), full.sequence_id) == (
            kinds.get("priority", (0, 0))[1], kinds.get("custom", (0, None))[1], kinds.get("sequence_id", (0, 0))[1])
    # a flag with a value of the wrong type is refused every time, never remembered
    bad = with_params(_request(zeros, zeros), triton_enable_empty_final_response=("string_param", "yes"))
    message = bad.SerializeToString()
    for _ in range(2):
        with pytest.raises(NaiadError) as refused:
            decoder.decode(pb.ModelInferRequest.FromString(message), message)
        assert refused.value.code is ErrorCode.INVALID_ARG
        assert decoder.decode_serialized(message) is None


def test_bytes_inputs_are_decoded_in_full() -> None:
    decoder = InferDecoder(allow_shared_memory=False)
    raw = len(b"ab").to_bytes(4, "little") + b"ab"
    for _ in range(2):
        request = pb.ModelInferRequest(model_name="m", inputs=[pb.ModelInferRequest.InferInputTensor(
            name="S", datatype="BYTES", shape=[1])], raw_input_contents=[raw])
        assert decoder.decode(request).inputs[0].data.tolist() == [b"ab"]


def test_memo_stays_bounded() -> None:
    decoder = InferDecoder(allow_shared_memory=False)
    a = np.zeros((1, 4), np.float32)
    for i in range(3 * MEMO_LIMIT):
        assert decoder.decode(_request(a, a, model=f"m{i}", request_id=str(i))).id == str(i)
    assert len(decoder._memo) <= MEMO_LIMIT


def test_a_serialized_request_seen_before_is_decoded_from_its_bytes() -> None:
    decoder = InferDecoder(allow_shared_memory=False)
    rng = np.random.default_rng(2)
    first = _request(np.zeros((1, 16), np.float32), np.zeros((1, 16), np.float32))
    message = first.SerializeToString()
    assert decoder.decode_serialized(message) is None  # nothing seen yet
    decoder.decode(pb.ModelInferRequest.FromString(message), message)
    for _ in range(3):
        a, b = rng.standard_normal((1, 16), np.float32), rng.standard_normal((1, 16), np.float32)
        request = _request(a, b)
        decoded = decoder.decode_serialized(request.SerializeToString())
        assert decoded is not None
        _same(decoded, decode_infer_request(request, False))
        np.testing.assert_array_equal(decoded.inputs[0].data, a)
        np.testing.assert_array_equal(decoded.inputs[1].data, b)
        assert all(tensor.data.flags.aligned for tensor in decoded.inputs)


def test_serialized_requests_unlike_the_remembered_ones_are_parsed() -> None:
    decoder = InferDecoder(allow_shared_memory=False)
    a = np.zeros((1, 16), np.float32)
    message = _request(a, a).SerializeToString()
    decoder.decode(pb.ModelInferRequest.FromString(message), message)
    with_id = _request(a, a, request_id="7").SerializeToString()
    other_size = _request(np.zeros((1, 15), np.float32), a).SerializeToString()
    # the same bytes but for the tail: a raw tensor replaced by a field of another number and the same size
    other_field = message[:-66] + b"\x42" + message[-65:]
    assert pb.ModelInferRequest.FromString(other_field).raw_input_contents[:] == [a.tobytes()]
    for unlike in (with_id, other_size, other_field, message[:-1], message + b"\x3a\x00"):
        assert decoder.decode_serialized(unlike) is None
    # a request with an id, or serialized in another field order, is decoded in full and not remembered
    decoder.decode(pb.ModelInferRequest.FromString(with_id), with_id)
    reordered = _request(a, a).SerializeToString()
    reordered = reordered[-132:] + reordered[:-132]  # the raw tensors first: the same message
    assert pb.ModelInferRequest.FromString(reordered) == _request(a, a)
    decoder.decode(pb.ModelInferRequest.FromString(reordered), reordered)
    assert decoder.decode_serialized(reordered) is None and decoder.decode_serialized(with_id) is None
    assert decoder.decode_serialized(message) is not None


def test_serialized_memo_stays_bounded() -> None:
    decoder = InferDecoder(allow_shared_memory=False)
    a = np.zeros((1, 4), np.float32)
    for i in range(3 * MEMO_LIMIT):
        message = _request(a, a, model=f"m{i}").SerializeToString()
        assert decoder.decode(pb.ModelInferRequest.FromString(message), message).model_name == f"m{i}"
        assert decoder.decode_serialized(message) is not None
    assert sum(len(entries) for entries in decoder._serialized.values()) <= MEMO_LIMIT


def _response(outputs: list[OutputTensor], **extra: object) -> InferenceResponse:
    return InferenceResponse(model_name="add_sub", model_version="1", outputs=outputs, **extra)  # type: ignore[arg-type]


def test_encoded_responses_are_the_full_serialization() -> None:
    encoder = InferEncoder()
    rng = np.random.default_rng(1)
    cases = []
    for n in (16, 16, 300, 0):  # a remembered layout, a new shape, a long tensor (2-byte varint), an empty one
        data = rng.standard_normal((1, n)).astype(np.float32)
        cases.append(_response([OutputTensor("OUTPUT0", "FP32", (1, n), data),
                                OutputTensor("OUTPUT1", "INT64", [1, n], data.astype(np.int64))], id="r"))
    strings = np.array([b"ab", b""], dtype=np.object_)
    cases.append(_response([OutputTensor("S", "BYTES", (2,), strings)]))
    cases.append(_response([OutputTensor("P", "FP32", (1,), np.ones(1, np.float32), {"k": 1})]))  # parameters
    cases.append(_response([OutputTensor("P", "FP32", (1,), np.ones(1, np.float32))], parameters={"x": "y"}))
    cases.append(_response([OutputTensor("SHM", "FP32", (4,), None)]))  # written to shared memory
    cases.append(_response([OutputTensor("C", "FP32", (1, 3), np.arange(3.0).reshape(1, 3))]))  # float64: converted
    cases.append(_response([OutputTensor("E", "INT32", (3,), np.arange(3, dtype=">i4"))]))  # big-endian: converted
    for response in cases * 2:
        encoded = encoder.encode(response)
        assert encoded == encode_infer_response(response).SerializeToString()
        decoded = pb.ModelInferResponse.FromString(encoded)
        assert [bytes(raw) for raw in decoded.raw_output_contents] == [
            b"" if out.data is None else raw_bytes(out.data, out.datatype) for out in response.outputs]


def test_remembered_output_field_heads_stay_bounded() -> None:
    encoder = InferEncoder()
    for n in range(infer_memo.FIELD_HEADS_LIMIT + 10):
        response = _response([OutputTensor("OUTPUT0", "UINT8", (n,), np.full(n, 7, np.uint8))])
        assert encoder.encode(response) == encode_infer_response(response).SerializeToString()
    assert 0 < len(infer_memo._FIELD_HEADS) <= infer_memo.FIELD_HEADS_LIMIT
