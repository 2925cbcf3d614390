"""The frontend workers' channel and codec: frames of any size in order, flat infer tuples that round-trip."""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
import subprocess
import sys
from collections.abc import AsyncIterator

import msgspec
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from naiad.config.server_config import ServerConfig
from naiad.frontends.grpc.infer_codec import decode_infer_request
from naiad.frontends.workers import channel as channel_module
from naiad.frontends.workers import wire
from naiad.frontends.workers.channel import Channel, UnsendableMessage, encode_frame, read_frame
from naiad.frontends.workers.codec import (
    request_from_wire,
    request_to_wire,
    response_from_wire,
    response_to_wire,
    tensor_from_wire,
    tensor_to_wire,
    wire_request,
    wire_response,
)
from naiad.frontends.workers.core_client import CoreClient
from naiad.frontends.workers.dispatcher import Dispatcher
from naiad.observability import trace_context
from naiad.observability.trace_context import REMOTE_TRACEPARENT
from naiad.protocol.errors import ErrorCode, NaiadError
from naiad.protocol.types import (
    InferenceRequest,
    InferenceResponse,
    InferInput,
    OutputTensor,
    RequestedOutput,
    SharedMemoryRef,
)


def test_frames_of_every_size_arrive_whole_and_in_order() -> None:
    sizes = [0, 1, 100, 70_000, 3_000_000, 5, 1 << 16, 2_000_000] + [10] * 500

    async def scenario() -> list[object]:
        ours, theirs = socket.socketpair()
        received: list[object] = []
        sender = await Channel.open(ours, lambda message: None)
        receiver = await Channel.open(theirs, received.append)
        for index, size in enumerate(sizes):
            sender.send((index, b"x" * size))
        while len(received) < len(sizes):
            await asyncio.sleep(0.01)
        sender.close()
        await asyncio.wait_for(receiver.closed, 10)  # the peer going away resolves `closed`
        return received

    received = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert [(index, len(body)) for index, body in received] == list(enumerate(sizes))


def test_a_message_nested_too_deeply_is_refused_and_the_channel_keeps_working() -> None:
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(UnsendableMessage):
        encode_frame(deep)
    ours, theirs = socket.socketpair()
    ours.sendall(encode_frame({"settings": 1}))
    assert read_frame(theirs) == {"settings": 1}
    ours.close()
    with pytest.raises(EOFError):
        read_frame(theirs)


def test_plain_infers_and_results_arrive_as_the_tuples_a_pickle_gives_back() -> None:
    """The short forms of plain tensors travel as MessagePack (cheaper to write than a pickle), a run of
    one kind in one frame, and come back as the same tuples, in order; a value MessagePack does not
    carry (a numpy integer in a shape) is pickled."""
    ones = np.ones((1, 16), np.float32)
    request, plain = wire_request(InferenceRequest("add_sub", [InferInput("INPUT0", "FP32", (1, 16), ones),
                                                               InferInput("INPUT1", "INT8", (2,), np.array([1, -1], np.int8))]))
    assert plain and len(request) == 4
    response, plain = wire_response(InferenceResponse("add_sub", "1", [OutputTensor("OUTPUT0", "FP32", (1, 16), ones)]))
    assert plain and response[3] is None
    odd_shape = (np.int64(1), 16)  # equal to the array's shape, so short, but not MessagePack's
    odd, plain = wire_request(InferenceRequest("m", [InferInput("X", "FP32", odd_shape, ones)]))  # type: ignore[arg-type]
    assert plain
    # runs of one kind (one frame each: 1, 20 and 3 messages), broken by another kind or a pickled message
    messages = [(wire.INFER, 1, request, "00-trace", 5), (wire.RESULT, 2, response), (wire.INFER, 3, odd, "", 6),
                (wire.CANCEL, 4), (wire.RESULT, (1 << 70), response)]  # (an id past 64 bits: pickled)
    messages += [(wire.RESULT, 10 + index, response) for index in range(20)] + [(wire.INFER, 40, request, "", 7)] * 3

    async def scenario() -> list[object]:
        ours, theirs = socket.socketpair()
        received: list[object] = []
        sender = await Channel.open(ours, lambda message: None)
        receiver = await Channel.open(theirs, received.append)
        for message in messages:
            (sender.send if message[0] == wire.CANCEL else sender.send_plain)(message)
        while len(received) < len(messages):
            await asyncio.sleep(0.01)
        sender.close()
        receiver.close()
        return received

    received = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert received == [pickle.loads(pickle.dumps(message, protocol=5)) for message in messages]
    assert type(received[2][2][3][0][2][0]) is np.int64  # (the pickled one kept its type)
    assert request_from_wire(received[0][2]).inputs[1].data.tolist() == [1, -1]
    assert response_from_wire(received[1][2]).outputs[0].data.shape == (1, 16)


