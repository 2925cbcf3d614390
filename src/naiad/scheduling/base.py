"""The Scheduler protocol, the unit of work it queues, and batch execution shared by every scheduler."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from naiad.backends.base import ExecutionBatch
from naiad.observability.statistics import ModelStatistics
from naiad.protocol.errors import NaiadError, internal
from naiad.runtime.thread_instance import ThreadInstance


@dataclass
class WorkItem:
    """One request as the model sees it: model-facing input arrays and the outputs it needs."""

    inputs: dict[str, np.ndarray]
    output_names: list[str]
    batch_size: int
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    enqueue_ns: int = field(default_factory=time.perf_counter_ns)
    dispatch_ns: int = 0


class Scheduler(Protocol):
    async def enqueue(self, item: WorkItem) -> dict[str, np.ndarray]: ...

    def inflight(self) -> int: ...

    async def stop(self) -> None: ...


def _batch_signature(item: WorkItem) -> tuple:
    """Requests can share a batch only when every non-batch dimension matches."""
    return tuple((name, arr.dtype.str, arr.shape[1:]) for name, arr in sorted(item.inputs.items()))


def can_join(first: WorkItem, other: WorkItem) -> bool:
    return _batch_signature(first) == _batch_signature(other)


async def execute_batch(
    instance: ThreadInstance, items: list[WorkItem], batching: bool, stats: ModelStatistics
) -> None:
    """Run items as one execution and resolve each item's future with its slice of the outputs."""
    start = time.perf_counter_ns()
    for item in items:
        item.dispatch_ns = start
    try:
        if len(items) == 1:
            inputs = items[0].inputs
            names = items[0].output_names
        else:
            inputs = {name: np.concatenate([it.inputs[name] for it in items]) for name in items[0].inputs}
            names = list(dict.fromkeys(n for it in items for n in it.output_names))
        total = sum(it.batch_size for it in items)
        input_done = time.perf_counter_ns()
        outputs = await instance.execute(ExecutionBatch(inputs, names, total))
        infer_done = time.perf_counter_ns()
        missing = [n for n in names if n not in outputs]
        if missing:
            raise internal(f"model instance '{instance.name}' did not produce outputs {missing}")
        if len(items) == 1:
            results = [outputs]
        else:
            results = []
            offset = 0
            for it in items:
                rows = slice(offset, offset + it.batch_size)
                results.append({n: outputs[n][rows] for n in it.output_names})
                offset += it.batch_size
            for n in names:
                if outputs[n].shape[:1] != (total,):
                    raise internal(f"output '{n}' of a batch of {total} has shape {list(outputs[n].shape)}")
        output_done = time.perf_counter_ns()
        stats.record_execution(total if batching else 1, len(items), input_done - start, infer_done - input_done, output_done - infer_done)
        for it, res in zip(items, results):
            if not it.future.done():
                it.future.set_result(res)
    except Exception as exc:  # every failure of the execution reaches each request of the batch
        error = exc if isinstance(exc, NaiadError) else internal(str(exc) or type(exc).__name__)
        for it in items:
            if not it.future.done():
                it.future.set_exception(error)
