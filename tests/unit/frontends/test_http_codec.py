"""Unit tests of the HTTP infer codec, body limits and compression helpers (no sockets)."""

from __future__ import annotations

import asyncio
import gzip
import struct
import zlib

import numpy as np
import orjson
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad.frontends.http.body import RequestHeaders, body_at_hand, decompress_body, read_body
from naiad.frontends.http.compression import choose_encoding, compress
from naiad.frontends.http.errors import ClientDisconnected, HttpError
from naiad.frontends.http.infer_codec import (
    OutputPlan,
    decode_infer_request,
    encode_infer_response,
    parse_header_length,
)
from naiad.frontends.http.raw_request import decode_raw_request
from naiad.protocol.errors import NaiadError
from naiad.protocol.types import InferenceResponse, OutputTensor


class _Resolved:
    """Only what the raw-body decoder reads of a resolved model: its config."""

    def __init__(self, config: mc.ModelConfig) -> None:
        self.config = config


def _raw_model(name: str, max_batch_size: int, datatype: int, dims: list[int]) -> _Resolved:
    config = mc.ModelConfig(name=name, max_batch_size=max_batch_size)
    config.input.add(name="X", data_type=datatype, dims=dims)
    return _Resolved(config)


def decode(doc: dict, binary: bytes = b"", model: str = "m"):
    header = orjson.dumps(doc)
    if binary:
        return decode_infer_request(model, "", header + binary, len(header))
    return decode_infer_request(model, "3", header, None)


def test_header_length_parsing():
    assert parse_header_length(None, 10) is None
    assert parse_header_length(b"0", 10) == 0
    assert parse_header_length(b" 10 ", 10) == 10
    for bad in (b"11", b"-1", b"x", b"", b"1e3", b"\xff", b"9" * 5000, b"0" * 30):
        with pytest.raises(NaiadError) as info:
            parse_header_length(bad, 10)
        assert info.value.code.http_status == 400
        assert info.value.message.startswith("inference header size should be in range (0, 10), got: ")