def test_a_turn_that_goes_on_sending_writes_once_its_first_message_waited_long_enough(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The messages of one turn go out in one write at its end, unless the turn goes on sending: once
    the first unwritten one waited FLUSH_AFTER_NS, what is there is written at once (the peer can start
    on it), and the rest still arrive, in order, at the turn's end."""
    now = [0]
    monkeypatch.setattr(channel_module, "_clock_ns", lambda: now[0])
    result = (wire.RESULT, 1, wire_response(InferenceResponse("m", "1", []))[0])

    async def scenario() -> tuple[bytes, bytes, bytes, list[object]]:
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        sender = await Channel.open(ours, lambda message: None)
        sender.send_plain(result)
        now[0] += channel_module.FLUSH_AFTER_NS - 1
        sender.send_plain(result)
        quick = _available(theirs)  # not yet: the first message waited just under the limit
        now[0] += 1
        sender.send_plain(result)
        early = _available(theirs)  # all three, in this turn
        sender.send_plain(result)
        sender.send((wire.CANCEL, 9))
        held = _available(theirs)  # a new first message: held for the turn's end
        await asyncio.sleep(0)
        rest = _available(theirs)
        sender.close()
        received: list[object] = []
        into, out_of = socket.socketpair()
        receiver = await Channel.open(out_of, received.append)
        into.sendall(early + rest)
        while len(received) < 5:
            await asyncio.sleep(0.01)
        into.close()
        receiver.close()
        return quick, early, held, received

    quick, early, held, received = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert quick == b"" and held == b""
    assert early.startswith(struct.pack("<I", len(early) - 4))  # one frame: the run of three results
    expected = [result] * 4 + [(wire.CANCEL, 9)]
    assert received == [pickle.loads(pickle.dumps(message, protocol=5)) for message in expected]


def _available(sock: socket.socket) -> bytes:
    try:
        return sock.recv(1 << 20)
    except BlockingIOError:
        return b""


def test_only_the_short_forms_of_plain_tensors_are_plain() -> None:
    ones = np.ones((1, 2), np.float32)
    for request in (InferenceRequest("m", [InferInput("X", "FP32", (1, 2), ones, {"p": 1})]),
                    InferenceRequest("m", [InferInput("X", "FP32", (2,), ones)]),
                    InferenceRequest("m", [InferInput("X", "BYTES", (1,), np.array([b"a"], np.object_))]),
                    InferenceRequest("m", [InferInput("X", "FP32", (1, 2), ones)], priority=1)):
        assert wire_request(request)[1] is False
    for response in (InferenceResponse("m", "1", [OutputTensor("Y", "FP32", (1, 2), ones)], parameters={"p": 1}),
                     InferenceResponse("m", "1", [OutputTensor("Y", "FP32", (1, 2), None)])):
        assert wire_response(response)[1] is False


def test_requests_round_trip_through_the_flat_tuple() -> None:
    words = np.array([b"a", b"bc"], dtype=np.object_).reshape(1, 2)
    request = InferenceRequest(
        "model", [InferInput("X", "FP32", (2, 3), np.arange(6, dtype=">f4").reshape(2, 3)[:, ::-1], {"p": 1}),
                  InferInput("W", "BYTES", (1, 2), words),
                  InferInput("S", "INT32", (1, 4), None, {}, SharedMemoryRef("inputs", 16, 32))],
        model_version="2", id="r1",
        outputs=[RequestedOutput("Y", {"q": True}, 3, SharedMemoryRef("region", 16, 8))],
        parameters={"k": [1, {"deep": "x"}]}, priority=2, timeout_us=5, sequence_id="s", sequence_start=True)
    back = request_from_wire(request_to_wire(request))
    assert back.model_name == "model" and back.model_version == "2" and back.id == "r1"
    np.testing.assert_array_equal(back.inputs[0].data, request.inputs[0].data)
    assert back.inputs[0].data.dtype == np.dtype(">f4") and back.inputs[0].parameters == {"p": 1}
    assert back.inputs[1].data.tolist() == [[b"a", b"bc"]]
    assert back.inputs[2].data is None and back.inputs[2].shared_memory == SharedMemoryRef("inputs", 16, 32)
    assert back.outputs == request.outputs
    assert (back.parameters, back.priority, back.timeout_us) == (request.parameters, 2, 5)
    assert (back.sequence_id, back.sequence_start, back.sequence_end) == ("s", True, False)


def test_responses_round_trip_through_the_flat_tuple() -> None:
    response = InferenceResponse("model", "1", [OutputTensor("A", "INT64", (1, 2), np.array([[1, 2]])),
                                                OutputTensor("B", "FP32", (1, 4), None, {"shm": 1}),
                                                OutputTensor("C", "FP32", [2], np.ones(2, np.float32)),
                                                OutputTensor("D", "INT8", (2,), np.ones(2, np.int8), {"p": 1})],
                                 id="r", parameters={"x": "y"})
    wired = pickle.loads(pickle.dumps(response_to_wire(response), protocol=5))
    assert [len(o) for o in wired[4]] == [5, 6, 6, 6]  # only a plain tensor of its array's shape takes the short form
    back = response_from_wire(wired)
    assert (back.model_name, back.model_version, back.id, back.parameters) == ("model", "1", "r", {"x": "y"})
    np.testing.assert_array_equal(back.outputs[0].data, [[1, 2]])
    assert back.outputs[0].shape == (1, 2) and back.outputs[0].parameters == {}
    assert back.outputs[1].data is None and back.outputs[1].parameters == {"shm": 1}
    assert back.outputs[2].shape == [2] and back.outputs[2].data.shape == (2,)  # a list shape stays a list
    assert back.outputs[3].parameters == {"p": 1} and back.outputs[3].data.dtype == np.int8


@pytest.mark.parametrize("array", [np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros((0, 16), np.int8),
                                   np.array(7, np.int64), np.array([[True, False]]), np.arange(4, dtype=np.uint16),
                                   np.arange(3, dtype=np.longlong), np.arange(3, dtype=np.float16),
                                   np.frombuffer(np.arange(4, dtype=np.uint64).tobytes(), "=u8")])
def test_flat_tensors_come_back_as_read_only_arrays_of_their_dtype_and_shape(array: np.ndarray) -> None:
    wired = pickle.loads(pickle.dumps(tensor_to_wire(array), protocol=5))
    assert isinstance(wired, tuple)
    back = tensor_from_wire(wired)
    assert back.dtype == array.dtype and back.shape == array.shape and not back.flags.writeable
    np.testing.assert_array_equal(back, array)


def test_a_worker_process_loads_no_model_machinery() -> None:
    """A worker decodes and encodes only: the core, schedulers, backends and frameworks stay in the core process."""
    probe = ("import sys, naiad.frontends.workers.worker_main; "
             "print(sorted(m for m in sys.modules if m.split('.')[:2] in (['naiad', 'core'], ['naiad', 'scheduling'], "
             "['naiad', 'backends'], ['naiad', 'runtime']) or m in ('onnxruntime', 'torch')))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert loaded.stdout.strip() == "[]"


def test_a_worker_freezes_its_start_up_heap_before_it_reports_ready() -> None:
    """As the core does: a full collection walking the worker's start-up objects paused its event loop
    for tens of milliseconds under load. The probe reports gc.get_freeze_count() when READY is sent."""
    probe = ("import gc, sys\n"
             "from naiad.frontends.workers import channel, wire, worker_main\n"
             "send = channel.Channel.send\n"
             "def reporting(self, message):\n"
             "    if message[0] == wire.READY:\n"
             "        print('frozen', gc.get_freeze_count(), flush=True)\n"
             "    send(self, message)\n"
             "channel.Channel.send = reporting\n"
             "worker_main.main(sys.argv[1:])\n")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    listen = socket.socket()
    listen.bind(("127.0.0.1", 0))
    listen.listen()
    process = None
    try:
        ours.sendall(encode_frame(ServerConfig(http_address="127.0.0.1", http_port=listen.getsockname()[1])))
        process = subprocess.Popen([sys.executable, "-c", probe, str(theirs.fileno()), str(listen.fileno()), "0"],
                                   pass_fds=(theirs.fileno(), listen.fileno()), stdout=subprocess.PIPE, text=True)
        theirs.close()
        ours.settimeout(60)
        assert read_frame(ours)[0] == wire.READY
        assert process.stdout is not None
        line = process.stdout.readline().split()
        assert line[0] == "frozen" and int(line[1]) > 1000, line
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)
        ours.close()
        listen.close()


class _Sent:
    """Stands in for the core's end of a channel: keeps what the dispatcher sends, as the worker would read it."""

    def __init__(self) -> None:
        self.messages: list[tuple] = []

    def send(self, message: tuple) -> None:
        self.messages.append(pickle.loads(encode_frame(message)[4:]))

    def send_plain(self, message: tuple) -> None:
        self.messages.append(msgspec.msgpack.decode(msgspec.msgpack.encode(message), type=wire.PLAIN[message[0]]))


def test_a_relayed_request_streams_the_core_apps_messages_then_done() -> None:
    async def app(scope, receive, send) -> None:
        request = await receive()
        assert scope["path"] == "/v2/x" and request["body"] == b"in"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"3")]})
        await send({"type": "http.response.body", "body": memoryview(b"out"), "more_body": False})

    async def failing_app(scope, receive, send) -> None:
        raise RuntimeError("a bug")

    async def scenario() -> tuple[list[tuple], list[tuple]]:
        results = []
        for handler in (app, failing_app):
            dispatcher = Dispatcher(None, handler, None)  # type: ignore[arg-type]
            sent = _Sent()
            dispatcher.channel = sent  # type: ignore[assignment]
            dispatcher.on_message((wire.RELAY, 7, {"type": "http", "path": "/v2/x", "headers": []}, b"in"))
            while not sent.messages or sent.messages[-1][0] != wire.DONE:
                await asyncio.sleep(0.01)
            results.append(sent.messages)
        return results[0], results[1]

    answered, failed = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert [m[0] for m in answered] == [wire.ASGI, wire.ASGI, wire.DONE]
    assert answered[1][2]["body"] == b"out"  # a memoryview body is sent as bytes
    assert failed == [(wire.DONE, 7)]  # the worker answers 503 when the core's app sent nothing


