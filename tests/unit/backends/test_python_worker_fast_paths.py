"""The Python-model worker's per-request shortcuts (received inputs, input lookup, freeing a batch's message, the
flat message of a batch of one) behave exactly like the general paths."""

from __future__ import annotations

import asyncio
import pickle
import uuid
import weakref
from typing import Any

import numpy as np
import pytest

import triton_python_backend_utils as pb_utils
from naiad.backends.base import BackendRequest, BackendResponse
from naiad.runtime.process.framing import encode
from naiad.runtime.process.outputs import OutputReader
from naiad.runtime.process.python_host import PythonModelHost
from naiad.runtime.process.session import WorkerSession, _Protocol
from naiad.runtime.process.shm import remove_prefixed
from naiad.runtime.process.tensors import pack, unpack_one

INLINE_GROUPS = [
    [("A", "FP32", np.arange(16, dtype=np.float32).reshape(1, 16)), ("B", "INT64", np.array([[-3, 7]]))],
    [],
    [("C", "BOOL", np.array([True, False, True])), ("D", "FP16", np.ones((2, 2), np.float16)),
     ("E", "BF16", np.array([0x3F80, 0x4000], np.uint16)), ("F", "UINT8", np.arange(200, dtype=np.uint8))],
]


@pytest.fixture
def host(tmp_path):
    model = tmp_path / "1" / "model.py"
    model.parent.mkdir()
    model.write_text("class TritonPythonModel:\n    def execute(self, requests):\n        return []\n")
    prefix = f"npw{uuid.uuid4().hex[:8]}_"
    init = {"prefix": prefix, "decoupled": False, "model_name": "m", "model_version": 3, "model_file": str(model),
            "args": {"model_instance_name": "m_0"}}
    yield PythonModelHost(channel=None, init=init)  # type: ignore[arg-type]
    remove_prefixed(prefix)


def test_received_inputs_match_the_general_unpacking(host):
    groups = [INLINE_GROUPS[0], [("S", "BYTES", np.array([b"x", b"yz"], dtype=np.object_)),
                                 ("Z", "INT32", np.zeros((0, 2), np.int32))]]
    block, metas = pack(None, groups)
    assert block is None
    described = [(f"id{i}", i, 0, "{}", 0, ("OUT",), metas[i]) for i in range(len(groups))]
    requests = host._requests(pickle.loads(pickle.dumps(("x", 5, None, described, []))))
    assert [r.request_id() for r in requests] == ["id0", "id1"]
    assert [r.model_version() for r in requests] == [3, 3]
    for request, group in zip(requests, metas):
        for tensor, meta in zip(request.inputs(), group):
            expected = unpack_one(None, meta, copy=False)
            array = tensor.as_numpy()
            assert tensor.name() == meta[0] and tensor.datatype() == meta[1]
            assert array.dtype == expected.dtype and array.shape == expected.shape
            np.testing.assert_array_equal(array, expected)
            if meta[1] != "BYTES":
                assert array.flags.writeable and array.flags.c_contiguous
    assert pb_utils.get_input_tensor_by_name(requests[0], "B").as_numpy().tolist() == [[-3, 7]]
    assert requests[0].release_flags() == pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL
    assert requests[0].requested_output_names() == ["OUT"]


def test_a_batch_message_is_freed_before_the_worker_waits_for_the_next(host):
    """The previous batch's message (and the input buffers it carries) is released once the batch ran,
    not when the next message arrives (which would put that work on the next request's path)."""

    class Payload:  # stands in for a batch's input buffers
        pass

    payload = Payload()
    gone = weakref.ref(payload)
    messages = [("x", 1, payload)]
    del payload
    seen: list[bool] = []

    class Inbox:
        def next_command(self) -> tuple:
            if messages:
                return messages.pop()
            seen.append(gone() is None)  # waiting for the next message: the last one is gone already
            return ("f",)

    ran: list[int] = []
    host.runtime.inbox = Inbox()
    host._run_batch = lambda message: ran.append(message[1])
    host._finalize = lambda: None
    host._command_loop()
    assert ran == [1] and seen == [True]