def test_decode_json_and_binary_inputs_in_order():
    blob_b = np.array([7, 8], dtype=np.uint8).tobytes()
    blob_c = struct.pack("<I", 2) + b"hi" + struct.pack("<I", 0)
    doc = {
        "id": "abc",
        "inputs": [
            {"name": "A", "datatype": "INT64", "shape": [2, 2], "data": [[1, 2], [3, 4]]},
            {"name": "B", "datatype": "UINT8", "shape": [2], "parameters": {"binary_data_size": 2}},
            {"name": "C", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": len(blob_c), "x": 1}},
            {"name": "D", "datatype": "BOOL", "shape": [0], "parameters": {"binary_data_size": 0}},
        ],
    }
    request, plan = decode(doc, blob_b + blob_c)
    assert request.id == "abc" and request.model_version == ""
    a, b, c, d = request.inputs
    assert a.data.tolist() == [[1, 2], [3, 4]] and a.data.dtype == np.int64
    assert b.data.tolist() == [7, 8] and b.shape == (2,)
    assert c.data.tolist() == [b"hi", b""] and c.parameters == {"x": 1}
    assert d.data.shape == (0,) and d.data.dtype == np.bool_
    assert plan.default_binary is False and request.outputs == []


_MIXED_INPUTS = [
    {"name": "F", "datatype": "FP32", "shape": [1, 3], "data": [0.5, 1e39, -2.0]},
    {"name": "G", "datatype": "FP64", "shape": [2], "data": [0.25, 3]},
    {"name": "H", "datatype": "FP32", "shape": [2, 1], "data": [[1.5], [2.5]]},
    {"name": "I", "datatype": "INT64", "shape": [2], "data": [1, 2], "extra": "ignored"},
    {"name": "J", "datatype": "FP32", "shape": [1], "data": [0.5], "parameters": {"p": 1}},
]


@pytest.mark.parametrize("extra", [{"id": ""}, {"parameters": {}}, {"outputs": []}])
def test_the_usual_body_decodes_as_a_body_with_more_fields(extra):
    """A body of inputs alone (the usual one, decoded by a shorter path) gives what the same inputs
    give in a body the general path decodes."""
    usual, plan = decode({"inputs": _MIXED_INPUTS})
    general, _ = decode({"inputs": _MIXED_INPUTS, **extra})
    assert plan == OutputPlan() and usual.outputs == [] and usual.parameters == {} and usual.id == ""
    assert usual.model_name == general.model_name and usual.model_version == general.model_version == "3"
    assert [(i.name, i.datatype, i.shape, i.parameters) for i in usual.inputs] == [
        (i.name, i.datatype, i.shape, i.parameters) for i in general.inputs]
    for mine, theirs in zip(usual.inputs, general.inputs, strict=True):
        assert mine.data.dtype == theirs.data.dtype and mine.data.tobytes() == theirs.data.tobytes()
        assert mine.data.flags.writeable
    assert usual.inputs[0].data.tolist() == [[0.5, np.inf, -2.0]]


@pytest.mark.parametrize("bad,message", [
    ({"name": "X", "datatype": "FP32", "shape": [True, 2], "data": [0.5, 1.0]}, "shape of input 'X' must contain only"),
    ({"name": "X", "datatype": "FP32", "shape": [3], "data": [0.5, 1.0]}, "expected 3 elements, got 2"),
    ({"name": "X", "datatype": "FP32", "shape": [2], "data": [0.5, "1"]}, "elements are not valid FP32 values"),
    ({"name": 7, "datatype": "FP32", "shape": [1], "data": [0.5]}, "Unable to parse 'name'"),
    ({"name": "X", "datatype": "FP8", "shape": [1], "data": [0.5]}, "invalid datatype 'FP8' for input 'X'"),
])
def test_the_usual_body_with_a_bad_input_gets_the_general_paths_error(bad, message):
    for doc in ({"inputs": [bad]}, {"inputs": [bad], "id": "x"}):
        with pytest.raises(NaiadError) as info:
            decode(doc)
        assert info.value.code.http_status == 400 and message in info.value.message, info.value.message


def test_decode_outputs_and_plan():
    doc = {
        "parameters": {"binary_data_output": True},
        "inputs": [],
        "outputs": [
            {"name": "O1"},
            {"name": "O2", "parameters": {"binary_data": False, "classification": 3}},
            {"name": "O3", "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 64,
                                         "shared_memory_offset": 8, "custom": "v"}},
        ],
    }
    request, plan = decode(doc)
    o1, o2, o3 = request.outputs
    # Triton 2.51: an output listed without its own binary_data is JSON despite binary_data_output
    assert not plan.is_binary("O1") and not plan.is_binary("O2") and plan.is_binary("unlisted")
    assert o2.classification == 3 and o2.shared_memory is None
    assert (o3.shared_memory.region, o3.shared_memory.byte_size, o3.shared_memory.offset) == ("r", 64, 8)
    assert o3.parameters == {"custom": "v"}


def test_shm_input_is_a_reference_for_the_core():
    doc = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 3],
                       "parameters": {"shared_memory_region": "reg", "shared_memory_byte_size": 12}}]}
    request, _ = decode(doc)
    x = request.inputs[0]
    # The core reads the region (core/request_validation.py); the frontend passes the reference on.
    ref = x.shared_memory
    assert (ref.region, ref.byte_size, ref.offset, x.datatype, x.shape, x.name, x.data) == ("reg", 12, 0, "FP32", (1, 3), "X", None)
    assert x.parameters == {}
    doc["inputs"][0]["parameters"] = {"shared_memory_region": "reg"}
    with pytest.raises(NaiadError, match="'shared_memory_byte_size' must be specified"):
        decode(doc)


@pytest.mark.parametrize(
    "params,field,value",
    [
        ({"sequence_id": 18446744073709551615}, "sequence_id", 18446744073709551615),
        ({"sequence_id": "corr"}, "sequence_id", "corr"),
        ({"sequence_end": True}, "sequence_end", True),
        ({"timeout": 0}, "timeout_us", 0),
        ({"priority": 2}, "priority", 2),
    ],
)
def test_reserved_request_parameters(params, field, value):
    request, _ = decode({"parameters": params, "inputs": []})
    assert getattr(request, field) == value
    assert request.parameters == {}


