"""Sequence batcher: stateful models. Sequences stick to one instance, carry control inputs and implicit state."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import heapq
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import BackendResponse
from naiad.observability.statistics import ModelStatistics
from naiad.protocol.datatypes import CONFIG_TO_PROTOCOL, numpy_dtype
from naiad.protocol.errors import internal, invalid_arg, unavailable
from naiad.protocol.types import InferenceRequest
from naiad.runtime.precise_timer import PreciseTimer
from naiad.runtime.removable_queue import RemovableQueue
from naiad.runtime.thread_instance import InstancePool
from naiad.scheduling.base import WorkItem, run_batch
from naiad.scheduling.execution_policy import InlinePolicy

_Kind = mc.ModelSequenceBatching.Control


@dataclass
class _Control:
    """One control tensor: its input name, kind and (false, true) values or CORRID datatype."""

    name: str
    kind: int
    dtype: np.dtype
    values: tuple[float, float] = (0, 1)


@dataclass
class _State:
    input_name: str
    output_name: str
    dtype: np.dtype
    dims: tuple[int, ...]
    initial: np.ndarray | None


@dataclass(eq=False)  # identity: the backlog removes sequences by key
class _Sequence:
    correlation_id: int | str
    instance: int
    slot: int = -1
    queue: RemovableQueue[WorkItem] = field(default_factory=RemovableQueue)
    busy: bool = False
    started: bool = False
    restarts: int = 0  # its instance's restarts() when the sequence first executed there
    last_seen: float = field(default_factory=time.monotonic)
    state: dict[str, np.ndarray] = field(default_factory=dict)


def _request_of(item: WorkItem) -> InferenceRequest:
    """The request of a sequence's item (enqueue admits only items that carry one)."""
    assert item.request is not None
    return item.request


def _controls(config: mc.ModelSequenceBatching) -> list[_Control]:
    result = []
    for control_input in config.control_input:
        for control in control_input.control:
            if control.kind == _Kind.CONTROL_SEQUENCE_CORRID:
                dtype = numpy_dtype(CONFIG_TO_PROTOCOL[mc.DataType.Name(control.data_type)])
                result.append(_Control(control_input.name, control.kind, dtype))
            elif control.int32_false_true:
                result.append(_Control(control_input.name, control.kind, np.dtype(np.int32), tuple(control.int32_false_true)))
            elif control.fp32_false_true:
                result.append(_Control(control_input.name, control.kind, np.dtype(np.float32), tuple(control.fp32_false_true)))
            else:
                result.append(_Control(control_input.name, control.kind, np.dtype(np.bool_), tuple(control.bool_false_true) or (False, True)))
    return result


def _states(config: mc.ModelSequenceBatching, model_dir: Path) -> list[_State]:
    result = []
    for state in config.state:
        dtype = numpy_dtype(CONFIG_TO_PROTOCOL[mc.DataType.Name(state.data_type)])
        initial = None
        for init in state.initial_state:
            dims = tuple(d if d > 0 else 1 for d in init.dims)
            if init.WhichOneof("state_data") == "data_file":
                raw = (model_dir / "initial_state" / init.data_file).read_bytes()
                initial = np.frombuffer(raw, dtype=dtype).reshape(dims).copy()
            else:
                initial = np.zeros(dims, dtype=dtype)
        result.append(_State(state.input_name, state.output_name, dtype, tuple(state.dims), initial))
    return result


