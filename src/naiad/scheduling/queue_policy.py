"""Priority levels and per-level queue policies (max size, timeouts with REJECT or DELAY)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tritonclient.grpc import model_config_pb2 as mc

from naiad.runtime.removable_queue import RemovableQueue
from naiad.scheduling.base import WorkItem

QUEUE_FULL_MESSAGE = "Exceeds maximum queue size"
TIMEOUT_MESSAGE = "Request timeout expired"


@dataclass
class QueuePolicy:
    delay_on_timeout: bool = False
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    @classmethod
    def from_config(cls, policy: mc.ModelQueuePolicy) -> QueuePolicy:
        return cls(
            delay_on_timeout=policy.timeout_action == mc.ModelQueuePolicy.DELAY,
            default_timeout_us=policy.default_timeout_microseconds,
            allow_timeout_override=policy.allow_timeout_override,
            max_queue_size=policy.max_queue_size,
        )

    def timeout_us(self, requested_us: int) -> int:
        """The queue timeout of a request: the policy's, or a smaller one the request asks for."""
        if self.allow_timeout_override and requested_us > 0:
            return requested_us if self.default_timeout_us == 0 else min(requested_us, self.default_timeout_us)
        return self.default_timeout_us


@dataclass
class PriorityLevel:
    """One FIFO queue plus the requests that timed out with action DELAY (batched last).

    A request leaves either from anywhere in O(1) (cancelled, timed out, taken into a batch).
    """

    policy: QueuePolicy
    queue: RemovableQueue[WorkItem] = field(default_factory=RemovableQueue)
    delayed: RemovableQueue[WorkItem] = field(default_factory=RemovableQueue)

    def size(self) -> int:
        return len(self.queue) + len(self.delayed)


def build_levels(batching: mc.ModelDynamicBatching) -> tuple[list[PriorityLevel], int]:
    """Levels 1..P (index 0 = level 1) and the default level index."""
    count = max(batching.priority_levels, 1)
    default_policy = QueuePolicy.from_config(batching.default_queue_policy)
    levels = []
    for level in range(1, count + 1):
        if level in batching.priority_queue_policy:
            levels.append(PriorityLevel(QueuePolicy.from_config(batching.priority_queue_policy[level])))
        else:
            levels.append(PriorityLevel(default_policy))
    default_level = batching.default_priority_level if batching.priority_levels else 1
    return levels, max(min(default_level, count), 1) - 1


def level_index(priority: int, levels: int, default_index: int) -> int:
    """Priority 0, absent or beyond the number of levels goes to the default level (no error)."""
    if levels > 1 and 1 <= priority <= levels:
        return priority - 1
    return default_index
