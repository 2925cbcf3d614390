"""Ensemble scheduler: runs the step DAG, each step as a request re-entering the server."""

from __future__ import annotations

import asyncio

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import BackendResponse, ServerServices
from naiad.observability.statistics import ModelStatistics
from naiad.protocol.datatypes import datatype_of_array
from naiad.protocol.errors import NaiadError, internal
from naiad.protocol.types import InferenceRequest, InferInput, RequestedOutput
from naiad.scheduling.base import WorkItem


class EnsembleScheduler:
    """Launches every step as soon as its inputs exist; independent steps run concurrently."""

    def __init__(self, config: mc.ModelConfig, services: ServerServices, stats: ModelStatistics) -> None:
        self._name = config.name
        self._steps = list(config.ensemble_scheduling.step)
        self._services = services
        self._stats = stats
        self._inflight = 0

    async def enqueue(self, item: WorkItem) -> BackendResponse:
        self._inflight += 1
        try:
            outputs = await self._run(item)
        finally:
            self._inflight -= 1
        item.deliver(BackendResponse({n: outputs[n] for n in item.output_names}))
        return await item.future

    async def _run(self, item: WorkItem) -> dict[str, np.ndarray]:
        tensors: dict[str, np.ndarray] = dict(item.inputs)
        pending = list(enumerate(self._steps))
        running: dict[asyncio.Task, int] = {}
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
        parent = item.request
        inputs = []
        for model_input, tensor in step.input_map.items():
            array = tensors[tensor]
            inputs.append(InferInput(model_input, datatype_of_array(array), tuple(array.shape), array))
        request = InferenceRequest(
            model_name=step.model_name,
            model_version=str(step.model_version) if step.model_version >= 0 else "",
            inputs=inputs,
            outputs=[RequestedOutput(name) for name in step.output_map],
            id=parent.id if parent else "",
            parameters=dict(parent.parameters) if parent else {},
            priority=parent.priority if parent else 0,
            timeout_us=parent.timeout_us if parent else 0,
            sequence_id=parent.sequence_id if parent else 0,
            sequence_start=parent.sequence_start if parent else False,
            sequence_end=parent.sequence_end if parent else False,
        )
        try:
            response = await self._services.infer_async(request)
        except NaiadError as exc:
            raise NaiadError(exc.code, f"in ensemble '{self._name}', step {index} ('{step.model_name}'): {exc.message}") from None
        produced = {out.name: out.data for out in response.outputs}
        return {tensor: produced[model_output] for model_output, tensor in step.output_map.items()}

    def inflight(self) -> int:
        return self._inflight

    def pending(self) -> int:
        return 0

    async def stop(self) -> None:
        return None