def test_input_lookup_by_name_is_the_same_for_received_and_built_requests(host):
    block, metas = pack(None, [INLINE_GROUPS[0]])
    received = host._requests(("x", 1, block, [("", 0, 0, "{}", 0, (), metas[0])], []))[0]
    for name in ("A", "B"):
        expected = next(t for t in received.inputs() if t.name() == name)
        assert pb_utils.get_input_tensor_by_name(received, name) is expected
    assert pb_utils.get_input_tensor_by_name(received, "missing") is None

    class Renamed(pb_utils.Tensor):  # a model's own Tensor subclass: its name() is what counts
        __slots__ = ()

        def name(self) -> str:
            return "renamed"

    tensor = Renamed("A", np.zeros(2, np.float32))
    built = pb_utils.InferenceRequest(model_name="m", inputs=[tensor], requested_output_names=[])
    assert pb_utils.get_input_tensor_by_name(built, "renamed") is tensor
    assert pb_utils.get_input_tensor_by_name(built, "A") is None


def _answer_on_the_server(message: tuple) -> BackendResponse:
    """What the server's session makes of a worker's message finishing batch 1 (one add_sub-like request)."""

    class Pipe:
        def is_closing(self) -> bool:
            return False

        def write(self, data: bytes) -> None:
            pass

    async def run() -> BackendResponse:
        session = WorkerSession("m_0", None, {}, {}, None, f"npw{uuid.uuid4().hex[:8]}_", lambda _: None)  # type: ignore[arg-type]
        session._transport = Pipe()  # type: ignore[assignment]
        session.alive = True
        session.outputs = OutputReader(session.peers, session.release_peer, asyncio.get_running_loop())
        answers: list[BackendResponse] = []
        done = session.submit([BackendRequest({"IN": np.zeros(2, np.float32)}, ["OUT"])], lambda i, r: answers.append(r))
        _Protocol(session).data_received(encode(pickle.loads(pickle.dumps(message))))
        assert done.done() and done.result() == (message[-1] if message[0] == "d" else message[3])
        assert not session._batches  # the batch is complete
        session.pool.close()
        assert len(answers) == 1
        return answers[0]

    return asyncio.run(run())


@pytest.mark.parametrize("parameters", [None, {"note": "x", "n": 2}])
def test_a_batch_of_one_answered_with_small_numbers_goes_flat_and_reads_like_the_general_message(host, parameters):
    sent: list[tuple] = []
    host.channel = type("Channel", (), {"send": staticmethod(sent.append)})()
    request = host._requests(("x", 1, None, [("r", 0, 0, "{}", 0, ("OUT", "I"), [])], []))[0]
    outputs = [pb_utils.Tensor("OUT", np.arange(6, dtype=np.float32).reshape(2, 3).T),  # any layout
               pb_utils.Tensor("I", np.array(5, np.int32)), pb_utils.Tensor("UNASKED", np.ones(2))]
    response = pb_utils.InferenceResponse(outputs, parameters=parameters)
    host._finish(1, [request], [response], (10, 20))
    host._finish(1, [request, request], [response, response], (10, 20))  # the general message, for comparison
    flat, general = sent
    assert flat[0] == "o" and general[0] == "d"
    general = general[:3] + (general[3][:1],) + general[4:]  # its first request's answer only
    by_flat, by_general = _answer_on_the_server(flat), _answer_on_the_server(general)
    assert by_flat.parameters == by_general.parameters == (parameters or {})
    assert by_flat.execution_ns == by_general.execution_ns == (10, 20)
    assert by_flat.final and by_flat.error is None and by_flat.counts_as_failure
    assert sorted(by_flat.outputs) == sorted(by_general.outputs) == ["I", "OUT"]
    for name, array in by_flat.outputs.items():
        expected = by_general.outputs[name]
        assert array.dtype == expected.dtype and array.shape == expected.shape and array.flags.writeable
        np.testing.assert_array_equal(array, expected)
    np.testing.assert_array_equal(by_flat.outputs["OUT"], np.arange(6, dtype=np.float32).reshape(2, 3).T)
    assert by_flat.outputs["I"] == 5


@pytest.mark.parametrize("output", [np.array([b"a"], dtype=np.object_), np.zeros((0, 2), np.float32),
                                    np.zeros(5000, np.float32)])