def test_out_of_range_parameters_refused():
    for params in (b'{"sequence_id": 18446744073709551616}', b'{"sequence_id": -1}', b'{"timeout": true}',
                   b'{"custom": null}', b'{"custom": [1]}'):
        body = b'{"inputs": [], "parameters": ' + params + b"}"
        with pytest.raises(NaiadError) as info:
            decode_infer_request("m", "", body, None)
        assert info.value.code.http_status == 400
    # as Triton's JSON parser: a custom integer past int64 is a double
    request, _ = decode_infer_request("m", "", b'{"inputs": [], "parameters": {"custom": 9223372036854775808}}', None)
    assert request.parameters == {"custom": 9.223372036854776e18} and isinstance(request.parameters["custom"], float)


def test_integer_parameter_outside_int64_is_a_double():
    body = b'{"inputs": [], "parameters": {"custom": 9223372036854775808, "small": -9223372036854775809}}'
    request, _ = decode_infer_request("m", "", body, None)
    assert request.parameters == {"custom": 9223372036854775808.0, "small": -9223372036854775809.0}
    assert all(type(v) is float for v in request.parameters.values())


def test_truncated_and_trailing_binary():
    doc = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}]}
    with pytest.raises(NaiadError, match=r"^unexpected size for input 'X', expecting 4 additional bytes for model 'm'$"):
        decode(doc, b"\0" * 4)
    with pytest.raises(NaiadError, match=r"^unexpected additional input data for model 'm'$"):
        decode(doc, b"\0" * 9)


def test_binary_size_must_match_shape_before_allocating():
    doc = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [2147483648, 4],
                       "parameters": {"binary_data_size": 8}}]}
    with pytest.raises(NaiadError, match="unexpected total byte size 8 for input 'X'"):
        decode(doc, b"\0" * 8)
    doc = {"inputs": [{"name": "X", "datatype": "BYTES", "shape": [1 << 40], "parameters": {"binary_data_size": 8}}]}
    with pytest.raises(NaiadError, match="string elements"):
        decode(doc, b"\0" * 8)


def test_raw_request_shapes():
    body = np.arange(6, dtype=np.int16).tobytes()
    request = decode_raw_request(_raw_model("batched", 4, mc.TYPE_INT16, [2, -1]), "batched", "", body)
    (inp,) = request.inputs
    assert (inp.name, inp.datatype, inp.shape) == ("X", "INT16", (1, 2, 3))
    assert inp.data.tolist() == [[[0, 1, 2], [3, 4, 5]]]
    flat = _raw_model("flat", 0, mc.TYPE_FP64, [-1])
    request = decode_raw_request(flat, "flat", "", np.ones(3).tobytes())
    assert request.inputs[0].shape == (3,)
    with pytest.raises(NaiadError, match="unexpected total byte size 5"):
        decode_raw_request(flat, "flat", "", b"12345")
    with pytest.raises(NaiadError, match="more than one variable-sized dimension"):
        decode_raw_request(_raw_model("two_vars", 0, mc.TYPE_FP32, [-1, -1]), "two_vars", "", b"1234")


def _response(*outputs: OutputTensor, **kw) -> InferenceResponse:
    return InferenceResponse("m", "2", list(outputs), **kw)


def test_encode_json_response():
    out = OutputTensor("O", "FP32", (2, 2), np.array([[0.5, 1], [2, 3]], dtype=np.float32).T)
    strings = OutputTensor("S", "BYTES", (2,), np.array([b"a", "é".encode()], dtype=np.object_))
    flags = OutputTensor("B", "BOOL", (2,), np.array([True, False]))
    body, json_length = encode_infer_response(_response(out, strings, flags, id="7", parameters={"p": 1}), OutputPlan())
    assert json_length is None
    doc = orjson.loads(body)
    assert doc["id"] == "7" and doc["model_version"] == "2" and doc["parameters"] == {"p": 1}
    assert doc["outputs"][0] == {"name": "O", "datatype": "FP32", "shape": [2, 2], "data": [0.5, 2.0, 1.0, 3.0]}
    assert doc["outputs"][1]["data"] == ["a", "é"]
    assert doc["outputs"][2]["data"] == [True, False]
    assert "id" not in orjson.loads(encode_infer_response(_response(out), OutputPlan())[0])


