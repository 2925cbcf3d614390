"""The real server over HTTP under hostile input: every client error is a 4xx with a useful message, and it keeps serving."""

from __future__ import annotations

import gzip
import http.client
import json
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.onnx_models import add_sub_model, identity_model
from tests.support.servers import RunningServer, raw_exchange, start_server

LIMIT = 1 << 16


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("http_hostile") / "models"
    add_sub_model(repo, "add_sub", datatype="INT32", dims=4, scheduler="")
    identity_model(repo, "identity_fp32", "FP32", [-1])
    identity_model(repo, "identity_bytes", "BYTES", [-1])
    with start_server(repo, "--http-max-input-size", str(LIMIT)) as running:
        yield running


def call(server: RunningServer, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def error_of(body: bytes) -> str:
    return json.loads(body)["error"]


def good_infer(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        a = np.arange(4, dtype=np.int32).reshape(1, 4)
        inputs = [httpclient.InferInput(f"INPUT{i}", [1, 4], "INT32") for i in (0, 1)]
        for inp in inputs:
            inp.set_data_from_numpy(a)
        result = client.infer("add_sub", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)
    finally:
        client.close()


INPUT = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}

MALFORMED = [
    (b"", "failed to parse the request JSON buffer"),
    (b"{\"inputs\": [", "failed to parse the request JSON buffer"),
    (b"\xff\xfe", "failed to parse the request JSON buffer"),
    (b"null", "expected a JSON object"),
    (b'{"inputs": null}', "Unable to parse 'inputs'"),
    (b'{"inputs": "INPUT0"}', "Unable to parse 'inputs'"),
    (b'{"inputs": [[]]}', "Unable to parse 'inputs'"),
    (json.dumps({"inputs": [dict(INPUT, name=None)]}).encode(), "Unable to parse 'name'"),
    (json.dumps({"inputs": [dict(INPUT, datatype="FLOAT")]}).encode(), "invalid datatype 'FLOAT'"),
    (json.dumps({"inputs": [dict(INPUT, shape=[1, -2])]}).encode(), "non-negative"),
    (json.dumps({"inputs": [dict(INPUT, shape=[1, 2.5])]}).encode(), "non-negative"),
    (json.dumps({"inputs": [dict(INPUT, shape=[True, 2])]}).encode(), "non-negative"),
    (json.dumps({"inputs": [dict(INPUT, shape=[2147483648, 4])]}).encode(), "Shape does not match true shape"),
    (json.dumps({"inputs": [dict(INPUT, shape=[1 << 62, 1 << 62])]}).encode(), "Shape does not match true shape"),
    (json.dumps({"inputs": [dict(INPUT, data=[1, 2, 3])]}).encode(), "Shape does not match true shape"),
    (json.dumps({"inputs": [dict(INPUT, data=[[1], [2, 3]])]}).encode(), "unable to parse 'data'"),
    (json.dumps({"inputs": [dict(INPUT, data=["a", "b"])]}).encode(), "unable to parse 'data'"),
    (json.dumps({"inputs": [dict(INPUT, data={"a": 1})]}).encode(), "unable to parse 'data'"),
    (json.dumps({"inputs": [{k: v for k, v in INPUT.items() if k != "data"}]}).encode(), "But no field is set"),
    (json.dumps({"inputs": [dict(INPUT, parameters={"binary_data_size": 8})]}).encode(),
     "But set 'data' 'binary_data_size'"),
    (json.dumps({"inputs": [dict(INPUT, parameters="x")]}).encode(), "Unable to parse 'parameters'"),
    (json.dumps({"inputs": [INPUT], "id": 12}).encode(), "Unable to parse 'id'"),
    (json.dumps({"inputs": [INPUT], "parameters": {"timeout": -5}}).encode(), "Unable to parse 'timeout'"),
    (json.dumps({"inputs": [INPUT], "parameters": {"sequence_end": "yes"}}).encode(), "Unable to parse 'sequence_end'"),
    (json.dumps({"inputs": [INPUT], "parameters": {"binary_data_output": 1}}).encode(),
     "Unable to parse 'binary_data_output'"),
    (json.dumps({"inputs": [INPUT], "parameters": {"x": [1, 2]}}).encode(), "parameter 'x' has invalid type"),
    (json.dumps({"inputs": [INPUT], "parameters": {"triton_x": 1}}).encode(), "reserved for Triton usage"),
    (json.dumps({"inputs": [INPUT], "outputs": [{"name": 7}]}).encode(), "Unable to parse 'name'"),
    (json.dumps({"inputs": [INPUT], "outputs": [{"name": "OUTPUT0", "parameters": {"classification": "2"}}]}).encode(),
     "Unable to set 'classification'"),
    (json.dumps({"inputs": [INPUT], "outputs": [{"name": "OUTPUT0", "parameters": {
        "shared_memory_region": "r", "shared_memory_byte_size": 8, "binary_data": True}}]}).encode(),
     "Output can't set both 'shared_memory_region' and 'binary_data'"),
    (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": ' + b"[" * 120 + b"1"
     + b"]" * 120 + b"}]}", "nested deeper than 100 levels"),
    (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": ' + b"[" * 30000
     + b"]" * 30000 + b"}]}", "failed to parse the request JSON buffer"),
]


@pytest.mark.parametrize("body,message", MALFORMED, ids=[str(i) for i in range(len(MALFORMED))])
def test_malformed_json_is_400(server, body, message):
    status, headers, resp = call(server, "POST", "/v2/models/identity_fp32/infer", body)
    assert status == 400, resp
    assert headers["content-type"] == "application/json"
    assert message in error_of(resp)


def _binary_body(shape: list[int], blob: bytes, size: int | None = None) -> tuple[bytes, dict]:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": shape,
                       "parameters": {"binary_data_size": len(blob) if size is None else size}}]}
    header = json.dumps(doc).encode()
    return header + blob, {"Inference-Header-Content-Length": str(len(header))}