class _OpenChannel(_Sent):
    is_open = True


def test_a_relayed_grpc_stream_sends_at_most_the_window_ahead_of_the_core() -> None:
    async def scenario() -> tuple[int, int, list[bytes], list[str]]:
        core = CoreClient()
        channel = _OpenChannel()
        core.channel = channel  # type: ignore[assignment]

        async def flood() -> AsyncIterator[bytes]:
            for i in range(wire.STREAM_WINDOW + 10):
                yield b"m%d" % i

        responses: list[bytes] = []

        async def consume() -> None:
            async for response in core.grpc_call("/inference.GRPCInferenceService/ModelStreamInfer", (),
                                                 requests=flood()):
                responses.append(response)

        call = asyncio.ensure_future(consume())

        def sent() -> int:
            return sum(1 for m in channel.messages if m[0] == wire.GRPC_MESSAGE)

        for _ in range(20):
            await asyncio.sleep(0)
        held = sent()
        request_id = channel.messages[0][1]
        for _ in range(4):
            core.on_message((wire.GRPC_TAKEN, request_id))
        for _ in range(20):
            await asyncio.sleep(0)
        after_reads = sent()
        core.on_message((wire.GRPC_OUT, request_id, b"r"))
        core.on_message((wire.GRPC_END, request_id, "OK", ""))
        await call
        return held, after_reads, responses, [m[0] for m in channel.messages]

    held, after_reads, responses, kinds = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert held == wire.STREAM_WINDOW  # the core read none: the rest of the client's messages wait
    assert after_reads == wire.STREAM_WINDOW + 4
    assert responses == [b"r"]
    assert kinds[0] == wire.GRPC_CALL and wire.CANCEL not in kinds  # ended by the core: nothing to cancel


