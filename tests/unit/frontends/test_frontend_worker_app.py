"""A frontend worker's HTTP app on Naiad's own connection: the infer fast paths of the single server."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np
import pytest

from naiad.config.server_config import ServerConfig
from naiad.frontends.http.connection import Exchange, HttpConnection
from naiad.frontends.workers import wire
from naiad.frontends.workers.codec import request_from_wire, response_to_wire
from naiad.frontends.workers.core_client import CoreClient
from naiad.frontends.workers.worker_app import WorkerApp
from naiad.protocol.types import InferenceResponse, OutputTensor


class _Core:
    """The core's end of the channel: answers each infer request one turn of the loop later (x + 1)."""

    def __init__(self, client: CoreClient) -> None:
        self.client = client
        self.is_open = True

    def send(self, message: tuple) -> None:
        assert message[0] == wire.INFER
        request = request_from_wire(message[2])
        data = request.inputs[0].data
        assert data is not None
        data = data + 1
        answer = response_to_wire(InferenceResponse(request.model_name, "1", [OutputTensor("Y", "FP32", data.shape, data)]))
        asyncio.get_running_loop().call_soon(self.client.on_message, (wire.RESULT, message[1], answer))

    send_plain = send  # (the usual request: its short form, plain tensors only)


def _connection(app: WorkerApp, written: list[bytes]) -> HttpConnection:
    transport = type("Transport", (), {
        "write": lambda self, data: written.append(bytes(data)), "get_extra_info": lambda self, name, default=None: None,
        "pause_reading": lambda self: None, "resume_reading": lambda self: None, "close": lambda self: None,
    })()
    config = type("Config", (), {"loaded": True, "loaded_app": app, "timeout_keep_alive": 5, "root_path": ""})()
    state = type("State", (), {"connections": set(), "tasks": set(), "default_headers": [], "total_requests": 0})()
    conn = HttpConnection(config, state, {}, asyncio.get_running_loop())
    conn.connection_made(transport)
    return conn


def test_an_infer_takes_the_body_at_hand_and_writes_its_answer_in_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the single server's infer handler: a body that has wholly arrived is taken without a receive(),
    and the answer goes out through the connection's whole-answer writer, one write."""
    calls: dict[str, int] = {"receive": 0, "write_response": 0}
    receive, write_response = Exchange.receive, Exchange.write_response

    async def counted_receive(self: Exchange) -> dict[str, Any]:
        calls["receive"] += 1
        return await receive(self)

    def counted_write_response(self: Exchange, *args: Any) -> bool:
        calls["write_response"] += 1
        return write_response(self, *args)

    monkeypatch.setattr(Exchange, "receive", counted_receive)
    monkeypatch.setattr(Exchange, "write_response", counted_write_response)
    body = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}).encode()
    request = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    async def scenario() -> list[bytes]:
        core = CoreClient()
        core.channel = _Core(core)  # type: ignore[assignment]
        written: list[bytes] = []
        conn = _connection(WorkerApp(ServerConfig(), core), written)
        conn.data_received(request)
        while not written:
            await asyncio.sleep(0.01)
        conn.connection_lost(None)
        return written

    written = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert len(written) == 1 and written[0].startswith(b"HTTP/1.1 200 OK\r\n")
    answer = json.loads(written[0].split(b"\r\n\r\n", 1)[1])
    assert answer["outputs"][0]["name"] == "Y"
    np.testing.assert_array_equal(answer["outputs"][0]["data"], [2, 3])
    assert calls == {"receive": 0, "write_response": 1}


def test_infer_paths_are_matched_once_each_and_the_kept_ones_are_bounded() -> None:
    """The worker routes infer paths through the HTTP port's FastRoutes: each path's (model, version)
    is kept after its first match, for at most PATHS_KEPT paths (clients choose them); a path past the
    bound is still matched, and a path that is not an infer path is not answered as one."""
    from naiad.frontends.http.routes import PATHS_KEPT

    async def scenario() -> WorkerApp:
        return WorkerApp(ServerConfig(), CoreClient())

    app = asyncio.run(scenario())
    fast = app._fast
    target = fast.target("/v2/models/m/versions/3/infer")
    assert target is not None and target[1] == ("m", "3")
    assert fast.target("/v2/models/m/infer/extra") is None
    for index in range(PATHS_KEPT + 10):
        target = fast.target(f"/v2/models/m{index}/infer")
        assert target is not None and target[1] == (f"m{index}", "")
    assert len(fast.known) <= PATHS_KEPT
    assert fast.known[f"/v2/models/m{PATHS_KEPT + 9}/infer"][1] == (f"m{PATHS_KEPT + 9}", "")


def _infer_request(body: bytes) -> bytes:
    return b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


_BODY = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}).encode()


def test_an_infer_body_over_the_limit_is_refused_whether_at_hand_or_still_arriving() -> None:
    """The single server's 400 (and closed connection) for a body past --http-max-input-size, for a body
    wholly arrived as for one still arriving; under the limit, a body arriving in parts is answered."""
    limit = len(_BODY) - 1
    request = _infer_request(_BODY)

    async def answer(config: ServerConfig, parts: list[bytes]) -> bytes:
        core = CoreClient()
        core.channel = _Core(core)  # type: ignore[assignment]
        written: list[bytes] = []
        conn = _connection(WorkerApp(config, core), written)
        for part in parts:
            conn.data_received(part)
            await asyncio.sleep(0.01)
        while not written:
            await asyncio.sleep(0.01)
        conn.connection_lost(None)
        return b"".join(written)

    async def scenario() -> list[bytes]:
        small = ServerConfig(http_max_input_size=limit)
        return [await answer(small, [request]), await answer(small, [request[:-5], request[-5:]]),
                await answer(ServerConfig(), [request[:-5], request[-5:]])]

    at_hand, arriving, under_limit = asyncio.run(asyncio.wait_for(scenario(), 30))
    for written in (at_hand, arriving):
        assert written.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"connection: close" in written.lower()
        message = json.loads(written.split(b"\r\n\r\n", 1)[1])["error"]
        assert message == f"Request JSON size of {len(_BODY)} bytes exceeds the maximum allowed value of {limit} bytes. " \
                          "Use --http-max-input-size to increase the limit."
    assert under_limit.startswith(b"HTTP/1.1 200 OK\r\n")
    np.testing.assert_array_equal(json.loads(under_limit.split(b"\r\n\r\n", 1)[1])["outputs"][0]["data"], [2, 3])


class _Silent:
    """The core's end of the channel, answering nothing: keeps what the worker sends."""

    is_open = True

    def __init__(self) -> None:
        self.messages: list[tuple] = []

    def send(self, message: tuple) -> None:
        self.messages.append(message)

    send_plain = send


def test_a_client_gone_while_its_infer_waits_cancels_it_in_the_core() -> None:
    async def scenario() -> tuple[list[tuple], int]:
        core = CoreClient()
        silent = _Silent()
        core.channel = silent  # type: ignore[assignment]
        conn = _connection(WorkerApp(ServerConfig(), core), [])
        conn.data_received(_infer_request(_BODY))
        while not silent.messages:
            await asyncio.sleep(0.01)
        conn.connection_lost(None)
        for _ in range(20):
            await asyncio.sleep(0)
        return silent.messages, len(core._results)

    before = time.perf_counter_ns()
    messages, waiting = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert [m[0] for m in messages] == [wire.INFER, wire.CANCEL] and messages[1][1] == messages[0][1]
    assert waiting == 0  # nothing of the request stays behind in the worker
    assert before <= messages[0][4] <= time.perf_counter_ns()  # when the worker had it: the core times it from then