def test_binary_size_mismatches(server):
    blob = np.arange(4, dtype=np.float32).tobytes()
    body, headers = _binary_body([1, 4], blob)
    status, _, resp = call(server, "POST", "/v2/models/identity_fp32/infer", body, headers)
    assert status == 200
    status, _, resp = call(server, "POST", "/v2/models/identity_fp32/infer", body[:-5], headers)
    assert status == 400
    assert error_of(resp) == "unexpected size for input 'INPUT0', expecting 5 additional bytes for model 'identity_fp32'"
    status, _, resp = call(server, "POST", "/v2/models/identity_fp32/infer", body + b"\0", headers)
    assert status == 400 and error_of(resp) == "unexpected additional input data for model 'identity_fp32'"
    body, headers = _binary_body([2147483648, 4], blob)
    status, _, resp = call(server, "POST", "/v2/models/identity_fp32/infer", body, headers)
    assert status == 400 and "unexpected total byte size 16 for input 'INPUT0'" in error_of(resp)
    body, headers = _binary_body([1, 4], blob, size=1 << 40)
    status, _, resp = call(server, "POST", "/v2/models/identity_fp32/infer", body, headers)
    assert status == 400 and "unexpected size for input 'INPUT0'" in error_of(resp)


def test_hostile_bytes_elements(server):
    doc = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 2], "parameters": {"binary_data_size": 8}}]}
    header = json.dumps(doc).encode()
    body = header + b"\xff\xff\xff\x7fabcd"
    status, _, resp = call(server, "POST", "/v2/models/identity_bytes/infer", body,
                           {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400 and "INPUT0" in error_of(resp)


@pytest.mark.parametrize("value", ["abc", "-3", "1000000", "0x10", "1.5"])
def test_bad_inference_header_length(server, value):
    body, _ = _binary_body([1, 1], b"\0" * 4)
    status, _, resp = call(server, "POST", "/v2/models/identity_fp32/infer", body,
                           {"Inference-Header-Content-Length": value})
    assert status == 400
    assert error_of(resp) == f"inference header size should be in range (0, {len(body)}), got: {value}"


def test_unsupported_content_encoding(server):
    status, headers, resp = call(server, "POST", "/v2/models/identity_fp32/infer", b"{}", {"Content-Encoding": "br"})
    assert status == 400 and "Unsupported compression type 'br'" in error_of(resp)
    assert headers["accept-encoding"] == "gzip, deflate"
    status, _, resp = call(server, "POST", "/v2/models/identity_fp32/infer", b"not gzip", {"Content-Encoding": "gzip"})
    assert status == 400 and "unable to decompress the request body" in error_of(resp)


def test_body_over_limit_refused_before_reading(server):
    data = raw_exchange(server.http_port, b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: t\r\n"
                                b"Content-Length: 4294967296\r\n\r\n")
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"connection: close" in head.lower()
    assert error_of(body) == (
        f"Request JSON size of 4294967296 bytes exceeds the maximum allowed value of {LIMIT} bytes. "
        "Use --http-max-input-size to increase the limit."
    )


def test_tritonclient_sees_the_size_limit_message(server):
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        inp = httpclient.InferInput("INPUT0", [1, LIMIT], "FP32")
        inp.set_data_from_numpy(np.zeros((1, LIMIT), np.float32))
        with pytest.raises(InferenceServerException) as info:
            client.infer("identity_fp32", [inp])
        assert info.value.status() == "400"
        assert "exceeds the maximum allowed value of 65536 bytes" in info.value.message()
    finally:
        client.close()
    good_infer(server)


def test_chunked_body_over_limit(server):
    chunk = b"%x\r\n" % 8192 + b" " * 8192 + b"\r\n"
    data = raw_exchange(server.http_port, b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: t\r\n"
                                b"Transfer-Encoding: chunked\r\n\r\n", [chunk] * (LIMIT // 8192 + 8))
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert "exceeds the maximum allowed value" in error_of(body)


def test_chunked_body_within_limit_works(server):
    doc = json.dumps({"inputs": [INPUT]}).encode()
    chunks = [b"%x\r\n" % len(doc[i:i + 7]) + doc[i:i + 7] + b"\r\n" for i in range(0, len(doc), 7)] + [b"0\r\n\r\n"]
    data = raw_exchange(server.http_port, b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                                b"Transfer-Encoding: chunked\r\n\r\n", chunks)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), data
    assert json.loads(body)["outputs"][0]["data"] == [1.0, 2.0]


def test_decompressed_size_is_capped(server):
    bomb = gzip.compress(b" " * (LIMIT * 64))
    assert len(bomb) < LIMIT
    status, _, resp = call(server, "POST", "/v2/models/identity_fp32/infer", bomb, {"Content-Encoding": "gzip"})
    assert status == 400 and "exceeds the maximum allowed value" in error_of(resp)
    small = gzip.compress(json.dumps({"inputs": [INPUT]}).encode())
    status, _, resp = call(server, "POST", "/v2/models/identity_fp32/infer", small, {"Content-Encoding": "gzip"})
    assert status == 200 and json.loads(resp)["outputs"][0]["data"] == [1.0, 2.0]


def test_huge_header_refused(server):
    data = raw_exchange(server.http_port, b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\nX-Filler: ", [b"x" * 16384] * 32)
    assert data.startswith(b"HTTP/1.1 431")
    assert b"request headers exceed the maximum" in data
    # ~110 KB of headers in the read that starts the request count against the 64 KiB limit too.
    filler = b"".join(b"X-Filler-%03d: %s\r\n" % (i, b"y" * 1000) for i in range(110))
    data = raw_exchange(server.http_port, b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n" + filler + b"\r\n")
    assert data.startswith(b"HTTP/1.1 431") and b"exceed the maximum of 65536 bytes" in data
    good_infer(server)


def test_invalid_chunk_size_is_400(server):
    head = b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    data = raw_exchange(server.http_port, head, [b"2\r\n{\"\r\nxyz\r\n"])
    assert data.startswith(b"HTTP/1.1 400") and b"Invalid HTTP request received" in data
    assert data.count(b"HTTP/1.1 ") == 1
    good_infer(server)


def test_garbage_is_400(server):
    data = raw_exchange(server.http_port, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 garbage\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 400")


def test_other_routes_refuse_bad_bodies(server):
    status, _, resp = call(server, "POST", "/v2/repository/index", b"[1,")
    assert status == 400 and "failed to parse the request JSON buffer" in error_of(resp)
    status, _, resp = call(server, "POST", "/v2/systemsharedmemory/region/r/register", b'{"key": 5, "byte_size": 4}')
    assert status == 400 and "Unable to parse 'key'" in error_of(resp)
    data = raw_exchange(server.http_port, b"POST /v2/repository/index HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 400") and b"Use --http-max-input-size" in data


def test_storm_of_bad_requests_then_good_ones(server):
    bodies = [body for body, _ in MALFORMED[:20]]
    errors: list[BaseException] = []

    def storm(offset: int) -> None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
            for i in range(40):
                conn.request("POST", "/v2/models/identity_fp32/infer", body=bodies[(i + offset) % len(bodies)])
                response = conn.getresponse()
                response.read()
                assert response.status == 400
            conn.close()
            good_infer(server)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=storm, args=(k,)) for k in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    good_infer(server)
    status, _, body = call(server, "GET", "/v2/health/ready")
    assert (status, body) == (200, b"")
