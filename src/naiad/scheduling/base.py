"""The Scheduler protocol, the unit of work it queues, and batch execution shared by every scheduler."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from naiad.backends.base import (
    BackendRequest,
    BackendResponse,
    ExecutionBatch,
    ExecutionOutcome,
    PoolInstance,
    RequestModelInstance,
    TensorInstance,
)
from naiad.observability.statistics import ModelStatistics
from naiad.protocol.errors import NaiadError, internal
from naiad.protocol.types import InferenceRequest
from naiad.runtime.thread_instance import InstancePool
from naiad.scheduling.execution_policy import InlinePolicy

# (input name, dtype, non-batch shape) of every input, sorted by name.
BatchSignature = tuple[tuple[str, str, tuple[int, ...]], ...]


@dataclass(eq=False, slots=True)  # identity: queues look requests up with `in`/remove()
class WorkItem:
    """One request as the model sees it: model-facing input arrays and the outputs it needs.

    `future` resolves with the (single) response; for decoupled models every response is put
    on `stream` instead, the last one with final=True.
    """

    inputs: dict[str, np.ndarray]
    output_names: list[str]
    batch_size: int
    request: InferenceRequest | None = None
    stream: asyncio.Queue[BackendResponse] | None = None
    future: asyncio.Future[BackendResponse] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    enqueue_ns: int = field(default_factory=time.perf_counter_ns)
    dispatch_ns: int = 0
    input_end_ns: int = 0
    output_start_ns: int = 0
    compute_end_ns: int = 0
    padding: bool = False  # a sequence-slot filler row: nobody waits, its responses are dropped
    signature: BatchSignature | None = None  # cached by can_join: batch formation compares it many times
    # Request rescheduling: a scheduler that can queue this item again sets this (see BackendRequest.reschedule).
    reschedule: Callable[[WorkItem], None] | None = None

    def deliver(self, response: BackendResponse) -> None:
        """Route one response of this request to its waiter (event-loop thread only)."""
        if self.padding:
            return
        if response.execution_ns is not None:  # the backend timed the execution itself
            self.dispatch_ns, end = response.execution_ns
            self.input_end_ns, self.output_start_ns, self.compute_end_ns = self.dispatch_ns, end, end
        if self.stream is not None:
            self.stream.put_nowait(response)
            if response.final and not self.future.done():
                self.future.set_result(response)
            return
        if self.future.done():
            return
        if response.error is not None and response.counts_as_failure:
            self.future.set_exception(response.error)
        elif response.outputs is not None or response.final:
            self.future.set_result(response)

    def fail(self, error: NaiadError) -> None:
        self.deliver(BackendResponse(None, error=error, final=True))

    def run_again(self) -> None:
        """BackendRequest.reschedule of this item: queue it again (a bound method: cheaper than a partial)."""
        assert self.reschedule is not None
        self.reschedule(self)

    def abandon(self) -> None:
        """Its caller stopped waiting (cancelled): the backend sees is_cancelled() and its responses are dropped."""
        self.future.cancel()


class Scheduler(Protocol):
    async def enqueue(self, item: WorkItem) -> BackendResponse: ...

    def inflight(self) -> int:
        """Requests accepted and not yet answered (unload drains these)."""
        ...

    def pending(self) -> int:
        """Requests accepted and not yet executing (nv_inference_pending_request_count)."""
        ...

    async def stop(self) -> None: ...


def _batch_signature(item: WorkItem) -> BatchSignature:
    """Requests can share a batch only when every non-batch dimension matches."""
    signature = item.signature
    if signature is None:
        signature = item.signature = tuple((name, arr.dtype.str, arr.shape[1:]) for name, arr in sorted(item.inputs.items()))
    return signature


def can_join(first: WorkItem, other: WorkItem) -> bool:
    return _batch_signature(first) == _batch_signature(other)


async def run_batch(pool: InstancePool, instance: PoolInstance, items: list[WorkItem], batching: bool, stats: ModelStatistics,
                    inline: InlinePolicy) -> None:
    """Execute items on an instance acquired from pool; the pool gets it back when the execution has ended.

    Cancelling the caller (its request was cancelled: gRPC cancel or deadline, HTTP client gone) does
    not stop the execution, which runs to the end on the instance's thread or worker anyway: the
    instance stays busy until then and the execution is counted in the statistics like any other.
    The responses of requests whose futures were cancelled are dropped (WorkItem.deliver).
    Instances that can name their unfinished work after a cancellation (`take_unfinished`: thread
    instances, Python-backend workers) run in the caller at no extra cost; any other runs as a task
    of the pool's, shielded from the caller (an extra task and two loop hops per execution).
    """
    if not instance.tracks_unfinished:
        await asyncio.shield(pool.run(instance, execute_batch(instance, items, batching, stats, inline)))
        return
    try:
        await execute_batch(instance, items, batching, stats, inline)
    except asyncio.CancelledError:
        start = items[0].dispatch_ns or time.perf_counter_ns()  # the execution's start (set before its first await)
        unfinished = instance.take_unfinished()

        def count() -> None:  # the execution ran to its end: an execution like any other
            rows = sum(it.batch_size for it in items)
            stats.record_execution(rows if batching else len(items), len(items), 0, time.perf_counter_ns() - start, 0)

        pool.release_when_finished(instance, unfinished, count)
        raise
    except BaseException:
        pool.release(instance)
        raise
    pool.release(instance)


def execute_batch(instance: PoolInstance, items: list[WorkItem], batching: bool, stats: ModelStatistics,
                  inline: InlinePolicy) -> Coroutine[Any, Any, None]:
    """Run items as one execution (the coroutine to await); every item gets its response(s) or the execution's error.

    The instance declares how it executes (`executes`): a tensor instance's batch runs on its thread
    or, when `inline` says so, on the event loop; a request-level instance takes the requests.
    The coroutine is the executing function's own: no frame of this one per execution.
    """
    if instance.executes == "tensors":
        return _execute_tensor_batch(instance, items, batching, stats, inline)
    return _execute_requests(instance, items, batching, stats)


def _as_error(exc: Exception) -> NaiadError:
    return exc if isinstance(exc, NaiadError) else internal(str(exc) or type(exc).__name__)


async def _execute_requests(instance: RequestModelInstance, items: list[WorkItem], batching: bool, stats: ModelStatistics) -> None:
    start = time.perf_counter_ns()
    requests = []
    for item in items:
        item.dispatch_ns = start
        request = item.request
        reschedule = item.run_again if item.reschedule is not None else None
        if request is None:
            requests.append(BackendRequest(item.inputs, item.output_names, is_cancelled=item.future.cancelled, reschedule=reschedule))
            continue
        parameters = request.parameters
        # positional, in BackendRequest's field order: a dataclass __init__ parses keywords slower
        requests.append(
            BackendRequest(
                item.inputs, item.output_names, request.id, request.sequence_id,
                (1 if request.sequence_start else 0) | (2 if request.sequence_end else 0),
                dict(parameters) if parameters else {}, request.timeout_us, request.model_name, 0,
                item.future.cancelled, reschedule,
            )
        )

    rows = items[0].batch_size if len(items) == 1 else sum(it.batch_size for it in items)
    execution = _RequestExecution(items, stats, rows if batching else len(items), start)
    outcome: ExecutionOutcome = None
    try:
        outcome = await instance.execute_requests(requests, execution.respond)
    except asyncio.CancelledError:
        execution.counted = True  # the caller was cancelled: run_batch counts what still runs
        raise
    except Exception as exc:  # the whole batch failed before answering
        error = _as_error(exc)
        for item in items:
            item.fail(error)
    end = time.perf_counter_ns()
    for it in items:
        if it.dispatch_ns == start:  # no response timed by the backend (yet)
            it.input_end_ns, it.output_start_ns, it.compute_end_ns = start, end, end
    if isinstance(outcome, asyncio.Future):  # handed over, still running: counted once it ended
        execution.handed_over(outcome)
    elif not execution.counted:
        execution.count(outcome or (start, end))


class _RequestExecution:
    """One execution of whole requests: routes their responses and counts it in the statistics, once.

    A backend that times its executions (a Python worker) answers each request with the execution's
    (start, end) once it has ended: when the last request is answered so, the execution is counted
    right there. Otherwise (streamed responses, rescheduled requests, a lost worker) it is counted
    when execute_requests returns, or when the future it handed over ends.
    """

    __slots__ = ("items", "stats", "size", "start", "unanswered", "counted", "outcome")

    def __init__(self, items: list[WorkItem], stats: ModelStatistics, size: int, start: int) -> None:
        self.items = items
        self.stats = stats
        self.size = size
        self.start = start
        self.unanswered = len(items)  # requests not yet answered with the execution's timing
        self.counted = False
        self.outcome: asyncio.Future[Any] | None = None

    def respond(self, index: int, response: BackendResponse) -> None:
        self.items[index].deliver(response)
        if response.execution_ns is not None and response.final:
            self.unanswered -= 1
            if not self.unanswered and not self.counted:  # the execution has ended: no callback needed
                self.count(response.execution_ns)
                if self.outcome is not None:
                    self.outcome.remove_done_callback(self._ended)

    def handed_over(self, outcome: asyncio.Future[Any]) -> None:
        if self.counted:
            return
        if outcome.done():
            self._ended(outcome)
            return
        self.outcome = outcome
        outcome.add_done_callback(self._ended)

    def _ended(self, outcome: asyncio.Future[Any]) -> None:
        if not self.counted:
            timing = None if outcome.cancelled() else outcome.result()
            self.count(timing or (self.start, time.perf_counter_ns()))

    def count(self, timing: tuple[int, int]) -> None:
        self.counted = True
        began, ended = timing
        self.stats.record_execution(self.size, len(self.items), 0, ended - began, 0)


async def _execute_tensor_batch(instance: TensorInstance, items: list[WorkItem], batching: bool, stats: ModelStatistics,
                                inline: InlinePolicy) -> None:
    start = time.perf_counter_ns()
    for item in items:
        item.dispatch_ns = start
    try:
        single = len(items) == 1
        if single:
            inputs, names, total = items[0].inputs, items[0].output_names, items[0].batch_size
        else:
            inputs = {name: np.concatenate([it.inputs[name] for it in items]) for name in items[0].inputs}
            names = list(dict.fromkeys(n for it in items for n in it.output_names))
            total = sum(it.batch_size for it in items)
        input_done = time.perf_counter_ns()
        batch = ExecutionBatch(inputs, names, total)
        if inline.inline():
            outputs = inline.run_inline(instance.execute_inline, batch)
        else:
            outputs = await instance.execute(batch)
            inline.observe_thread(instance.last_thread_ns)
        infer_done = time.perf_counter_ns()
        for name in names:
            if name not in outputs:
                missing = [n for n in names if n not in outputs]
                raise internal(f"model instance '{instance.name}' did not produce outputs {missing}")
        if single:
            results = [outputs]
        else:
            for n in names:
                if outputs[n].shape[:1] != (total,):
                    raise internal(f"output '{n}' of a batch of {total} has shape {list(outputs[n].shape)}")
            results = []
            offset = 0
            for it in items:
                rows = slice(offset, offset + it.batch_size)
                results.append({n: outputs[n][rows] for n in it.output_names})
                offset += it.batch_size
        output_done = time.perf_counter_ns()
        for it in items:
            it.input_end_ns, it.output_start_ns, it.compute_end_ns = input_done, infer_done, output_done
        stats.record_execution(total if batching else 1, len(items), input_done - start, infer_done - input_done, output_done - infer_done)
        for it, res in zip(items, results):
            it.deliver(BackendResponse(res))
    except Exception as exc:  # every failure of the execution reaches each request of the batch
        error = _as_error(exc)
        for it in items:
            it.fail(error)