class SequenceBatcher:
    """Direct and oldest strategies share one engine: sequences pinned to instances, one request per sequence per batch."""

    def __init__(self, pool: InstancePool, stats: ModelStatistics, config: mc.ModelConfig, model_dir: Path,
                 inline: InlinePolicy | None = None) -> None:
        sequence = config.sequence_batching
        self._pool = pool
        self._stats = stats
        self._inline = inline or InlinePolicy()
        self._name = config.name
        self._batching = config.max_batch_size > 0
        self._direct = sequence.WhichOneof("strategy_choice") != "oldest"
        self._min_utilization = 0.0
        self._delay_s: float
        if not self._direct:
            per_instance = max(sequence.oldest.max_candidate_sequences, 1)
            self._delay_s = sequence.oldest.max_queue_delay_microseconds / 1e6
        else:
            per_instance = max(config.max_batch_size, 1)
            self._delay_s = sequence.direct.max_queue_delay_microseconds / 1e6
            self._min_utilization = sequence.direct.minimum_slot_utilization
        self._slots_per_instance = per_instance
        self._rows_per_batch = max(config.max_batch_size, 1)
        self._idle_s = (sequence.max_sequence_idle_microseconds or 1_000_000) / 1e6
        # iterative_sequence: each request is a whole sequence the backend reschedules until it answers.
        self._iterative = sequence.iterative_sequence
        self._last_internal_id = 0
        self._controls = _controls(sequence)
        self._states = _states(sequence, model_dir)
        self._sequences: dict[int | str, _Sequence] = {}
        self._backlog: RemovableQueue[_Sequence] = RemovableQueue()  # sequences waiting for a slot, oldest first
        self._instances = list(pool.instances)
        # The sequences holding a slot of each instance: batch formation looks at these only, not at the backlog.
        self._holders: list[dict[_Sequence, None]] = [{} for _ in self._instances]
        self._free_slots = [list(range(per_instance)) for _ in self._instances]
        self._wakeups = [asyncio.Event() for _ in self._instances]
        # Queue delays are often sub-millisecond: the loop's own timers would round them up to >= 1 ms.
        self._timer = PreciseTimer()
        self._inflight = 0
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._serve(i)) for i in range(len(self._instances))]
        self._tasks.append(loop.create_task(self._reap_idle()))

    # ------------------------------------------------------------ admission

    async def enqueue(self, item: WorkItem) -> BackendResponse:
        request = item.request
        if self._iterative and request is not None:
            request = item.request = self._iterative_request(request)
        if request is None or request.sequence_id in (0, ""):
            raise invalid_arg(f"inference request to model '{self._name}' must specify a non-zero or non-empty correlation ID")
        cid = request.sequence_id
        for control in self._controls:
            if control.kind == _Kind.CONTROL_SEQUENCE_CORRID:
                integer_id = isinstance(cid, int)
                if integer_id == (control.dtype == np.object_):
                    expected = "a string" if control.dtype == np.object_ else "an integer"
                    raise invalid_arg(
                        f"inference request to model '{self._name}' must use {expected} correlation ID: its "
                        f"CONTROL_SEQUENCE_CORRID input '{control.name}' is of that type"
                    )
        if self._batching and item.batch_size != 1:
            raise invalid_arg(f"inference request to model '{self._name}' must specify batch-size 1 due to requirements of sequence batcher")
        sequence = self._sequences.get(cid)
        if request.sequence_start:
            if sequence is not None and not sequence.queue and not sequence.busy:
                self._release(sequence)  # a new START ends the previous sequence with this id
                sequence = None
            if sequence is None:
                sequence = self._admit(cid)
        elif sequence is None:
            raise invalid_arg(
                f"inference request for sequence {cid} to model '{self._name}' must specify the START flag on the first "
                "request of the sequence"
            )
        sequence.last_seen = time.monotonic()
        if self._iterative:
            self._track_iterative(sequence, item)
        sequence.queue.append(item)
        if sequence.instance >= 0:
            self._wakeups[sequence.instance].set()
        self._inflight += 1
        try:
            return await item.future
        finally:
            self._inflight -= 1
            if item.future.cancelled():
                self._withdraw(sequence, item)

    def _withdraw(self, sequence: _Sequence, item: WorkItem) -> None:
        """A cancelled request leaves its sequence's queue at once (O(1)); a sequence that never ran and
        has nothing left to run is forgotten, its slot or backlog place freed."""
        sequence.queue.discard(item)
        if sequence.started or sequence.busy or sequence.queue or self._sequences.get(sequence.correlation_id) is not sequence:
            return
        if sequence.instance >= 0:
            self._release(sequence)
        else:
            self._backlog.discard(sequence)
            del self._sequences[sequence.correlation_id]

    def _admit(self, cid: int | str) -> _Sequence:
        free = [i for i, slots in enumerate(self._free_slots) if slots]
        sequence = _Sequence(cid, -1)
        self._sequences[cid] = sequence
        if free:
            # Lowest slot number first, across instances (as Triton fills slot 0 of every instance first).
            self._assign(sequence, min(free, key=lambda i: (self._free_slots[i][0], len(self._holders[i]), i)))
        else:
            self._backlog.append(sequence)
        return sequence

    def _assign(self, sequence: _Sequence, instance: int) -> None:
        sequence.instance = instance
        sequence.slot = heapq.heappop(self._free_slots[instance])
        self._holders[instance][sequence] = None
        self._wakeups[instance].set()

    def _release(self, sequence: _Sequence) -> None:
        """Free the sequence's slot and hand it to the oldest backlogged sequence."""
        if self._sequences.get(sequence.correlation_id) is sequence:
            del self._sequences[sequence.correlation_id]
        instance, sequence.instance = sequence.instance, -1  # released once only
        if instance >= 0:
            del self._holders[instance][sequence]
            heapq.heappush(self._free_slots[instance], sequence.slot)
            sequence.slot = -1
            if self._backlog:
                self._assign(self._backlog.popleft(), instance)
        while sequence.queue:  # requests sent after the END: the sequence no longer exists
            sequence.queue.popleft().fail(invalid_arg(
                f"inference request for sequence {sequence.correlation_id} to model '{self._name}' arrived after "
                "the END of its sequence"
            ))

    # ------------------------------------------------------------ execution

    def _ready(self, instance: int) -> list[_Sequence]:
        ready = [s for s in self._holders[instance] if s.queue and not s.busy]
        ready.sort(key=lambda s: s.queue.peek().enqueue_ns)
        return ready[: self._rows_per_batch]

    def _under_utilized(self, ready: list[_Sequence]) -> float:
        """Seconds still to wait for more ready slots (direct strategy), 0 to execute now.

        With minimum_slot_utilization > 0 a batch waits until that fraction of the instance's
        slots holds a request, or until the oldest ready request waited max_queue_delay.
        """
        if self._min_utilization <= 0 or len(ready) >= self._min_utilization * self._slots_per_instance:
            return 0.0
        return self._delay_left(ready)

    def _delay_left(self, ready: list[_Sequence]) -> float:
        """Seconds until the oldest ready request has waited max_queue_delay (0 when it has)."""
        if not self._delay_s:
            return 0.0
        oldest = min(s.queue.peek().enqueue_ns for s in ready)
        return max(oldest / 1e9 + self._delay_s - time.perf_counter_ns() / 1e9, 0.0)

    async def _wait_for_batch(self, index: int) -> list[_Sequence]:
        """The sequences of the next execution on this instance, once the strategy says to run."""
        wakeup = self._wakeups[index]
        while True:
            ready = self._ready(index)
            if not ready:
                wakeup.clear()
                await wakeup.wait()
                continue
            if self._direct:
                remaining = self._under_utilized(ready)
                if remaining <= 0:
                    return ready
                await self._wait_wakeup(wakeup, remaining)
                continue
            # Oldest strategy: a partial batch waits for more until its oldest request waited the delay.
            remaining = self._delay_left(ready) if len(ready) < self._rows_per_batch else 0.0
            if remaining <= 0:
                return ready
            await self._wait_wakeup(wakeup, remaining)

    async def _wait_wakeup(self, wakeup: asyncio.Event, seconds: float) -> None:
        """Wait until a request arrives for this instance or `seconds` pass, whichever is first."""
        wakeup.clear()
        timeout = self._timer.call_later_ns(int(seconds * 1e9), wakeup.set)
        try:
            await wakeup.wait()
        finally:
            timeout.cancel()

    async def _serve(self, index: int) -> None:
        while True:
            ready = await self._wait_for_batch(index)
            items = []
            restarts = self._instances[index].restarts()
            for sequence in ready:
                item = sequence.queue.popleft()
                if item.future.done():
                    continue
                if not sequence.started:
                    sequence.restarts = restarts
                elif sequence.restarts != restarts:
                    self._lose(sequence, item)
                    continue
                try:
                    self._decorate(sequence, item)
                except Exception as exc:  # a bad state/control tensor fails this request, not the batcher
                    item.fail(internal(f"unable to prepare sequence inputs: {exc}"))
                    continue
                sequence.busy = True
                items.append((sequence, item))
            if not items:
                continue
            batch = [it for _, it in items]
            if self._direct and self._batching:
                batch = self._pad_slots(index, items)
            # The sequences of this batch live on this instance (their state may be inside it): only it runs them.
            instance = await self._pool.acquire(self._instances[index])
            await run_batch(self._pool, instance, batch, self._batching, self._stats, self._inline)
            for sequence, item in items:
                if item.future.done() or self._iterative:  # answered, or rescheduled by the backend
                    self._after(sequence, item)
                else:  # answered later (an async execute): the sequence's next request waits for this answer
                    item.future.add_done_callback(functools.partial(self._answered, sequence, item))

    def _lose(self, sequence: _Sequence, item: WorkItem) -> None:
        """The sequence's instance lost all it held since the sequence started there (its worker process died):
        the sequence cannot go on; this request and those queued behind it fail, and the sequence ends."""
        instance = self._instances[sequence.instance].name
        error = internal(
            f"inference request for sequence {sequence.correlation_id} to model '{self._name}' cannot continue the "
            f"sequence: the worker process of model instance '{instance}' died, and what the model held of the "
            "sequence with it; start the sequence again with the START flag")
        item.fail(error)
        while sequence.queue:
            sequence.queue.popleft().fail(error)
        self._release(sequence)

    def _pad_slots(self, index: int, items: list[tuple[_Sequence, WorkItem]]) -> list[WorkItem]:
        """Direct strategy: one batch row per slot up to the highest slot in use; empty slots padded.

        A padding row repeats the shapes of a real request with READY (and START/END) false and
        CORRID 0; its results are dropped.
        """
        by_slot = {sequence.slot: item for sequence, item in items}
        in_use = [s.slot for s in self._holders[index]]
        highest = max(in_use + list(by_slot))
        template = items[0][1]
        batch = []
        for slot in range(highest + 1):
            item = by_slot.get(slot)
            batch.append(item if item is not None else self._padding(template))
        return batch

    def _padding(self, template: WorkItem) -> WorkItem:
        inputs = {name: np.zeros_like(array) for name, array in template.inputs.items()}
        for control in self._controls:
            if control.kind == _Kind.CONTROL_SEQUENCE_CORRID:
                value = np.array([b""], dtype=object) if control.dtype == np.object_ else np.zeros(1, dtype=control.dtype)
            else:
                value = np.full(1, control.values[0], dtype=control.dtype)
            inputs[control.name] = value.reshape(template.inputs[control.name].shape)
        return WorkItem(inputs, list(template.output_names), 1, padding=True)

    def _decorate(self, sequence: _Sequence, item: WorkItem) -> None:
        """Add control tensors and the implicit state input; ask for the state output."""
        start = not sequence.started
        end = bool(_request_of(item).sequence_end)
        shape = (1, 1) if self._batching else (1,)
        for control in self._controls:
            if control.kind == _Kind.CONTROL_SEQUENCE_CORRID:
                if control.dtype == np.object_:
                    value = np.array([str(sequence.correlation_id).encode()], dtype=object).reshape(shape)
                else:
                    value = np.full(shape, int(sequence.correlation_id), dtype=control.dtype)
            else:
                flag = {_Kind.CONTROL_SEQUENCE_START: start, _Kind.CONTROL_SEQUENCE_END: end}.get(control.kind, True)
                value = np.full(shape, control.values[1] if flag else control.values[0], dtype=control.dtype)
            item.inputs[control.name] = value
        for state in self._states:
            current = sequence.state.get(state.input_name)
            if current is None or start:
                if state.initial is not None:
                    current = state.initial
                else:
                    current = np.zeros(tuple(d if d > 0 else 1 for d in state.dims), dtype=state.dtype)
                current = current.reshape((1,) + current.shape) if self._batching else current
            item.inputs[state.input_name] = current
            if state.output_name not in item.output_names:
                item.output_names = item.output_names + [state.output_name]
        sequence.started = True

    def _answered(self, sequence: _Sequence, item: WorkItem, _: asyncio.Future[BackendResponse]) -> None:
        self._after(sequence, item)

    def _after(self, sequence: _Sequence, item: WorkItem) -> None:
        sequence.busy = False
        sequence.last_seen = time.monotonic()
        if item.future.done() and not item.future.cancelled() and item.future.exception() is None:
            outputs = item.future.result().outputs or {}
            for state in self._states:
                if state.output_name in outputs:
                    sequence.state[state.input_name] = outputs[state.output_name]
        if self._iterative:
            pass  # released when the request's final response arrived (see _track_iterative)
        elif _request_of(item).sequence_end:
            self._release(sequence)
        elif sequence.queue and sequence.instance >= 0:
            self._wakeups[sequence.instance].set()

    # ------------------------------------------------------------ iterative sequences (request rescheduling)

    def _iterative_request(self, request: InferenceRequest) -> InferenceRequest:
        """A new request of an iterative model starts its own sequence (an internal id if it has none)."""
        cid = request.sequence_id
        if cid in (0, ""):
            self._last_internal_id += 1
            while self._last_internal_id in self._sequences:
                self._last_internal_id += 1
            cid = self._last_internal_id
        return dataclasses.replace(request, sequence_id=cid, sequence_start=True)

    def _reschedule(self, item: WorkItem) -> None:
        """The backend released the request with RESCHEDULE: it runs again, first in its sequence, flags cleared."""
        request = _request_of(item)
        sequence = self._sequences.get(request.sequence_id)
        if sequence is None:  # its sequence timed out meanwhile (Triton answers the same)
            item.fail(invalid_arg(
                f"inference request for sequence {request.sequence_id} to model '{self._name}' must specify the "
                "START flag on the first request of the sequence"))
            return
        item.request = dataclasses.replace(request, sequence_start=False, sequence_end=False)
        sequence.last_seen = time.monotonic()
        sequence.queue.appendleft(item)
        if sequence.instance >= 0:
            self._wakeups[sequence.instance].set()

    def _track_iterative(self, sequence: _Sequence, item: WorkItem) -> None:
        item.reschedule = self._reschedule

        def finished(_: asyncio.Future[BackendResponse]) -> None:
            if self._sequences.get(sequence.correlation_id) is sequence:
                self._release(sequence)
        item.future.add_done_callback(finished)

    async def _reap_idle(self) -> None:
        """Release sequences that received nothing for max_sequence_idle_microseconds."""
        while True:
            await asyncio.sleep(min(self._idle_s / 2, 0.5))
            now = time.monotonic()
            for sequence in list(self._sequences.values()):
                if sequence.busy or sequence.queue or now - sequence.last_seen < self._idle_s:
                    continue
                self._release(sequence)
            for sequence in list(self._backlog):
                if now - sequence.last_seen >= self._idle_s:
                    self._backlog.discard(sequence)
                    self._sequences.pop(sequence.correlation_id, None)
                    while sequence.queue:
                        sequence.queue.popleft().fail(unavailable("timeout of the corresponding sequence has been expired"))

    def inflight(self) -> int:
        return self._inflight

    def pending(self) -> int:
        return sum(len(s.queue) for s in self._sequences.values())

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._timer.close()
        for sequence in list(self._sequences.values()):
            while sequence.queue:
                sequence.queue.popleft().fail(unavailable("model is being unloaded"))
