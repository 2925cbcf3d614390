"""StreamSession on its own: multi-response sources (the decoupled seam), empty finals, ordering, error mode."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from naiad.frontends.grpc.stream import Fatal, StreamSession, grpc_error_mode
from naiad.protocol.errors import ErrorCode, NaiadError, internal
from naiad.protocol.types import InferenceRequest, InferenceResponse, OutputTensor


def _message(request_id: str, empty_final: bool | None = None, version: str = "") -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m", model_version=version, id=request_id, raw_input_contents=[b"\1"])
    message.inputs.add(name="A", datatype="INT8", shape=[1])
    if empty_final is not None:
        message.parameters["triton_enable_empty_final_response"].bool_param = empty_final
    return message


def _response(request: InferenceRequest, value: int) -> InferenceResponse:
    out = OutputTensor("OUT", "INT32", (1,), np.array([value], dtype=np.int32))
    return InferenceResponse(request.model_name, "2", [out], id=request.id)


async def _three_then_flag(request: InferenceRequest) -> AsyncIterator[tuple[InferenceResponse | None, bool]]:
    for value in range(3):
        yield _response(request, value), False
        await asyncio.sleep(0)
    yield None, True


async def _requests(*messages: pb.ModelInferRequest) -> AsyncIterator[pb.ModelInferRequest]:
    for message in messages:
        yield message


async def _collect(session: StreamSession, *messages: pb.ModelInferRequest) -> list:
    return [item async for item in session.responses(_requests(*messages))]


def test_decoupled_style_source_sets_final_flags() -> None:
    session = StreamSession(_three_then_flag, None, fatal_errors=False)
    items = asyncio.run(_collect(session, _message("a")))
    assert len(items) == 3  # the flag-only final is not sent by default
    assert [np.frombuffer(i.infer_response.raw_output_contents[0], "<i4")[0] for i in items] == [0, 1, 2]
    assert [i.infer_response.parameters["triton_final_response"].bool_param for i in items] == [False] * 3


def test_empty_final_response_when_requested() -> None:
    session = StreamSession(_three_then_flag, None, fatal_errors=False)
    items = asyncio.run(_collect(session, _message("b", empty_final=True)))
    assert len(items) == 4
    last = items[-1].infer_response
    assert (last.id, last.model_name, last.model_version) == ("b", "m", "2")  # the version that served it
    assert len(last.outputs) == 0 and len(last.raw_output_contents) == 0
    assert last.parameters["triton_final_response"].bool_param is True


def test_empty_final_alone_echoes_requested_identity() -> None:
    async def flag_only(request: InferenceRequest) -> AsyncIterator[tuple[InferenceResponse | None, bool]]:
        yield None, True

    items = asyncio.run(_collect(StreamSession(flag_only, None, fatal_errors=False), _message("e", True, "7")))
    (only,) = items
    assert (only.infer_response.id, only.infer_response.model_version) == ("e", "7")
    assert only.infer_response.parameters["triton_final_response"].bool_param is True
    assert asyncio.run(_collect(StreamSession(flag_only, None, fatal_errors=False), _message("n"))) == []


def test_interleaved_requests_all_complete() -> None:
    session = StreamSession(_three_then_flag, None, fatal_errors=False)
    items = asyncio.run(_collect(session, *[_message(f"r{i}", empty_final=True) for i in range(10)]))
    assert len(items) == 40
    finals = [i.infer_response.id for i in items if i.infer_response.parameters["triton_final_response"].bool_param]
    assert sorted(finals) == [f"r{i}" for i in range(10)]


def test_source_failure_mid_stream_becomes_error_message() -> None:
    async def failing(request: InferenceRequest) -> AsyncIterator[tuple[InferenceResponse | None, bool]]:
        yield _response(request, 1), False
        raise internal("backend died")

    session = StreamSession(failing, None, fatal_errors=False)
    items = asyncio.run(_collect(session, _message("f")))
    assert len(items) == 2
    assert items[0].error_message == ""
    assert items[1].error_message == "backend died" and items[1].infer_response.id == "f"


def test_unexpected_exception_is_internal_error() -> None:
    async def broken(request: InferenceRequest) -> AsyncIterator[tuple[InferenceResponse | None, bool]]:
        raise KeyError("x")
        yield  # pragma: no cover

    items = asyncio.run(_collect(StreamSession(broken, None, fatal_errors=False), _message("k")))
    assert items[0].error_message == "unexpected error: KeyError: 'x'"


def test_fatal_mode_yields_fatal_and_stops() -> None:
    async def failing(request: InferenceRequest) -> AsyncIterator[tuple[InferenceResponse | None, bool]]:
        raise NaiadError(ErrorCode.INVALID_ARG, f"bad {request.id}")
        yield  # pragma: no cover

    items = asyncio.run(_collect(StreamSession(failing, None, fatal_errors=True), _message("z"), _message("y")))
    assert len(items) == 1 and isinstance(items[0], Fatal)
    assert items[0].error.code is ErrorCode.INVALID_ARG and items[0].error.message == "bad z"


def test_close_cancels_in_flight() -> None:
    cancelled: list[str] = []

    async def forever(request: InferenceRequest) -> AsyncIterator[tuple[InferenceResponse | None, bool]]:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(request.id)
            raise
        yield None, True  # pragma: no cover

    async def scenario() -> None:
        session = StreamSession(forever, None, fatal_errors=False)

        async def endless() -> AsyncIterator[pb.ModelInferRequest]:
            yield _message("w")
            await asyncio.Event().wait()

        items = session.responses(endless())
        task = asyncio.ensure_future(items.__anext__())
        for _ in range(20):
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await items.aclose()
        for _ in range(5):
            await asyncio.sleep(0)

    asyncio.run(scenario())
    assert cancelled == ["w"]


class _Context:
    def __init__(self, metadata: tuple) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> tuple:
        return self._metadata


def test_grpc_error_header() -> None:
    assert grpc_error_mode(_Context((("triton_grpc_error", "true"),))) is True
    assert grpc_error_mode(_Context((("triton_grpc_error", "false"),))) is False
    assert grpc_error_mode(_Context(())) is False
