"""A gRPC frontend worker's ModelInfer: a request laid out like one seen before is decoded unparsed."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from naiad.frontends.grpc import servicer
from naiad.frontends.workers.grpc_worker import WorkerHandlers
from naiad.protocol.types import InferenceRequest, InferenceResponse, OutputTensor

_MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


class _Core:
    """The core's inference: OUTPUT0 = INPUT0 + INPUT1, at once."""

    async def infer(self, request: InferenceRequest, traceparent: str) -> InferenceResponse:
        first, second = request.inputs[0].data, request.inputs[1].data
        assert first is not None and second is not None
        total = first + second
        return InferenceResponse(request.model_name, "1", [OutputTensor("OUTPUT0", "INT32", total.shape, total)])


class _Context:
    def invocation_metadata(self) -> tuple:
        return ()


def _message(a: int, b: int) -> bytes:
    message = pb.ModelInferRequest(model_name="add_sub",
                                   raw_input_contents=[np.full(4, a, "<i4").tobytes(), np.full(4, b, "<i4").tobytes()])
    for name in ("INPUT0", "INPUT1"):
        message.inputs.add(name=name, datatype="INT32", shape=[1, 4])
    return message.SerializeToString()


def test_a_repeated_layout_is_answered_without_parsing_its_message(monkeypatch: pytest.MonkeyPatch) -> None:
    handlers = WorkerHandlers(_Core(), allow_shared_memory=False)  # type: ignore[arg-type]
    handler = handlers.service(types.SimpleNamespace(method=_MODEL_INFER))
    assert handler is not None
    parsed: list[bytes] = []
    real = pb.ModelInferRequest

    class Counting:
        @staticmethod
        def FromString(raw: bytes) -> Any:  # (protobuf's name)
            parsed.append(raw)
            return real.FromString(raw)

    # the worker parses a message through the servicer's parse_infer_request
    monkeypatch.setattr(servicer, "pb", types.SimpleNamespace(ModelInferRequest=Counting))

    async def call(message: bytes) -> pb.ModelInferResponse:
        request = handler.request_deserializer(message) if handler.request_deserializer else message
        return pb.ModelInferResponse.FromString(await handler.unary_unary(request, _Context()))

    async def scenario() -> list[pb.ModelInferResponse]:
        return [await call(_message(a, b)) for a, b in ((1, 2), (5, 5), (-3, 9))]

    answers = asyncio.run(asyncio.wait_for(scenario(), 30))
    for answer, expected in zip(answers, (3, 10, 6)):
        np.testing.assert_array_equal(np.frombuffer(answer.raw_output_contents[0], "<i4"), [expected] * 4)
    assert len(parsed) == 1  # the first message only: its layout is remembered as bytes


def test_a_message_that_does_not_parse_aborts_with_the_servers_internal_error() -> None:
    handlers = WorkerHandlers(_Core(), allow_shared_memory=False)  # type: ignore[arg-type]
    handler = handlers.service(types.SimpleNamespace(method=_MODEL_INFER))
    assert handler is not None

    class Aborted(Exception):
        pass

    class Context(_Context):
        async def abort(self, code: grpc.StatusCode, details: str) -> None:
            raise Aborted(code, details)

    with pytest.raises(Aborted) as info:
        asyncio.run(handler.unary_unary(b"\xff\xff\xff", Context()))
    assert info.value.args == (grpc.StatusCode.INTERNAL, "Exception deserializing request!")