def test_encode_json_response_of_big_endian_strided_data_and_a_list_shape():
    swapped = OutputTensor("W", "INT32", [np.int64(3)], np.array([7, 8, 9, 10, 11, 12], dtype=">i4")[::2])
    doc = orjson.loads(encode_infer_response(_response(swapped), OutputPlan())[0])
    assert doc["outputs"][0] == {"name": "W", "datatype": "INT32", "shape": [3], "data": [7, 9, 11]}


def test_encode_binary_response_order_and_empty_outputs():
    first = OutputTensor("A", "INT32", (2,), np.array([1, 2], dtype=np.int32))
    empty = OutputTensor("E", "FP32", (0, 3), np.zeros((0, 3), dtype=np.float32))
    text = OutputTensor("S", "BYTES", (1,), np.array([b"xyz"], dtype=np.object_))
    shm = OutputTensor("M", "FP32", (4,), None)  # written to shared memory
    as_json = OutputTensor("J", "INT8", (1,), np.array([-3], dtype=np.int8))
    plan = OutputPlan(default_binary=True, binary={"J": False})
    body, n = encode_infer_response(_response(first, empty, text, shm, as_json), plan)
    doc = orjson.loads(body[:n])
    params = [o.get("parameters") for o in doc["outputs"]]
    assert params[0] == {"binary_data_size": 8} and params[1] == {"binary_data_size": 0}
    assert params[2] == {"binary_data_size": 7}
    assert doc["outputs"][3] == {"name": "M", "datatype": "FP32", "shape": [4]}
    assert "data" not in doc["outputs"][3] and doc["outputs"][4]["data"] == [-3]
    assert body[n:] == np.array([1, 2], dtype=np.int32).tobytes() + struct.pack("<I", 3) + b"xyz"


def test_encode_half_as_json_refused():
    half = OutputTensor("H", "FP16", (1,), np.array([1], dtype=np.float16))
    with pytest.raises(NaiadError, match="sending FP16 data via JSON is not supported"):
        encode_infer_response(_response(half), OutputPlan())
    body, n = encode_infer_response(_response(half), OutputPlan(default_binary=True))
    assert body[n:] == np.array([1], dtype="<f2").tobytes()


def test_accept_encoding_choice():
    assert choose_encoding(None) is None
    assert choose_encoding(b"gzip") == b"gzip"
    assert choose_encoding(b"deflate, gzip") == b"deflate"
    assert choose_encoding(b"deflate;q=0.2, gzip;q=0.8") == b"gzip"
    assert choose_encoding(b"identity, gzip;q=0.5") is None
    assert choose_encoding(b"br, zstd") is None
    assert choose_encoding(b"gzip;q=abc, deflate") == b"deflate"
    assert gzip.decompress(compress(b"x" * 100, b"gzip")) == b"x" * 100
    assert zlib.decompress(compress(b"y" * 100, b"deflate")) == b"y" * 100


def test_decompress_body():
    data = b"hello" * 100
    assert decompress_body(gzip.compress(data), b"gzip", 1000) == data
    assert decompress_body(gzip.compress(data) + gzip.compress(b"!"), b"gzip", 1000) == data + b"!"
    assert decompress_body(zlib.compress(data), b"deflate", 1000) == data
    raw = zlib.compressobj(6, zlib.DEFLATED, -15)
    assert decompress_body(raw.compress(data) + raw.flush(), b"deflate", 1000) == data
    assert decompress_body(data, b"identity", 10) == data
    with pytest.raises(HttpError) as info:
        decompress_body(gzip.compress(data), b"gzip", 499)
    assert info.value.status == 400 and "exceeds the maximum allowed value of 499 bytes" in info.value.message
    with pytest.raises(HttpError, match="unable to decompress"):
        decompress_body(gzip.compress(data)[:-10], b"gzip", 1000)
    with pytest.raises(HttpError, match="Unsupported compression type 'zstd'"):
        decompress_body(data, b"zstd", 1000)


def _receiver(messages):
    queue = list(messages)

    async def receive():
        if queue:
            return queue.pop(0)
        await asyncio.sleep(3600)

    return receive


