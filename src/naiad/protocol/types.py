"""Request and response types every frontend decodes into and the core works on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(slots=True)
class SharedMemoryRef:
    """Where a tensor lives in a client-registered shared-memory region."""

    region: str
    byte_size: int
    offset: int = 0


@dataclass(slots=True)
class InferInput:
    """One input tensor: a numpy array of the declared shape, or where it lies in shared memory.

    A frontend leaves `data` None for an input sent by reference (`shared_memory`); the core reads
    the region (in place) when it validates the request and sets `data`.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray | None
    parameters: dict[str, Any] = field(default_factory=dict)
    shared_memory: SharedMemoryRef | None = None


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for, with how it wants it delivered."""

    name: str
    parameters: dict[str, Any] = field(default_factory=dict)
    classification: int = 0
    shared_memory: SharedMemoryRef | None = None


@dataclass(slots=True)
class InferenceRequest:
    """A decoded inference request, the same whatever protocol carried it."""

    model_name: str
    inputs: list[InferInput]
    model_version: str = ""
    id: str = ""
    outputs: list[RequestedOutput] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    timeout_us: int = 0
    sequence_id: int | str = 0
    sequence_start: bool = False
    sequence_end: bool = False
    # When a frontend process handed the request on to this one (time.perf_counter_ns; 0: none did): its
    # queue time, batching delay and request duration start there, as they start at the read in one process.
    received_ns: int = 0


@dataclass(slots=True)
class OutputTensor:
    """One output of a response. `data` is None when it was written to shared memory."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray | None
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class InferenceResponse:
    """The result of one request."""

    model_name: str
    model_version: str
    outputs: list[OutputTensor]
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)

    def output(self, name: str) -> OutputTensor:
        for out in self.outputs:
            if out.name == name:
                return out
        raise KeyError(name)
