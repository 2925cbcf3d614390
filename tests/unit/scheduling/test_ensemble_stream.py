"""Decoupled ensembles: each response of a decoupled step runs what follows it; answers per response."""

import asyncio

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import BackendResponse
from naiad.protocol.errors import ErrorCode, NaiadError
from naiad.protocol.types import InferenceRequest, InferenceResponse, OutputTensor
from naiad.scheduling.base import WorkItem
from naiad.scheduling.ensemble_stream import StreamingEnsembleRun


class FakeServices:
    """Composing models as functions: `spread` is decoupled (X -> Y = X*10 + i for i < X[0], or i < 2 when
    X >= 10), the others answer once."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []

    async def infer_stream(self, request: InferenceRequest, errors_inline: bool = False):
        inputs = {t.name: t.data for t in request.inputs}
        self.calls.append((request.model_name, sorted(int(a.reshape(-1)[0]) for a in inputs.values())))
        if request.model_name == "spread":
            count = int(inputs["X"][0]) if int(inputs["X"][0]) < 10 else 2
            if count < 0:
                raise NaiadError(ErrorCode.INVALID_ARG, "negative")
            for i in range(count):
                await asyncio.sleep(0)
                yield _response({"Y": inputs["X"] * 10 + i}), False
            yield None, True
        elif request.model_name == "add":
            await asyncio.sleep(0)
            yield _response({"Y": inputs["A"] + inputs["B"]}), True
        else:  # "neg"
            yield _response({"Y": -inputs["X"]}), True


def _response(outputs: dict[str, np.ndarray]) -> InferenceResponse:
    return InferenceResponse("m", "1", [OutputTensor(n, "INT64", a.shape, a) for n, a in outputs.items()])


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> mc.ModelEnsembling.Step:
    step = mc.ModelEnsembling.Step(model_name=model, model_version=-1)
    step.input_map.update(inputs)
    step.output_map.update(outputs)
    return step


def _run(steps, inputs: dict[str, int], outputs: list[str]) -> tuple[list[BackendResponse], FakeServices]:
    services = FakeServices()

    async def main() -> list[BackendResponse]:
        item = WorkItem({k: np.array([v], np.int64) for k, v in inputs.items()}, outputs, 1, stream=asyncio.Queue())
        await StreamingEnsembleRun("ens", steps, services, item).run()
        received = []
        while not item.stream.empty():
            received.append(item.stream.get_nowait())
        return received

    return asyncio.run(main()), services


def _values(responses: list[BackendResponse]) -> list[dict[str, int]]:
    return [{n: int(a[0]) for n, a in r.outputs.items()} for r in responses if r.outputs is not None]


def test_each_response_runs_the_steps_after_it_and_joins_with_shared_tensors():
    # spread(N) -> S_i; neg(S_i) -> M_i; add(S_i, M_i) -> Z_i = 0; add(N, S_i) -> W_i
    steps = [
        _step("spread", {"X": "N"}, {"Y": "S"}),
        _step("neg", {"X": "S"}, {"Y": "M"}),
        _step("add", {"A": "S", "B": "M"}, {"Y": "Z"}),
        _step("add", {"A": "N", "B": "S"}, {"Y": "W"}),
    ]
    responses, services = _run(steps, {"N": 3}, ["S", "Z", "W"])
    assert sorted(_values(responses), key=lambda v: v["S"]) == [{"S": 30 + i, "Z": 0, "W": 33 + i} for i in range(3)]
    assert [r.final for r in responses] == [False] * (len(responses) - 1) + [True]
    assert len(services.calls) == 1 + 3 * 3


def test_nested_decoupled_steps_answer_once_per_inner_response():
    # spread(2) -> A in {20, 21}; spread(A) -> D in {200, 201, 210, 211}; W = N + D uses N from the request.
    steps = [_step("spread", {"X": "N"}, {"Y": "A"}), _step("spread", {"X": "A"}, {"Y": "D"}),
             _step("add", {"A": "N", "B": "D"}, {"Y": "W"})]
    responses, _ = _run(steps, {"N": 2}, ["A", "D", "W"])
    assert sorted(_values(responses), key=lambda v: v["D"]) == [
        {"A": a, "D": d, "W": d + 2} for a, d in ((20, 200), (20, 201), (21, 210), (21, 211))
    ]
    assert [r.final for r in responses][-1] is True


def test_no_response_from_the_decoupled_step_gives_a_flag_only_final():
    responses, services = _run([_step("spread", {"X": "N"}, {"Y": "S"}), _step("neg", {"X": "S"}, {"Y": "M"})], {"N": 0}, ["M"])
    assert len(responses) == 1 and responses[0].outputs is None and responses[0].final
    assert [name for name, _ in services.calls] == ["spread"]


def test_a_step_error_names_the_step():
    with pytest.raises(NaiadError) as info:
        _run([_step("spread", {"X": "N"}, {"Y": "S"})], {"N": -1}, ["S"])
    assert info.value.code is ErrorCode.INVALID_ARG
    assert info.value.message == "in ensemble 'ens', step 0 ('spread'): negative"