class _Inference:
    """An inference interface answering at once (an inline model) or once released (a queued one).

    A request's "fail" parameter makes it fail after it waited: "naiad" with a NaiadError, "bug" with
    another exception; "trace" answers the traceparent the request ran with (in the response's id)."""

    def __init__(self) -> None:
        self.waiting: dict[str, asyncio.Future[None]] = {}
        self.cancelled = 0

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        if request.model_name == "trace":
            return InferenceResponse("trace", "1", [], REMOTE_TRACEPARENT.get())
        if request.model_name == "queued":
            self.waiting[request.id] = asyncio.get_running_loop().create_future()
            try:
                await self.waiting[request.id]
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            if request.parameters.get("yield"):
                await asyncio.sleep(0)  # a bare yield: the request goes on in a task
            if request.parameters.get("fail") == "naiad":
                raise NaiadError(ErrorCode.UNAVAILABLE, "gone away")
            if request.parameters.get("fail") == "bug":
                raise RuntimeError("a bug")
        return InferenceResponse(request.model_name, "1", [], request.id)


def test_an_inline_infer_is_answered_in_the_turn_that_read_it_and_a_waiting_one_stays_cancellable() -> None:
    def infer_message(request_id: int, model: str) -> tuple:
        return (wire.INFER, request_id, request_to_wire(InferenceRequest(model, [], id=str(request_id))), "", 0)

    async def scenario() -> tuple[list[tuple], int, int, list[tuple], int]:
        inference = _Inference()
        dispatcher = Dispatcher(inference, None, None)  # type: ignore[arg-type]
        sent = _Sent()
        dispatcher.channel = sent  # type: ignore[assignment]
        dispatcher.on_message(infer_message(1, "inline"))
        answered_at_once = list(sent.messages)  # no task, no turn of the loop
        in_flight_inline = len(dispatcher.tasks)
        dispatcher.on_message(infer_message(2, "queued"))
        dispatcher.on_message(infer_message(3, "queued"))  # cancelled before it is released
        in_flight_queued = len(dispatcher.tasks)
        dispatcher.on_message((wire.CANCEL, 3))
        for _ in range(5):
            await asyncio.sleep(0)
        inference.waiting["2"].set_result(None)
        while len(sent.messages) < 2:
            await asyncio.sleep(0.01)
        return answered_at_once, in_flight_inline, in_flight_queued, sent.messages, inference.cancelled

    at_once, inline_left, queued, messages, cancelled = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert [(m[0], m[1]) for m in at_once] == [(wire.RESULT, 1)]
    assert inline_left == 0 and queued == 2
    assert cancelled == 1  # request 3: its client went away while it waited
    assert [(m[0], m[1]) for m in messages] == [(wire.RESULT, 1), (wire.RESULT, 2)]


