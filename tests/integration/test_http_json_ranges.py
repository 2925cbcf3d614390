"""Every datatype's full range through JSON, both ways, on the real server with identity models:
integer bounds exact (UINT64 max is not a float), out-of-range integers a clear 400, float
extremes kept, NaN / Infinity read and written with the literals Triton's JSON uses."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support.onnx_models import identity_model
from tests.support.python_models import write_params_model
from tests.support.servers import RunningServer, start_server

INTEGERS = ["INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"]
FLOATS = ["FP32", "FP64"]




@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("json_ranges") / "models"
    for datatype in [*INTEGERS, *FLOATS, "BOOL"]:
        identity_model(repo, f"id_{datatype.lower()}", datatype, [-1])
    write_params_model(repo)
    with start_server(repo) as running:
        yield running


def post_infer(server: RunningServer, datatype: str, data_text: str, count: int) -> tuple[int, bytes]:
    """POST a JSON infer whose `data` is given as raw JSON text (so literals go out exactly as written)."""
    body = (
        '{"inputs":[{"name":"INPUT0","datatype":"%s","shape":[1,%d],"data":%s}]}' % (datatype, count, data_text)
    ).encode()
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        conn.request("POST", f"/v2/models/id_{datatype.lower()}/infer", body=body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def output_data_text(body: bytes) -> bytes:
    """The raw JSON text of the first output's `data` array."""
    start = body.index(b'"data":') + len(b'"data":')
    return body[start : body.index(b"]", start) + 1]


@pytest.mark.parametrize("datatype", INTEGERS)
def test_integer_bounds_round_trip_exactly(server: RunningServer, datatype: str) -> None:
    info = np.iinfo(np.dtype(datatype.lower()))
    values = [int(info.min), int(info.max), 0, 1]
    status, body = post_infer(server, datatype, json.dumps(values), len(values))
    assert status == 200, body
    # written as integers, digit for digit (a double would print 1.8446744073709552e+19 for UINT64 max)
    assert output_data_text(body) == json.dumps(values, separators=(",", ":")).encode()


@pytest.mark.parametrize("datatype", INTEGERS)
def test_integers_out_of_range_are_400(server: RunningServer, datatype: str) -> None:
    info = np.iinfo(np.dtype(datatype.lower()))
    for bad in (int(info.min) - 1, int(info.max) + 1):
        status, body = post_infer(server, datatype, f"[0, {bad}]", 2)
        assert status == 400, body
        message = json.loads(body)["error"]
        if -(2**63) <= bad < 2**64:  # JSON integers past 64 bits are read as doubles: not valid integers
            assert f"value {bad} is out of range for {datatype} [{info.min}, {info.max}]" in message
        else:
            assert f"elements are not valid {datatype} values" in message
    status, body = post_infer(server, datatype, "[1, 2.5]", 2)
    assert status == 400 and f"elements are not valid {datatype} values" in json.loads(body)["error"]
    status, _ = post_infer(server, datatype, "[1, 2]", 2)
    assert status == 200  # still serving


def test_uint64_max_from_the_issue(server: RunningServer) -> None:
    status, body = post_infer(server, "UINT64", "[18446744073709551615, 0]", 2)
    assert status == 200, body
    assert output_data_text(body) == b"[18446744073709551615,0]"


@pytest.mark.parametrize("datatype,values", [
    ("FP32", ["3.4028234663852886e+38", "-3.4028234663852886e+38", "1.401298464324817e-45", "-0.0", "0.5"]),
    ("FP64", ["1.7976931348623157e+308", "-1.7976931348623157e+308", "5e-324", "2.2250738585072014e-308", "-0.0"]),
])
def test_float_extremes_round_trip(server: RunningServer, datatype: str, values: list[str]) -> None:
    status, body = post_infer(server, datatype, "[" + ",".join(values) + "]", len(values))
    assert status == 200, body
    got = json.loads(output_data_text(body))
    wanted = np.array([float(v) for v in values], dtype=datatype.replace("FP", "float"))
    np.testing.assert_array_equal(np.array(got, dtype=wanted.dtype), wanted)
    assert np.signbit(np.array(got, dtype=wanted.dtype)[-1 if datatype == "FP64" else 3])  # -0.0 kept


