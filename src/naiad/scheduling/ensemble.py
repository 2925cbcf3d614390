"""Ensemble scheduler: runs the step DAG, each step as a request re-entering the server."""

from __future__ import annotations

import asyncio

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import BackendResponse, ServerServices
from naiad.observability.statistics import ModelStatistics
from naiad.protocol.errors import NaiadError, internal
from naiad.scheduling.base import WorkItem
from naiad.scheduling.ensemble_steps import step_error, step_outputs, step_request
from naiad.scheduling.ensemble_stream import StreamingEnsembleRun


class EnsembleScheduler:
    """Launches every step as soon as its inputs exist; independent steps run concurrently.

    A decoupled ensemble (one with a decoupled step, see config.ensemble.apply_decoupled_steps)
    streams: each response of a decoupled step runs the steps after it, and each complete set of
    outputs is one response of the ensemble.
    """

    def __init__(self, config: mc.ModelConfig, services: ServerServices, stats: ModelStatistics) -> None:
        self._name = config.name
        self._steps = list(config.ensemble_scheduling.step)
        self._decoupled = config.model_transaction_policy.decoupled
        self._services = services
        self._stats = stats
        self._inflight = 0

    async def enqueue(self, item: WorkItem) -> BackendResponse:
        self._inflight += 1
        try:
            if self._decoupled:
                await StreamingEnsembleRun(self._name, self._steps, self._services, item).run()
            else:
                outputs = await self._run(item)
                item.deliver(BackendResponse({n: outputs[n] for n in item.output_names}))
        except NaiadError as exc:
            if item.stream is None:
                raise
            item.fail(exc)  # a streaming caller reads its error from the stream
        finally:
            self._inflight -= 1
        return await item.future

    async def _run(self, item: WorkItem) -> dict[str, np.ndarray]:
        tensors: dict[str, np.ndarray] = dict(item.inputs)
        pending = list(enumerate(self._steps))
        running: dict[asyncio.Task[dict[str, np.ndarray]], int] = {}
        try:
            while pending or running:
                for index, step in [p for p in pending if set(p[1].input_map.values()) <= tensors.keys()]:
                    pending.remove((index, step))
                    task = asyncio.get_running_loop().create_task(self._run_step(index, step, tensors, item))
                    running[task] = index
                if not running:
                    raise internal(f"ensemble '{self._name}' cannot make progress: steps {[s.model_name for _, s in pending]} lack inputs")
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    running.pop(task)
                    tensors.update(task.result())
        finally:
            for task in running:
                task.cancel()
        return tensors

    async def _run_step(self, index: int, step: mc.ModelEnsembling.Step, tensors: dict[str, np.ndarray], item: WorkItem) -> dict[str, np.ndarray]:
        inputs = {model_input: tensors[tensor] for model_input, tensor in step.input_map.items()}
        try:
            response = await self._services.infer_async(step_request(step, inputs, item.request))
        except NaiadError as exc:
            raise step_error(self._name, index, step, exc) from None
        produced = step_outputs(response)
        return {tensor: produced[model_output] for model_output, tensor in step.output_map.items()}

    def inflight(self) -> int:
        return self._inflight

    def pending(self) -> int:
        return 0

    async def stop(self) -> None:
        return None