def test_a_released_infer_goes_on_in_the_callback_of_what_it_waited_on_with_no_task() -> None:
    """As the single server's frontends do: once the model answers, the request's next step runs in the
    answer's own callback (a task would answer one turn of the loop later); a bare yield still gets a task."""
    def infer_message(request_id: int, parameters: dict) -> tuple:
        request = InferenceRequest("queued", [], id=str(request_id), parameters=parameters)
        return (wire.INFER, request_id, request_to_wire(request), "", 0)

    async def scenario() -> tuple[list[tuple], int, list[tuple], int]:
        inference = _Inference()
        dispatcher = Dispatcher(inference, None, None)  # type: ignore[arg-type]
        sent = _Sent()
        dispatcher.channel = sent  # type: ignore[assignment]
        dispatcher.on_message(infer_message(1, {}))
        dispatcher.on_message(infer_message(2, {"yield": True}))
        inference.waiting["1"].set_result(None)
        inference.waiting["2"].set_result(None)
        tasks_before = len(asyncio.all_tasks())
        await asyncio.sleep(0)  # one turn: the futures' callbacks run
        after_one_turn = list(sent.messages)
        tasks_then = len(asyncio.all_tasks()) - tasks_before
        while len(sent.messages) < 2:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)
        return after_one_turn, tasks_then, sent.messages, len(dispatcher.tasks)

    after_one_turn, new_tasks, messages, left = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert [(m[0], m[1]) for m in after_one_turn] == [(wire.RESULT, 1)]
    assert new_tasks == 1  # request 2's, after its bare yield; none for request 1
    assert [(m[0], m[1]) for m in messages] == [(wire.RESULT, 1), (wire.RESULT, 2)]
    assert left == 0  # nothing of either request stays behind


def test_tensors_the_decoders_make_travel_flat_not_pickled() -> None:
    """np.frombuffer over a protobuf field or an HTTP body gives native but not "builtin" dtypes
    (the gRPC and binary HTTP decoders'): they travel as (name, datatype, shape, dtype, bytes), 5x cheaper to pickle."""
    message = pb.ModelInferRequest(model_name="m", raw_input_contents=[np.arange(4, dtype="<f4").tobytes()])
    message.inputs.add(name="X", datatype="FP32", shape=[1, 4])
    decoded = decode_infer_request(pb.ModelInferRequest.FromString(message.SerializeToString()), False)
    wired = request_to_wire(decoded)
    assert len(wired) == 4  # no outputs, parameters, priority, timeout nor sequence: the short form
    tensor = wired[3][0]
    assert tensor[:4] == ("X", "FP32", (1, 4), "f") and isinstance(tensor[4], bytes) and len(tensor) == 5
    back = request_from_wire(pickle.loads(pickle.dumps(wired, protocol=5)))
    assert back.inputs[0].data.dtype == np.float32
    np.testing.assert_array_equal(back.inputs[0].data, [[0, 1, 2, 3]])
    big_endian = np.arange(3, dtype=">i4")  # not native: pickled as it is, and still right
    assert isinstance(tensor_to_wire(big_endian), np.ndarray)


