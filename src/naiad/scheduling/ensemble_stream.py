"""Decoupled ensembles: each response of a decoupled step runs the steps downstream of it separately.

Every tensor value is kept under a key: () for values that do not descend from a decoupled
step, key + (i,) for what the i-th response of a decoupled step (run under `key`) produced and
what was computed from it. A step runs once per key under which all its inputs exist (an input
found under a prefix of the key is shared by all its extensions), and the ensemble answers once
per key under which all requested outputs exist. Load-time validation guarantees a step never
mixes the responses of two different decoupled steps.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import BackendResponse, ServerServices
from naiad.protocol.errors import NaiadError, internal
from naiad.scheduling.base import WorkItem
from naiad.scheduling.ensemble_steps import step_error, step_outputs, step_request

Key = tuple[int, ...]


@dataclass
class _Event:
    """What one step run reported: tensors produced under `key`, and whether it is done."""

    key: Key
    tensors: dict[str, np.ndarray] | None
    last: bool
    error: NaiadError | None = None


class StreamingEnsembleRun:
    """One request of a decoupled ensemble: streams each complete set of outputs, the last one final."""

    def __init__(self, name: str, steps: list[mc.ModelEnsembling.Step], services: ServerServices, item: WorkItem) -> None:
        self._name = name
        self._steps = steps
        self._services = services
        self._item = item
        self._tensors: dict[str, dict[Key, np.ndarray]] = {n: {(): a} for n, a in item.inputs.items()}
        self._consumers: dict[str, list[int]] = {}
        for index, step in enumerate(steps):
            for tensor in set(step.input_map.values()):
                self._consumers.setdefault(tensor, []).append(index)
        self._launched: set[tuple[int, Key]] = set()
        self._answered: set[Key] = set()
        self._events: asyncio.Queue[_Event] = asyncio.Queue()
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Deliver every ensemble response to the item; raises the first step error."""
        try:
            for index in range(len(self._steps)):
                self._launch(index, ())
            final_sent = False
            while self._running:
                event = await self._events.get()
                if event.last:
                    self._running -= 1
                if event.error is not None:
                    raise event.error
                if not event.tensors:
                    continue
                for tensor, value in event.tensors.items():
                    self._tensors.setdefault(tensor, {})[event.key] = value
                for index in sorted({i for t in event.tensors for i in self._consumers.get(t, ())}):
                    for key in self._candidates(list(self._steps[index].input_map.values()), event.key):
                        self._launch(index, key)
                wanted = self._item.output_names
                answers = [k for k in self._candidates(wanted, event.key) if k not in self._answered] if wanted else []
                for position, key in enumerate(answers):
                    self._answered.add(key)
                    # The response that completes the ensemble carries the final flag, as in Triton.
                    final = position == len(answers) - 1 and self._running == 0 and self._events.empty()
                    outputs = {n: self._value(n, key) for n in self._item.output_names}
                    self._item.deliver(BackendResponse(outputs, final=final))
                    final_sent = final_sent or final
            if not final_sent:
                self._item.deliver(BackendResponse(None, final=True))
        finally:
            for task in self._tasks:
                task.cancel()

    # ------------------------------------------------------------ keys

    def _value(self, tensor: str, key: Key) -> np.ndarray:
        """The value of `tensor` that applies under `key` (stored under the key or one of its prefixes)."""
        values = self._tensors[tensor]
        for length in range(len(key), -1, -1):
            found = values.get(key[:length])
            if found is not None:
                return found
        raise KeyError(tensor)

    def _available(self, tensor: str, key: Key) -> bool:
        values = self._tensors.get(tensor)
        return values is not None and any(key[:length] in values for length in range(len(key) + 1))

    def _candidates(self, tensors: list[str], key: Key) -> list[Key]:
        """Keys, related to a new value under `key`, under which all `tensors` now exist."""
        keys = {key}
        for tensor in tensors:  # a value under a shorter key completes the longer keys already present
            keys.update(k for k in self._tensors.get(tensor, {}) if len(k) > len(key) and k[: len(key)] == key)
        return sorted(k for k in keys if all(self._available(t, k) for t in tensors))

    # ------------------------------------------------------------ steps

    def _launch(self, index: int, key: Key) -> None:
        step = self._steps[index]
        if (index, key) in self._launched or not all(self._available(t, key) for t in step.input_map.values()):
            return
        self._launched.add((index, key))
        inputs = {name: self._value(tensor, key) for name, tensor in step.input_map.items()}
        self._running += 1
        task = asyncio.get_running_loop().create_task(self._run_step(index, key, inputs))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_step(self, index: int, key: Key, inputs: dict[str, np.ndarray]) -> None:
        """Stream one step's responses as events; exactly one event of the run has last=True."""
        step = self._steps[index]
        count = 0
        try:
            async for response, final in self._services.infer_stream(step_request(step, inputs, self._item.request)):
                tensors = None
                assert not isinstance(response, NaiadError)  # errors are raised, not yielded (errors_inline=False)
                if response is not None:
                    produced = step_outputs(response)
                    tensors = {t: produced[n] for n, t in step.output_map.items() if n in produced}
                    # A lone final response is the step's only one: its outputs stay under `key`.
                    sub = key if final and count == 0 else key + (count,)
                    count += 1
                else:
                    sub = key
                self._events.put_nowait(_Event(sub, tensors, final))
                if final:
                    return
            self._events.put_nowait(_Event(key, None, True))
        except NaiadError as exc:
            self._events.put_nowait(_Event(key, None, True, step_error(self._name, index, step, exc)))
        except Exception as exc:  # a bug below us: fail this request, not the server
            self._events.put_nowait(_Event(key, None, True, internal(f"in ensemble '{self._name}', step {index}: {exc}")))