@pytest.mark.parametrize("datatype", FLOATS)
def test_nan_and_infinity_literals_both_ways(server: RunningServer, datatype: str) -> None:
    # Triton's parser takes NaN, Inf and Infinity with an optional sign; it writes NaN, Infinity, -Infinity.
    status, body = post_infer(server, datatype, "[NaN, Infinity, -Infinity, Inf, -Inf, 1.5]", 6)
    assert status == 200, body
    assert output_data_text(body) == b"[NaN,Infinity,-Infinity,Infinity,-Infinity,1.5]"
    status, body = post_infer(server, datatype, "[1e999, 1]", 2)  # a double cannot hold it
    assert status == 400 and "failed to parse the request JSON buffer" in json.loads(body)["error"]


def test_fp32_past_its_range_becomes_infinity(server: RunningServer) -> None:
    status, body = post_infer(server, "FP32", "[1e39, -1e39]", 2)
    assert status == 200, body
    assert output_data_text(body) == b"[Infinity,-Infinity]"


def test_non_finite_literals_are_not_integers_or_booleans(server: RunningServer) -> None:
    for datatype in ("INT32", "UINT64", "BOOL"):
        status, body = post_infer(server, datatype, "[NaN, 1]", 2)
        assert status == 400 and f"elements are not valid {datatype} values" in json.loads(body)["error"], body
    status, body = post_infer(server, "FP32", "[NaN, 1", 2)  # malformed even with the extension
    assert status == 400 and "failed to parse the request JSON buffer" in json.loads(body)["error"]


def test_tritonclient_json_round_trip(server: RunningServer) -> None:
    """tritonclient's JSON (non-binary) path, as a user would call it."""
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        cases = {
            "UINT64": np.array([[np.iinfo(np.uint64).max, 0]], dtype=np.uint64),
            "INT64": np.array([[np.iinfo(np.int64).min, np.iinfo(np.int64).max]], dtype=np.int64),
            "FP64": np.array([[np.nan, np.inf, -np.inf, np.finfo(np.float64).max]], dtype=np.float64),
            "FP32": np.array([[np.nan, -np.inf, np.finfo(np.float32).tiny]], dtype=np.float32),
        }
        for datatype, array in cases.items():
            inp = httpclient.InferInput("INPUT0", list(array.shape), datatype)
            inp.set_data_from_numpy(array, binary_data=False)
            out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
            result = client.infer(f"id_{datatype.lower()}", [inp], outputs=[out])
            got = result.as_numpy("OUTPUT0")
            assert got.dtype == array.dtype, datatype
            np.testing.assert_array_equal(got, array)
    finally:
        client.close()


def test_request_parameters_past_int64_reach_the_model_as_doubles(server: RunningServer) -> None:
    """As Triton: a custom parameter integer beyond int64 is read as a double, not refused."""
    body = ('{"parameters":{"big":9223372036854775813,"max":18446744073709551615,"low":-9223372036854775809,'
            '"i":-9223372036854775808,"f":1e308},'
            '"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1],"data":[0]}]}')
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        conn.request("POST", "/v2/models/params/infer", body=body.encode())
        response = conn.getresponse()
        status, text = response.status, response.read()
    finally:
        conn.close()
    assert status == 200, text
    seen = json.loads(json.loads(text)["outputs"][0]["data"][0])
    assert seen == {"big": 9.223372036854776e18, "max": 1.8446744073709552e19, "low": -9.223372036854776e18,
                    "i": -(2**63), "f": 1e308}
    assert isinstance(seen["big"], float) and isinstance(seen["i"], int)