def test_a_body_at_hand_is_refused_past_the_limit_as_a_read_one():
    """naiad.take_body's body is held to --http-max-input-size with read_body's messages: its declared
    size when it has one, else "more than"; a declared size past the limit is refused before it arrives."""
    def scope_taking(body):
        return {"extensions": {"naiad.take_body": lambda receive: body}}

    assert body_at_hand(scope_taking(b"abcdef"), None, RequestHeaders(content_length=b"6"), 6) == b"abcdef"
    assert body_at_hand(scope_taking(None), None, RequestHeaders(content_length=b"6"), 6) is None
    assert body_at_hand({}, None, RequestHeaders(content_length=b"6"), 6) is None  # another server: read_body
    for body, headers, shown in ((b"abcdefg", RequestHeaders(content_length=b"7"), "7 bytes"),
                                 (b"abcdefg", RequestHeaders(chunked=True), "more than 6 bytes"),
                                 (None, RequestHeaders(content_length=b"7"), "7 bytes")):
        with pytest.raises(HttpError) as info:
            body_at_hand(scope_taking(body), None, headers, 6)
        assert info.value.close and f"Request JSON size of {shown} exceeds the maximum allowed value of 6 bytes" in info.value.message


def test_output_plans_of_requests_do_not_leak_into_each_other():
    """A request naming outputs gets its own plan: the next request naming none still gets every
    output as JSON."""
    plain = orjson.dumps({"inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [1]}]})
    named = orjson.dumps({"inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [1]}],
                          "outputs": [{"name": "Y", "parameters": {"binary_data": True}}],
                          "parameters": {"binary_data_output": True}})
    _, first = decode_infer_request("m", "", plain, None)
    _, other = decode_infer_request("m", "", named, None)
    _, again = decode_infer_request("m", "", plain, None)
    assert other.is_binary("Y") and other.is_binary("Z")
    assert not first.is_binary("Y") and not again.is_binary("Y") and not again.is_binary("Z")


def test_read_body_limits():
    headers = RequestHeaders(content_length=b"6")
    chunks = [{"type": "http.request", "body": b"abc", "more_body": True},
              {"type": "http.request", "body": b"def", "more_body": False}]
    assert asyncio.run(read_body(_receiver(chunks), headers, 6, 5)) == b"abcdef"
    with pytest.raises(HttpError) as info:
        asyncio.run(read_body(_receiver(chunks), RequestHeaders(content_length=b"7"), 6, 5))
    assert info.value.close and "Request JSON size of 7 bytes exceeds the maximum allowed value of 6 bytes" in info.value.message
    with pytest.raises(HttpError) as info:
        asyncio.run(read_body(_receiver(chunks), RequestHeaders(chunked=True), 5, 5))
    assert info.value.close and "more than 5 bytes" in info.value.message
    with pytest.raises(HttpError) as info:
        asyncio.run(read_body(_receiver(chunks[:1]), headers, 6, 0.05))
    assert info.value.status == 408 and info.value.close
    with pytest.raises(ClientDisconnected):
        asyncio.run(read_body(_receiver([{"type": "http.disconnect"}]), headers, 6, 5))


def test_bf16_json_refused_both_ways_but_binary_works():
    doc = {"inputs": [{"name": "X", "datatype": "BF16", "shape": [2], "data": [1, 2]}]}
    with pytest.raises(NaiadError, match="receiving BF16 data via JSON is not supported") as info:
        decode(doc)
    assert info.value.code.http_status == 400
    words = np.array([0x3F80, 0x4000], dtype=np.uint16)
    request, _ = decode({"inputs": [{"name": "X", "datatype": "BF16", "shape": [2],
                                     "parameters": {"binary_data_size": 4}}]}, words.astype("<u2").tobytes())
    assert request.inputs[0].data.tolist() == [0x3F80, 0x4000]
    out = OutputTensor("Y", "BF16", (2,), words)
    with pytest.raises(NaiadError, match="sending BF16 data via JSON is not supported"):
        encode_infer_response(_response(out), OutputPlan())
    body, n = encode_infer_response(_response(out), OutputPlan(default_binary=True))
    assert body[n:] == words.astype("<u2").tobytes()


@pytest.mark.parametrize("before", [
    {},  # the first "u" after the outputs key is null's own
    {"first": OutputTensor("plus_u", "FP32", (1,), np.array([1.0], dtype=np.float32))},  # a "u" in a name
    {"first": OutputTensor("T", "BOOL", (2,), np.array([True, False]))},  # true and false hold a "u"
    {"parameters": {"outputs": ["u"], "n": None}},  # a parameter named like the key, and a null of its own
])
def test_encode_finds_a_non_finite_value_wherever_the_search_starts(before):
    odd = OutputTensor("O", "FP32", (2,), np.array([1.0, np.nan], dtype=np.float32))  # one null: its "u" may be the first
    first = [before["first"]] if "first" in before else []
    body, _ = encode_infer_response(_response(*first, odd, parameters=before.get("parameters", {})), OutputPlan())
    assert body.endswith(b'{"name":"O","datatype":"FP32","shape":[2],"data":[1.0,NaN]}]}')


def test_encode_spells_non_finite_floats_whatever_else_says_null():
    """NaN and +-inf are written as Triton writes them; an answer that only mentions 'null' elsewhere is unchanged."""
    odd = OutputTensor("O", "FP32", (1, 3), np.array([[np.nan, 1.5, -np.inf]], dtype=np.float32))
    fine = OutputTensor("F", "FP64", (2,), np.array([0.25, 2.0]))
    body, _ = encode_infer_response(_response(fine, odd, id="null"), OutputPlan())
    assert b'"data":[0.25,2.0]' in body and b'"data":[NaN,1.5,-Infinity]' in body and b'"id":"null"' in body
    body, _ = encode_infer_response(_response(fine, id="null", parameters={"p": "null"}), OutputPlan())
    assert orjson.loads(body) == {"id": "null", "model_name": "m", "model_version": "2", "parameters": {"p": "null"},
                                  "outputs": [{"name": "F", "datatype": "FP64", "shape": [2], "data": [0.25, 2.0]}]}


_FLOATS = np.array([[0.5, -1.25, 3.0e38, 1e-7]], dtype=np.float32)


@pytest.mark.parametrize("outputs, extra", [
    ([OutputTensor("A", "FP32", (1, 4), _FLOATS), OutputTensor("B", "FP64", (4,), _FLOATS.astype(np.float64).ravel())], {}),
    ([OutputTensor("A", "FP32", (1, 4), _FLOATS)], {"id": "7"}),
    ([OutputTensor("A", "FP32", (1, 4), _FLOATS)], {"parameters": {"p": 1}}),
    ([OutputTensor("A", "FP32", (1, 4), _FLOATS, {"q": "r"})], {}),
    ([OutputTensor("A", "FP32", (2, 2), _FLOATS.reshape(2, 2).T)], {}),  # strided
    ([OutputTensor("A", "FP32", (4,), _FLOATS.ravel().astype(">f4"))], {}),  # big-endian
    ([OutputTensor("A", "FP32", [np.int64(4)], _FLOATS.ravel())], {}),  # a list shape
    ([OutputTensor("A", "FP32", (2,), np.array([np.nan, np.inf], dtype=np.float32))], {}),
    ([OutputTensor("nullable", "FP32", (2,), np.array([1.0, -np.inf], dtype=np.float32))], {}),  # "null" in a name too
    ([OutputTensor("nullable", "FP32", (2,), np.array([1.0, 2.0], dtype=np.float32))], {}),
    ([OutputTensor("A", "FP32", (4,), _FLOATS.ravel()), OutputTensor("I", "INT32", (2,), np.array([1, 2], dtype=np.int32))], {}),
    ([OutputTensor("A", "FP32", (4,), None)], {}),  # written to shared memory
    ([OutputTensor("A", "FP32", (0, 4), np.zeros((0, 4), dtype=np.float32))], {}),
])
def test_a_request_naming_no_outputs_is_answered_the_bytes_of_the_general_encoder(outputs, extra):
    """The answer to the usual request (no outputs named, no parameters: every output as JSON) is
    encoded by a shorter path for float outputs; it writes what the general one writes, whatever the answer."""
    _, plan = decode({"inputs": []})
    assert encode_infer_response(_response(*outputs, **extra), plan) == encode_infer_response(_response(*outputs, **extra), OutputPlan())
