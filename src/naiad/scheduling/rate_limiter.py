"""The server-wide rate limiter (`--rate-limit=execution_count`).

An instance may start an execution only when it is idle and the resources its instance group
declares (`rate_limiter { resources [...] priority }`) are free; they are held until the
execution ends. Resources live per device unless declared `global`. A resource has as many
copies as the largest count any single loaded instance asks for, unless
`--rate-limit-resource=<name>:<count>[:<device>]` says otherwise.

Among waiting instances of all models the choice is weighted by priority (stride scheduling:
each grant moves an instance's pass forward by its priority and the lowest pass goes next, so
priority 2 gets half the chances of priority 1; 0 counts as 1).

Off (the default), models get a plain InstancePool and the request path never sees this module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import PoolInstance
from naiad.runtime.removable_queue import RemovableQueue
from naiad.runtime.thread_instance import InstancePool

RATE_LIMIT_MODES = ("off", "execution_count")

# A resource pool: (name, device) for per-device resources, (name, None) for global ones.
ResourceKey = tuple[str, "int | None"]


@dataclass(frozen=True)
class ResourceOverride:
    """One `--rate-limit-resource` entry; device None means every device (and global resources)."""

    name: str
    count: int
    device: int | None = None


def parse_resource_override(text: str) -> ResourceOverride:
    """`<name>:<count>[:<device>]` -> ResourceOverride; ValueError when malformed."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(f"--rate-limit-resource expects <name>:<count>[:<device>], got '{text}'")
    try:
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise ValueError(f"--rate-limit-resource expects integer count and device, got '{text}'") from None
    if count < 0 or (device is not None and device < 0):
        raise ValueError(f"--rate-limit-resource count and device must not be negative, got '{text}'")
    return ResourceOverride(parts[0], count, device)


@dataclass(frozen=True)
class InstanceLimits:
    """What one instance needs from the limiter: resource counts per pool and its priority."""

    needs: tuple[tuple[ResourceKey, int], ...] = ()
    priority: int = 1

    @classmethod
    def from_group(cls, group: mc.ModelInstanceGroup, device: int) -> InstanceLimits:
        limiter = group.rate_limiter
        needs: dict[ResourceKey, int] = {}
        for resource in limiter.resources:
            key: ResourceKey = (resource.name, None if getattr(resource, "global") else device)
            needs[key] = needs.get(key, 0) + resource.count
        return cls(tuple(needs.items()), max(limiter.priority, 1))


Waiter = tuple[int, asyncio.Future[PoolInstance]]  # (arrival number, future granted the instance)


@dataclass
class _PoolState:
    limits: dict[int, InstanceLimits]  # id(instance) -> its limits
    idle: list[PoolInstance] = field(default_factory=list)
    waiters: RemovableQueue[Waiter] = field(default_factory=RemovableQueue)  # callers taking any instance
    wanted: dict[int, RemovableQueue[Waiter]] = field(default_factory=dict)  # id(instance) -> its own callers

    def queues(self) -> list[RemovableQueue[Waiter]]:
        return [self.waiters, *self.wanted.values()]


# A grant _dispatch may make: (rank, pool state, waiter queue, instance); the lowest rank goes first.
_Choice = tuple[tuple[float, int, int], _PoolState, RemovableQueue[Waiter], PoolInstance]


class RateLimitedPool(InstancePool):
    """An InstancePool whose hand-outs go through the server's RateLimiter."""

    def __init__(self, instances: list[PoolInstance], limits: list[InstanceLimits], limiter: RateLimiter) -> None:
        if len(instances) != len(limits):
            raise ValueError("every instance needs its rate limiter settings")
        super().__init__(instances)
        self._limiter = limiter
        limiter.register(self, limits)

    async def acquire(self, instance: PoolInstance | None = None) -> PoolInstance:
        return await self._limiter.acquire(self, instance)

    def try_acquire(self, instance: PoolInstance | None = None) -> PoolInstance | None:
        return self._limiter.try_acquire(self, instance)

    def release(self, instance: PoolInstance) -> None:
        self._limiter.release(self, instance)

    async def close(self) -> None:
        await self._wait_for_executions()  # their instances hand their resources back to the limiter first
        self._limiter.unregister(self)
        await super().close()


