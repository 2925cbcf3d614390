"""Schedulers choose the execution path from what an instance declares (`executes`), never from its class:
an adapter written from naiad.backends.base alone runs under every scheduler, and one that declares it lost
what it held (restarts()) ends the sequences that started on it."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Final

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import (
    BackendRequest,
    BackendResponse,
    ChatTemplate,
    ExecutionBatch,
    InProcessRequestInstance,
    PoolInstance,
    ResponseCallback,
)
from naiad.observability.statistics import ModelStatistics
from naiad.protocol.errors import NaiadError
from naiad.protocol.types import InferenceRequest
from naiad.runtime.thread_instance import InstancePool
from naiad.scheduling.base import Scheduler, WorkItem
from naiad.scheduling.direct import DirectScheduler
from naiad.scheduling.dynamic_batcher import DynamicBatcher
from naiad.scheduling.execution_policy import InlinePolicy, InlineSettings
from naiad.scheduling.sequence_batcher import SequenceBatcher


class OwnTensorInstance:
    """A TensorInstance that is not a ThreadInstance: it declares how it executes and nothing else tells."""

    executes: Final = "tensors"
    tracks_unfinished = True
    in_worker_process = False
    pid = 0
    last_thread_ns = 0

    def __init__(self) -> None:
        self.name = "own_0"
        self.batches: list[int] = []

    async def execute(self, batch: ExecutionBatch) -> dict[str, np.ndarray]:
        return self.execute_inline(batch)

    def execute_inline(self, batch: ExecutionBatch) -> dict[str, np.ndarray]:
        self.batches.append(batch.batch_size)
        return {"Y": batch.inputs["X"] * 2}

    def take_unfinished(self) -> concurrent.futures.Future[Any] | None:
        return None

    def queued(self) -> int:
        return 0

    def takes_at_once(self) -> int:
        return 1

    def restarts(self) -> int:
        return 0

    def memory_bytes(self) -> int:
        return 0

    def chat_template(self) -> ChatTemplate | None:
        return None

    def healthy(self) -> bool:
        return True

    async def aclose(self) -> None:
        pass


class OwnRequestInstance(InProcessRequestInstance):
    """A request-level instance: it gets the requests, each answered on its own."""

    def __init__(self) -> None:
        self.name = "req_0"
        self.batches: list[int] = []

    async def execute_requests(self, requests: list[BackendRequest], respond: ResponseCallback) -> None:
        self.batches.append(len(requests))
        for index, request in enumerate(requests):
            respond(index, BackendResponse({"Y": request.inputs["X"] * 2}))

    def healthy(self) -> bool:
        return True

    async def aclose(self) -> None:
        pass


ON_THREADS = InlinePolicy(InlineSettings(threshold_ns=0))


def _scheduler(kind: str, pool: InstancePool) -> Scheduler:
    stats = ModelStatistics("m", "1")
    if kind == "direct":
        return DirectScheduler(pool, stats, batching=True, inline=ON_THREADS)
    if kind == "dynamic":
        return DynamicBatcher(pool, stats, 8, mc.ModelDynamicBatching(max_queue_delay_microseconds=1000),
                              inline=ON_THREADS)
    config = mc.ModelConfig(name="m", max_batch_size=8)
    config.sequence_batching.direct.SetInParent()
    return SequenceBatcher(pool, stats, config, None, ON_THREADS)


def _item(value: float, sequence_id: int) -> WorkItem:
    request = InferenceRequest(model_name="m", inputs=[], sequence_id=sequence_id, sequence_start=True,
                               sequence_end=True)
    return WorkItem({"X": np.full((1, 1), value, np.float32)}, ["Y"], 1, request=request)


@pytest.mark.parametrize("scheduler_kind", ["direct", "dynamic", "sequence"])
@pytest.mark.parametrize("instance_kind", ["tensors", "requests"])
def test_each_scheduler_runs_an_instance_on_the_path_it_declares(scheduler_kind: str, instance_kind: str) -> None:
    async def body() -> None:
        instance: OwnTensorInstance | OwnRequestInstance = (
            OwnTensorInstance() if instance_kind == "tensors" else OwnRequestInstance())
        declared: PoolInstance = instance
        assert declared.executes == instance_kind
        pool = InstancePool([declared])
        scheduler = _scheduler(scheduler_kind, pool)
        try:
            responses = await asyncio.gather(*(scheduler.enqueue(_item(v, sequence_id=v + 1)) for v in range(3)))
        finally:
            await scheduler.stop()
            await pool.close()
        assert [r.outputs["Y"].item() for r in responses if r.outputs] == [0.0, 2.0, 4.0]
        assert sum(instance.batches) == 3  # every request reached the model through the declared path

    asyncio.run(body())


class RestartingInstance(OwnRequestInstance):
    """A request-level instance whose worker process can be made to have died (restarts() goes up)."""

    deaths = 0

    def restarts(self) -> int:
        return self.deaths


def test_a_sequence_whose_instance_restarted_ends_with_a_clear_error() -> None:
    async def body() -> None:
        instance = RestartingInstance()
        pool = InstancePool([instance])
        scheduler = _scheduler("sequence", pool)

        def step(value: float, cid: int, start: bool = False) -> WorkItem:
            request = InferenceRequest(model_name="m", inputs=[], sequence_id=cid, sequence_start=start)
            return WorkItem({"X": np.full((1, 1), value, np.float32)}, ["Y"], 1, request=request)

        try:
            assert (await scheduler.enqueue(step(1, 7, start=True))).outputs is not None
            instance.deaths += 1  # the worker died between two requests of sequence 7
            with pytest.raises(NaiadError, match="sequence 7 to model 'm' cannot continue the sequence: the worker "
                                                 "process of model instance 'req_0' died"):
                await scheduler.enqueue(step(2, 7))
            with pytest.raises(NaiadError, match="must specify the START flag"):  # the sequence has ended
                await scheduler.enqueue(step(3, 7))
            started_after = await scheduler.enqueue(step(4, 8, start=True))  # a sequence started afterwards runs
            assert started_after.outputs is not None and started_after.outputs["Y"].item() == 8.0
            again = await scheduler.enqueue(step(5, 7, start=True))
            assert again.outputs is not None and again.outputs["Y"].item() == 10.0
        finally:
            await scheduler.stop()
            await pool.close()
        assert len(instance.batches) == 3  # the lost request never reached the instance

    asyncio.run(body())
