"""The binary header memo decodes as the full decoder does; the all-binary answer is the general encoder's bytes."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from naiad.frontends.http import binary_memo, infer_codec
from naiad.frontends.http.binary_memo import BinaryHeaderMemo
from naiad.frontends.http.infer_codec import OutputPlan, decode_infer_request, encode_infer_response
from naiad.protocol.datatypes import NUMPY_DTYPES
from naiad.protocol.errors import NaiadError
from naiad.protocol.types import InferenceResponse, OutputTensor
from naiad.runtime.process.tensors import append_flat_inputs

_PLAIN = {"id": "", "inputs": [
    {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 16}},
    {"name": "INPUT1", "datatype": "INT64", "shape": [2], "parameters": {"binary_data_size": 16}},
], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT1"}]}


def _with(**changes):
    return {**_PLAIN, **changes}


def _input(index: int, **changes):
    inputs = [dict(raw) for raw in _PLAIN["inputs"]]
    inputs[index].update(changes)
    return _with(inputs=inputs)


def _binary(seed: int, doc: dict = _PLAIN) -> bytes:
    """Random tensor bytes for the inputs of `doc` (whole numbers: every datatype reads them as a value)."""
    size = sum(raw["parameters"]["binary_data_size"] for raw in doc["inputs"])
    return np.random.default_rng(seed).integers(0, 2, size, dtype=np.uint8).tobytes()


_HEADERS = [
    _PLAIN,
    _with(id="a-request"),
    {"inputs": _PLAIN["inputs"]},  # no id, no outputs
    _with(outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": False}}]),
    _with(parameters={"priority": 3}),  # not remembered
    _with(parameters={"binary_data_output": True}, outputs=[]),  # not remembered
    _with(outputs=[{"name": "OUTPUT0", "parameters": {"classification": 2}}]),  # not remembered
    _input(0, parameters={"binary_data_size": 16, "custom": 1}),  # not remembered
    _input(0, datatype="FP64", shape=[2], parameters={"binary_data_size": 16}),
    _input(1, datatype="BOOL", shape=[16], parameters={"binary_data_size": 16}),
    _input(1, datatype="BF16", shape=[2, 4], parameters={"binary_data_size": 16}),
    _input(1, datatype="INT8", shape=[0, 3], parameters={"binary_data_size": 0}),
]


def _same_request(a, b) -> None:
    (request_a, plan_a), (request_b, plan_b) = a, b
    assert plan_a == plan_b
    for field in ("model_name", "model_version", "id", "outputs", "parameters", "priority", "timeout_us",
                  "sequence_id", "sequence_start", "sequence_end"):
        assert getattr(request_a, field) == getattr(request_b, field), field
    assert len(request_a.inputs) == len(request_b.inputs)
    for x, y in zip(request_a.inputs, request_b.inputs):
        assert (x.name, x.datatype, x.shape, x.parameters, x.shared_memory) == (y.name, y.datatype, y.shape, y.parameters, y.shared_memory)
        assert x.data.dtype is y.data.dtype and x.data.shape == y.data.shape
        assert x.data.tobytes() == y.data.tobytes() and x.data.flags.writeable == y.data.flags.writeable


@pytest.mark.parametrize("doc", _HEADERS)
def test_a_header_decodes_as_the_full_decoder_decodes_it_every_time(doc):
    memo = BinaryHeaderMemo()
    header = orjson.dumps(doc)
    for seed in range(3):  # the first call remembers; the next ones (other tensor bytes) may use the memo
        body = header + _binary(seed, doc)
        _same_request(memo.decode("m", "2", body, len(header)), decode_infer_request("m", "2", body, len(header)))


def test_only_plain_headers_are_remembered(monkeypatch):
    memo = BinaryHeaderMemo()
    for doc in _HEADERS:
        header = orjson.dumps(doc)
        memo.decode("m", "", header + _binary(0, doc), len(header))
    remembered = [key[2] for key in memo._memo]
    assert remembered == [orjson.dumps(doc) for doc in _HEADERS[:4] + _HEADERS[8:]]
    calls = []
    monkeypatch.setattr(binary_memo, "decode_infer_request", lambda *args: calls.append(args) or decode_infer_request(*args))
    header = orjson.dumps(_PLAIN)
    request, plan = memo.decode("m", "", header + _binary(5), len(header))
    assert calls == [] and request.inputs[1].data.tolist() == np.frombuffer(_binary(5)[16:], np.int64).tolist()
    # the same header for another model or version is another key
    for model, version in (("other", ""), ("m", "1")):
        memo.decode(model, version, header + _binary(5), len(header))
    assert len(calls) == 2


@pytest.mark.parametrize("cut", [-1, 1])
def test_a_remembered_header_with_tensors_of_another_size_gets_the_full_decoders_error(cut):
    memo = BinaryHeaderMemo()
    header = orjson.dumps(_PLAIN)
    memo.decode("m", "", header + _binary(0), len(header))
    body = header + _binary(1) + b"x" if cut > 0 else header + _binary(1)[:-1]
    with pytest.raises(NaiadError) as memo_error:
        memo.decode("m", "", body, len(header))
    with pytest.raises(NaiadError) as full_error:
        decode_infer_request("m", "", body, len(header))
    assert memo_error.value.message == full_error.value.message and memo_error.value.code == full_error.value.code


def test_the_memo_starts_afresh_when_full():
    memo = BinaryHeaderMemo()
    for index in range(binary_memo.MEMO_LIMIT + 1):
        header = orjson.dumps(_with(id=str(index)))
        memo.decode("m", "", header + _binary(0), len(header))
    assert len(memo._memo) == 1


def test_binary_inputs_have_their_datatypes_own_dtype_and_travel_flat_to_a_python_model():
    header = orjson.dumps(_PLAIN)
    request, _ = decode_infer_request("m", "", header + _binary(0), len(header))
    assert [x.data.dtype is NUMPY_DTYPES[x.datatype] for x in request.inputs] == [True, True]
    fields: list = []
    assert append_flat_inputs(fields, {x.name: x.data for x in request.inputs}, {x.name: x.datatype for x in request.inputs})


def _general(response: InferenceResponse, plan: OutputPlan):
    header, blobs = infer_codec._encode(response, plan, spell_non_finite=False)
    return (b"".join([header, *blobs]), len(header)) if blobs else (header, None)


_F = np.arange(6, dtype=np.float32).reshape(2, 3)


@pytest.mark.parametrize("outputs, extra, plan", [
    ([OutputTensor("A", "FP32", (2, 3), _F), OutputTensor("B", "INT64", (2,), np.array([5, -6]))], {}, OutputPlan(True)),
    ([OutputTensor("A", "FP32", (2, 3), _F)], {}, OutputPlan(False, {"A": True})),
    ([OutputTensor("A", "FP32", (2, 3), _F)], {"id": "7"}, OutputPlan(True)),
    ([OutputTensor("A", "FP32", (2, 3), _F)], {"parameters": {"p": 1}}, OutputPlan(True)),
    ([OutputTensor("A", "FP32", (2, 3), _F, {"q": "r"})], {}, OutputPlan(True)),
    ([OutputTensor("A", "FP32", (3, 2), _F.T)], {}, OutputPlan(True)),  # strided
    ([OutputTensor("A", "FP32", (6,), _F.ravel().astype(">f4"))], {}, OutputPlan(True)),  # big-endian
    ([OutputTensor("A", "FP32", [np.int64(6)], _F.ravel())], {}, OutputPlan(True)),  # a list shape
    ([OutputTensor("A", "FP32", (), np.float32(2.5) * np.ones((), np.float32))], {}, OutputPlan(True)),  # 0-d
    ([OutputTensor("A", "FP32", (0, 3), np.zeros((0, 3), np.float32))], {}, OutputPlan(True)),
    ([OutputTensor("A", "FP32", (2, 3), None)], {}, OutputPlan(True)),  # written to shared memory
    ([OutputTensor("S", "BYTES", (1,), np.array([b"xy"], dtype=np.object_))], {}, OutputPlan(True)),
    ([OutputTensor("H", "BF16", (2,), np.array([1, 2], np.uint16))], {}, OutputPlan(True)),
    ([OutputTensor("A", "FP32", (2, 3), _F), OutputTensor("B", "FP32", (2, 3), _F)], {}, OutputPlan(False, {"A": True})),
])
def test_an_all_binary_answer_is_the_bytes_of_the_general_encoder(outputs, extra, plan):
    response = InferenceResponse("m", "1", outputs, **extra)
    assert encode_infer_response(response, plan) == _general(response, plan)