class RateLimiter:
    """Resource pools and waiting instances of one server; everything runs on the event loop."""

    def __init__(self, mode: str = "off", overrides: Sequence[str | ResourceOverride] = ()) -> None:
        if mode not in RATE_LIMIT_MODES:
            raise ValueError(f"--rate-limit must be one of {', '.join(RATE_LIMIT_MODES)}, got '{mode}'")
        self.mode = mode
        self.enabled = mode == "execution_count"
        self._overrides = [o if isinstance(o, ResourceOverride) else parse_resource_override(o) for o in overrides]
        self._pools: dict[RateLimitedPool, _PoolState] = {}
        self._capacity: dict[ResourceKey, int] = {}
        self._in_use: dict[ResourceKey, int] = {}
        self._held: dict[int, tuple[tuple[ResourceKey, int], ...]] = {}  # id(instance) -> the needs it holds while executing
        self._pass: dict[int, float] = {}  # id(instance) -> stride pass
        self._virtual = 0.0  # pass of the latest grant; where newcomers and long-idle instances start
        self._seq = 0

    # ------------------------------------------------------------ pools

    def pool(self, instances: list[PoolInstance], limits: list[InstanceLimits]) -> InstancePool:
        """The pool a model version should use: limited when on, the plain one when off."""
        if not self.enabled:
            return InstancePool(instances)
        return RateLimitedPool(instances, limits, self)

    def register(self, pool: RateLimitedPool, limits: list[InstanceLimits]) -> None:
        state = _PoolState({id(inst): lim for inst, lim in zip(pool.instances, limits)}, list(pool.instances))
        state.wanted = {id(inst): RemovableQueue() for inst in pool.instances}
        scopes = {name: device is None for other in self._pools.values() for lim in other.limits.values()
                  for (name, device), _ in lim.needs}
        for lim in limits:
            for (name, device), _ in lim.needs:
                if scopes.setdefault(name, device is None) != (device is None):
                    raise ValueError(f"rate limiter resource '{name}' is declared both global and per device")
        capacity = self._capacities([*self._pools.values(), state])
        for lim in limits:
            for key, count in lim.needs:
                if count > capacity[key]:
                    raise ValueError(
                        f"rate limiter resource '{key[0]}' has {capacity[key]} copies but an instance needs {count}"
                    )
        self._pools[pool] = state
        self._capacity = capacity
        for inst in pool.instances:
            self._pass[id(inst)] = self._virtual
        self._dispatch()

    def unregister(self, pool: RateLimitedPool) -> None:
        state = self._pools.pop(pool, None)
        if state is None:
            return
        for queue in state.queues():
            for _, future in queue:
                future.cancel()
        for inst in pool.instances:
            self._pass.pop(id(inst), None)
        self._capacity = self._capacities(list(self._pools.values()))
        self._dispatch()

    def _capacities(self, states: list[_PoolState]) -> dict[ResourceKey, int]:
        capacity: dict[ResourceKey, int] = {}
        for state in states:
            for lim in state.limits.values():
                for key, count in lim.needs:
                    capacity[key] = max(capacity.get(key, 0), count)
        for key in capacity:
            name, device = key
            exact = [o for o in self._overrides if o.name == name and o.device == device]
            every = [o for o in self._overrides if o.name == name and o.device is None]
            if exact or every:
                capacity[key] = (exact or every)[-1].count
        return capacity

    def capacity(self, name: str, device: int | None = None) -> int:
        """Copies of a resource (device None for a global one); 0 when no loaded model uses it."""
        return self._capacity.get((name, device), 0)

    def in_use(self, name: str, device: int | None = None) -> int:
        return self._in_use.get((name, device), 0)

    # ------------------------------------------------------------ hand-outs

    def try_acquire(self, pool: RateLimitedPool, wanted: PoolInstance | None = None) -> PoolInstance | None:
        """An instance of the pool (that one, when wanted is given) that may run now, or None."""
        state = self._pools[pool]
        if (state.waiters if wanted is None else state.wanted[id(wanted)]):
            return None  # earlier callers go first
        instance = self._candidate(state, wanted)
        if instance is not None:
            self._grant(state, instance)
        return instance

    async def acquire(self, pool: RateLimitedPool, wanted: PoolInstance | None = None) -> PoolInstance:
        instance = self.try_acquire(pool, wanted)
        if instance is not None:
            return instance
        state = self._pools[pool]
        queue = state.waiters if wanted is None else state.wanted[id(wanted)]
        future: asyncio.Future[PoolInstance] = asyncio.get_running_loop().create_future()
        self._seq += 1
        entry = (self._seq, future)
        queue.append(entry)
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(pool, future.result())  # granted, but the caller went away
            else:
                queue.discard(entry)  # O(1) however many wait
            raise

    def release(self, pool: RateLimitedPool, instance: PoolInstance) -> None:
        for key, count in self._held.pop(id(instance), ()):
            self._in_use[key] -= count
        state = self._pools.get(pool)
        if state is not None:
            state.idle.append(instance)
        self._dispatch()

    def _fits(self, limits: InstanceLimits) -> bool:
        return all(self._in_use.get(key, 0) + count <= self._capacity.get(key, 0) for key, count in limits.needs)

    def _effective_pass(self, instance: PoolInstance) -> float:
        return max(self._pass[id(instance)], self._virtual)

    def _candidate(self, state: _PoolState, wanted: PoolInstance | None = None) -> PoolInstance | None:
        """The idle instance of this pool (wanted only, when given) that may run now (lowest pass first), or None."""
        best = None
        for instance in state.idle:
            if wanted is not None and instance is not wanted:
                continue
            if self._fits(state.limits[id(instance)]):
                if best is None or self._effective_pass(instance) < self._effective_pass(best):
                    best = instance
        return best

    def _grant(self, state: _PoolState, instance: PoolInstance) -> None:
        limits = state.limits[id(instance)]
        state.idle.remove(instance)
        for key, count in limits.needs:
            self._in_use[key] = self._in_use.get(key, 0) + count
        self._held[id(instance)] = limits.needs
        start = self._effective_pass(instance)
        self._virtual = start
        self._pass[id(instance)] = start + limits.priority

    def _dispatch(self) -> None:
        """Hand free instances to waiters until nobody waiting can run; lowest pass wins across models."""
        while True:
            best: _Choice | None = None
            for state in self._pools.values():
                for queue in state.queues():
                    while queue and queue.peek()[1].done():  # cancelled, not withdrawn yet
                        queue.popleft()
                if state.waiters:
                    best = self._better(best, state, state.waiters, self._candidate(state))
                for instance in state.idle:
                    queue = state.wanted[id(instance)]
                    if queue:
                        best = self._better(best, state, queue, self._candidate(state, instance))
            if best is None:
                return
            _, state, queue, instance = best
            self._grant(state, instance)
            _, future = queue.popleft()
            future.set_result(instance)

    def _better(self, best: _Choice | None, state: _PoolState, queue: RemovableQueue[Waiter],
                instance: PoolInstance | None) -> _Choice | None:
        """The better of best and (queue's first waiter, instance); instance None means it cannot run."""
        if instance is None:
            return best
        rank = (self._effective_pass(instance), state.limits[id(instance)].priority, queue.peek()[0])
        if best is None or rank < best[0]:
            return (rank, state, queue, instance)
        return best

