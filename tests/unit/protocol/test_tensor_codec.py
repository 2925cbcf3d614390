"""Tensor codecs: raw bytes, BYTES length prefixes, JSON; hostile sizes refused before allocation."""

import warnings

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.utils import serialize_byte_tensor

from naiad.protocol.errors import ErrorCode, NaiadError
from naiad.protocol.tensor_codec import (
    PACKED_MAX,
    array_from_json,
    array_from_raw,
    array_to_json,
    array_to_raw,
    deserialize_bytes,
    non_finite_json_array,
    parse_shape,
    serialize_bytes,
    usual_float_array,
)


@pytest.mark.parametrize("datatype,dtype", [("FP32", np.float32), ("INT64", np.int64), ("UINT8", np.uint8), ("FP16", np.float16), ("BOOL", np.bool_)])
def test_raw_roundtrip(datatype, dtype):
    array = (np.arange(12) % 3).astype(dtype).reshape(3, 4)
    raw = bytes(array_to_raw(array, datatype))
    back = array_from_raw(datatype, (3, 4), raw, "x")
    assert back.dtype == dtype and np.array_equal(back, array)


def test_raw_size_mismatch_is_invalid_arg():
    with pytest.raises(NaiadError) as err:
        array_from_raw("FP32", (2, 2), b"\0" * 12, "INPUT0")
    assert err.value.code is ErrorCode.INVALID_ARG
    assert "INPUT0" in err.value.message and "16" in err.value.message


def test_absurd_shape_refused_without_allocating():
    with pytest.raises(NaiadError):
        array_from_raw("FP32", (2147483648, 4), b"\0" * 16, "INPUT0")
    with pytest.raises(NaiadError):
        deserialize_bytes(b"\0" * 8, (2**40,), "S")
    with pytest.raises(NaiadError):
        array_from_json("FP32", (2147483648, 4), [1.0, 2.0], "INPUT0")


def test_bytes_matches_tritonclient_serialization():
    array = np.array([b"a", b"", "héllo".encode(), b"\x00\xff"], dtype=object)
    ours = serialize_bytes(array)
    assert ours == serialize_byte_tensor(array).item()
    back = deserialize_bytes(ours, (4,), "S")
    assert list(back) == list(array)


@pytest.mark.parametrize("payload", [b"\x05\x00\x00\x00ab", b"\x01\x00", b"\x01\x00\x00\x00a\x01\x00\x00\x00b"])
def test_bytes_truncated_or_extra_refused(payload):
    with pytest.raises(NaiadError) as err:
        deserialize_bytes(payload, (1,), "S")
    assert err.value.code is ErrorCode.INVALID_ARG


def test_json_nested_and_flat_agree():
    nested = array_from_json("INT32", (2, 3), [[1, 2, 3], [4, 5, 6]], "x")
    flat = array_from_json("INT32", (2, 3), [1, 2, 3, 4, 5, 6], "x")
    assert np.array_equal(nested, flat) and nested.dtype == np.int32


def test_json_type_errors():
    for datatype, data in [("INT32", [1.5]), ("FP32", ["a"]), ("BOOL", [1]), ("BYTES", [1]), ("INT8", [300]), ("UINT8", [-1])]:
        with pytest.raises(NaiadError) as err:
            array_from_json(datatype, (1,), data, "x")
        assert err.value.code is ErrorCode.INVALID_ARG, (datatype, data)


def test_json_count_mismatch_and_depth():
    with pytest.raises(NaiadError) as err:
        array_from_json("FP32", (2, 2), [1.0, 2.0, 3.0], "x")
    assert "Shape does not match" in err.value.message
    deep: list = [1.0]
    for _ in range(150):
        deep = [deep]
    with pytest.raises(NaiadError) as err:
        array_from_json("FP32", (1,), deep, "x")
    assert "nested deeper" in err.value.message


def test_json_fp16_refused_both_ways():
    with pytest.raises(NaiadError, match="FP16 data via JSON is not supported"):
        array_from_json("FP16", (1,), [1.0], "x")
    with pytest.raises(NaiadError, match="FP16"):
        array_to_json(np.zeros(1, np.float16), "FP16")