def test_outputs_the_flat_message_cannot_carry_go_in_the_general_one(host, output):
    sent: list[tuple] = []
    host.channel = type("Channel", (), {"send": staticmethod(sent.append)})()
    request = host._requests(("x", 1, None, [("r", 0, 0, "{}", 0, ("OUT",), [])], []))[0]
    host._finish(1, [request], [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", output)])], (10, 20))
    assert sent[0][0] == "d"
    host.runtime.pool.close()


def test_a_small_output_then_one_too_big_go_together_in_the_general_message(host):
    sent: list[tuple] = []
    host.channel = type("Channel", (), {"send": staticmethod(sent.append)})()
    request = host._requests(("x", 1, None, [("r", 0, 0, "{}", 0, ("A", "B"), [])], []))[0]
    outputs = [pb_utils.Tensor("A", np.ones(4, np.float32)), pb_utils.Tensor("B", np.zeros(5000, np.float32))]
    host._finish(1, [request], [pb_utils.InferenceResponse(outputs)], (10, 20))
    assert sent[0][0] == "d"
    answer = _answer_on_the_server(sent[0])
    assert sorted(answer.outputs) == ["A", "B"] and answer.outputs["B"].shape == (5000,)
    np.testing.assert_array_equal(answer.outputs["A"], np.ones(4, np.float32))
    host.runtime.pool.close()


def _message_sent(requests: list[BackendRequest], input_types: dict[str, str], host: str = "python") -> Any:
    """The message the server's session sends the worker for one batch."""
    written: list[bytes] = []

    class Pipe:
        def is_closing(self) -> bool:
            return False

        def write(self, data: bytes) -> None:
            written.append(data)

    async def run() -> None:
        session = WorkerSession("m_0", None, {"host": host}, input_types, None,  # type: ignore[arg-type]
                                f"npw{uuid.uuid4().hex[:8]}_", lambda _: None)
        session._transport = Pipe()  # type: ignore[assignment]
        session.submit(requests, lambda i, r: None)
        session.pool.close()

    asyncio.run(run())
    return pickle.loads(written[0][4:])


def test_a_batch_of_one_small_numeric_request_goes_flat_and_builds_the_same_request(host):
    inputs = {"A": np.arange(6, dtype=np.float32).reshape(2, 3).T, "B": np.array(5, np.int64),
              "C": np.array([True, False]), "H": np.array([0x3F80], np.uint16)}
    request = BackendRequest(inputs, ["OUT", "X"], request_id="rid", correlation_id="cid", flags=3,
                             parameters={"p": 1}, timeout_us=77)
    types = {"A": "FP32", "B": "INT64", "C": "BOOL", "H": "BF16"}
    flat = _message_sent([request], types)
    general = _message_sent([request, request], types)
    assert flat[0] == "y" and general[0] == "x"
    assert _message_sent([request], types, host="backend")[0] == "x"  # a tensor backend's worker: the general form
    (by_flat,) = host._requests(flat)
    by_general = host._requests(general)[0]
    assert by_flat._handle == by_general._handle == (1, 0)
    assert type(by_flat) is type(by_general) and vars(by_flat).keys() == vars(by_general).keys()  # the same fields set
    for method in ("request_id", "correlation_id", "flags", "parameters", "timeout", "requested_output_names",
                   "model_name", "model_version", "release_flags"):
        assert getattr(by_flat, method)() == getattr(by_general, method)(), method
    assert type(by_flat._requested) is tuple and by_flat.parameters() == '{"p": 1}' and by_flat.timeout() == 77
    assert [t.name() for t in by_flat.inputs()] == ["A", "B", "C", "H"]
    for tensor, expected in zip(by_flat.inputs(), by_general.inputs()):
        assert type(tensor) is type(expected) and tensor.datatype() == expected.datatype()
        array, wanted = tensor._array, expected._array
        assert array.dtype == wanted.dtype and array.shape == wanted.shape and array.flags.writeable
        np.testing.assert_array_equal(array, wanted)
    np.testing.assert_array_equal(by_flat.inputs()[0].as_numpy(), inputs["A"])
    assert by_flat.inputs()[1].as_numpy() == 5


@pytest.mark.parametrize("inputs", [{"S": np.array([b"a"], dtype=np.object_)}, {"A": np.zeros((0, 2), np.float32)},
                                    {"A": np.zeros(5000, np.float32)}, {"A": np.zeros(2, np.float64)}])
def test_inputs_the_flat_message_cannot_carry_go_in_the_general_one(inputs):
    message = _message_sent([BackendRequest(inputs, ["OUT"])], {"S": "BYTES", "A": "FP32"})
    assert message[0] == "x"