def test_an_infer_that_fails_after_it_waited_is_answered_with_its_error_in_a_callback_or_a_task() -> None:
    """The error of a request that failed once released (in the callback of what it waited on, or in its
    task after a bare yield) goes back as the single server's: a NaiadError as it is, a bug as a 500."""
    def infer_message(request_id: int, parameters: dict) -> tuple:
        request = InferenceRequest("queued", [], id=str(request_id), parameters=parameters)
        return (wire.INFER, request_id, request_to_wire(request), "", 0)

    cases = {1: {"fail": "naiad"}, 2: {"fail": "naiad", "yield": True}, 3: {"fail": "bug"},
             4: {"fail": "bug", "yield": True}, 5: {"yield": True}}

    async def scenario() -> tuple[dict[int, tuple], int]:
        inference = _Inference()
        dispatcher = Dispatcher(inference, None, None)  # type: ignore[arg-type]
        sent = _Sent()
        dispatcher.channel = sent  # type: ignore[assignment]
        for request_id, parameters in cases.items():
            dispatcher.on_message(infer_message(request_id, parameters))
        for future in inference.waiting.values():
            future.set_result(None)
        while len(sent.messages) < len(cases):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)
        return {m[1]: m for m in sent.messages}, len(dispatcher.tasks)

    answers, left = asyncio.run(asyncio.wait_for(scenario(), 30))
    for request_id in (1, 2):
        assert answers[request_id] == (wire.ERROR, request_id, (ErrorCode.UNAVAILABLE, "gone away"))
    for request_id in (3, 4):
        kind, _, (code, text) = answers[request_id]
        assert kind == wire.ERROR and code == ErrorCode.INTERNAL and "RuntimeError: a bug" in text
    assert answers[5][0] == wire.RESULT and answers[5][2][2] == "5"
    assert left == 0


def test_the_workers_traceparent_is_the_requests_own_when_the_core_propagates(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a frontend's incoming_traceparent block: set for this request only, and only once the core
    exports spans (the request after it, and the dispatcher's own context, see none)."""
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    def trace_message(request_id: int, traceparent: str) -> tuple:
        return (wire.INFER, request_id, request_to_wire(InferenceRequest("trace", [])), traceparent, 0)

    async def scenario() -> list[tuple]:
        dispatcher = Dispatcher(_Inference(), None, None)  # type: ignore[arg-type]
        sent = _Sent()
        dispatcher.channel = sent  # type: ignore[assignment]
        dispatcher.on_message(trace_message(1, parent))
        dispatcher.on_message(trace_message(2, ""))
        monkeypatch.setattr(trace_context, "_PROPAGATING", True)
        dispatcher.on_message(trace_message(3, parent))
        dispatcher.on_message(trace_message(4, ""))
        assert REMOTE_TRACEPARENT.get() == ""
        return sent.messages

    messages = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert [(m[1], m[2][2]) for m in messages] == [(1, ""), (2, ""), (3, parent), (4, "")]


def test_the_time_the_worker_had_an_infer_request_reaches_the_core_with_it() -> None:
    """The core times the request (batching delay, queue time, duration) from when the worker had it."""
    seen: list[int] = []

    class _Recording:
        async def infer(self, request: InferenceRequest) -> InferenceResponse:
            seen.append(request.received_ns)
            return InferenceResponse(request.model_name, "1", [], request.id)

    async def scenario() -> list[tuple]:
        dispatcher = Dispatcher(_Recording(), None, None)  # type: ignore[arg-type]
        sent = _Sent()
        dispatcher.channel = sent  # type: ignore[assignment]
        dispatcher.on_message((wire.INFER, 1, request_to_wire(InferenceRequest("m", [])), "", 123_456_789))
        return sent.messages

    messages = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert seen == [123_456_789] and [(m[0], m[1]) for m in messages] == [(wire.RESULT, 1)]