def test_json_output_is_flat_and_bytes_are_strings():
    assert array_to_json(np.arange(4).reshape(2, 2), "INT64") == [0, 1, 2, 3]
    assert array_to_json(np.array([b"ab", "c"], dtype=object), "BYTES") == ["ab", "c"]


@pytest.mark.parametrize("shape", [[-1], [1.5], ["2"], "3", [True]])
def test_parse_shape_rejects_bad_dims(shape):
    with pytest.raises(NaiadError):
        parse_shape(shape, "x")


@pytest.mark.parametrize("values,text", [
    ([np.nan], b"[NaN]"),
    ([1.5, np.inf], b"[1.5,Infinity]"),
    ([-np.inf, np.inf, 0.25, np.nan, np.nan, 2.0], b"[-Infinity,Infinity,0.25,NaN,NaN,2.0]"),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_non_finite_floats_are_written_as_triton_writes_them(values, text, dtype):
    flat = np.array(values, dtype=dtype)
    assert orjson.dumps({"data": non_finite_json_array(flat)}) == b'{"data":' + text + b"}"
    assert orjson.dumps(array_to_json(flat, "FP32"), option=orjson.OPT_SERIALIZE_NUMPY) == text


@pytest.mark.parametrize("datatype,shape,data,expected", [
    ("FP32", (2, 2, 1), [[[1.5], [2]], [[3], [4.25]]], np.array([1.5, 2, 3, 4.25], np.float32).reshape(2, 2, 1)),
    ("FP32", (1, 2), [1e39, -1e39], np.array([[np.inf, -np.inf]], np.float32)),  # past FP32's range: +-inf
    ("FP64", (3,), [1, 2.5, True], np.array([1, 2.5, 1.0])),
    ("INT64", (2, 1), [[-(2**63)], [2**63 - 1]], np.array([[-(2**63)], [2**63 - 1]], np.int64)),
    ("UINT64", (2,), [0, 2**64 - 1], np.array([0, 2**64 - 1], np.uint64)),
    ("BOOL", (2,), [[True], [False]], np.array([True, False])),
    ("INT32", (1, 0), [[]], np.empty((1, 0), np.int32)),
    ("FP32", (3,), 7.0, "Shape does not match"),
    ("FP32", (3,), [[1.0, 2.0], [3.0]], np.array([1, 2, 3], np.float32)),  # uneven rows, read row-major
    ("FP32", (2,), [1.0, [2.0]], "ragged nested arrays"),
    ("FP32", (2,), [[1.0], 2.0], "ragged nested arrays"),
    ("FP32", (2, 2), [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], "Shape does not match"),
    ("FP32", (2,), [1.0, "2"], "not valid FP32"),
    ("FP32", (2,), [1.0, None], "not valid FP32"),
    ("FP32", (2,), [True, False], "not valid FP32"),
    ("FP32", (3,), [1.5, True, 2], np.array([1.5, 1, 2], np.float32)),
    ("FP32", (3,), [1.5, 2.5], "Shape does not match"),
    ("FP32", (2,), [1.5, 2**2000], "out of range for FP32"),
    ("FP64", (2,), [1.5, "2"], "not valid FP64"),
    ("INT8", (2, 1), [[1], [300]], "out of range"),
    ("INT32", (2,), [1, 2.5], "not valid INT32"),
    ("UINT8", (2,), [[1, -1]], "out of range"),
])
def test_json_regular_data_in_one_step_and_the_rest_element_by_element_agree(datatype, shape, data, expected):
    """Evenly nested numbers go through numpy at once; anything irregular gets the careful path's answer."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning from the FP32 overflow either
        if isinstance(expected, str):
            with pytest.raises(NaiadError) as err:
                array_from_json(datatype, shape, data, "x")
            assert err.value.code is ErrorCode.INVALID_ARG and expected in err.value.message, err.value.message
            return
        got = array_from_json(datatype, shape, data, "x")
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert np.array_equal(got, expected)


@settings(max_examples=300, deadline=None)
@given(
    first=st.floats(),
    rest=st.lists(st.one_of(st.floats(), st.integers(-(2**70), 2**70), st.booleans()), max_size=40),
    datatype=st.sampled_from(["FP32", "FP64"]),
)
def test_a_flat_list_led_by_a_float_decodes_to_numpys_values(first, rest, datatype):
    """Such a list is packed without numpy's float64 array: the same bits (rounded from the double,
    +-inf past FP32's range, NaN kept), the same dtype, and no warning."""
    data = [first, *rest]
    with np.errstate(over="ignore"):
        expected = np.asarray(data, dtype=np.float64).astype(np.float32 if datatype == "FP32" else np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = array_from_json(datatype, (1, len(data)), data, "x")
    assert got.dtype == expected.dtype and got.shape == (1, len(data))
    assert got.tobytes() == expected.tobytes()
    got[0, 0] = 0  # a writable array of its own, as numpy's conversion gives
    usual = usual_float_array(datatype, [1, len(data)], data)
    if usual is not None:  # the same array in one call (None: array_from_json decides)
        assert usual.dtype == expected.dtype and usual.shape == (1, len(data)) and usual.tobytes() == expected.tobytes()
        usual[0, 0] = 0


_MANY = [0.5 + i for i in range(PACKED_MAX + 1)]


@pytest.mark.parametrize("datatype,raw_shape,data,packed", [
    ("FP32", [1, 3], [0.5, 0.25, -2.0], True),
    ("FP64", [3], [0.5, 2, True], True),  # (what follows the first float: as array_from_json takes it)
    ("FP32", [1, 2], [0.5, 1e39], False),  # past FP32's range: array_from_json makes it +inf
    ("FP64", [1, 2], [0.5, 1e39], True),
    ("FP32", [2, True], [0.5, 1.0], False),  # a bool is no dimension
    ("FP32", [2.0], [0.5, 1.0], False),
    ("FP32", [-1, -2], [0.5, 1.0], False),
    ("FP32", (2,), [0.5, 1.0], False),  # (a JSON shape is a list)
    ("FP32", [3], [0.5, 1.0], False),
    ("FP32", [0], [], False),
    ("FP32", [2], [1, 0.5], False),  # led by an integer: numpy's conversion, in array_from_json
    ("FP32", [2], [0.5, "1"], False),
    ("FP32", [2], [0.5, None], False),
    ("FP32", [1], [[0.5]], False),
    ("FP32", [2], [0.5, 2**2000], False),
    ("FP32", [2], (0.5, 1.0), False),
    ("FP32", [1, PACKED_MAX + 1], _MANY, False),
    ("FP16", [1], [0.5], False),
    ("INT32", [1], [0.5], False),
    ("NOPE", [1], [0.5], False),
])
def test_the_usual_float_input_is_packed_in_one_call_or_left_to_the_general_path(datatype, raw_shape, data, packed):
    """usual_float_array never raises: it gives what parse_shape and array_from_json would, or None
    (they then decide, and word any error)."""
    got = usual_float_array(datatype, raw_shape, data)
    assert (got is not None) == packed
    if packed:
        expected = array_from_json(datatype, parse_shape(raw_shape, "x"), data, "x")
        assert got.dtype == expected.dtype and got.shape == tuple(raw_shape) and got.tobytes() == expected.tobytes()
        assert all(type(dim) is int for dim in got.shape)
        got.flat[0] = 7.0  # writable, its own memory
        assert got.flat[0] == 7.0


@pytest.mark.parametrize("datatype,dtype", [("FP32", np.float32), ("FP64", np.float64)])
def test_a_long_float_list_is_packed_by_the_array_module_with_the_same_values(datatype, dtype):
    for data in (_MANY, [1e39, *_MANY]):
        got = array_from_json(datatype, (1, len(data)), data, "x")
        with np.errstate(over="ignore"):
            expected = np.asarray(data).astype(dtype).reshape(1, len(data))
        assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes()
        got[0, 0] = 0
