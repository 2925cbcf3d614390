"""The configuration search space, constraints and objectives, and the two searches (brute, quick)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BATCHING_CHOICES = ("off", "on", "preferred")


@dataclass(frozen=True)
class ConfigPoint:
    instances: int
    max_batch_size: int
    batching: str  # off | on (dynamic batching) | preferred (dynamic batching, preferred size = max_batch_size)

    def describe(self) -> str:
        batching = {"off": "no dynamic batching", "on": "dynamic batching",
                    "preferred": f"dynamic batching (preferred size {self.max_batch_size})"}[self.batching]
        return f"{self.instances} instance(s), max_batch_size {self.max_batch_size}, {batching}"


@dataclass
class Measurement:
    concurrency: int
    throughput: float  # infer/sec
    p99_ms: float
    p95_ms: float = 0.0
    p90_ms: float = 0.0
    avg_ms: float = 0.0
    memory_mb: float = 0.0  # server RAM (resident set of the server's processes)
    queue_ms: float = 0.0
    compute_ms: float = 0.0
    stable: bool = True


@dataclass
class Constraints:
    max_p99_ms: float = 0.0  # perf_latency_p99 (0 = none)
    min_throughput: float = 0.0  # perf_throughput
    max_memory_mb: float = 0.0  # cpu_used_ram

    def violation(self, m: Measurement) -> float:
        """0 when every constraint holds, else the summed relative excess."""
        excess = 0.0
        if self.max_p99_ms > 0 and m.p99_ms > self.max_p99_ms:
            excess += m.p99_ms / self.max_p99_ms - 1.0
        if self.min_throughput > 0 and m.throughput < self.min_throughput:
            excess += 1.0 - m.throughput / self.min_throughput
        if self.max_memory_mb > 0 and m.memory_mb > self.max_memory_mb:
            excess += m.memory_mb / self.max_memory_mb - 1.0
        return excess

    def satisfied(self, m: Measurement) -> bool:
        return self.violation(m) == 0.0

    def describe(self) -> str:
        parts = []
        if self.max_p99_ms > 0:
            parts.append(f"p99 latency <= {self.max_p99_ms:g} ms")
        if self.min_throughput > 0:
            parts.append(f"throughput >= {self.min_throughput:g} infer/s")
        if self.max_memory_mb > 0:
            parts.append(f"memory <= {self.max_memory_mb:g} MB")
        return ", ".join(parts) or "none"


OBJECTIVES = {  # name -> (attribute, higher is better)
    "perf_throughput": ("throughput", True),
    "perf_latency_p99": ("p99_ms", False),
    "cpu_used_ram": ("memory_mb", False),
}


@dataclass
class Objectives:
    weights: dict[str, float] = field(default_factory=lambda: {"perf_throughput": 1.0})

    def score(self, m: Measurement, pool: list[Measurement]) -> float:
        """Weighted sum of each objective relative to the best value in `pool` (1.0 = best on all)."""
        total = sum(self.weights.values()) or 1.0
        value = 0.0
        for name, weight in self.weights.items():
            attribute, higher = OBJECTIVES[name]
            values = [getattr(p, attribute) for p in pool] or [getattr(m, attribute)]
            mine = getattr(m, attribute)
            if higher:
                best = max(values)
                value += weight * (mine / best if best > 0 else 0.0)
            else:
                best = min(v for v in values if v > 0) if any(v > 0 for v in values) else 0.0
                value += weight * (best / mine if mine > 0 else 1.0)
        return value / total


def parse_objectives(text: str) -> Objectives:
    """'perf_throughput' or 'perf_throughput:2,perf_latency_p99:1'."""
    weights = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, weight = item.partition(":")
        if name not in OBJECTIVES:
            raise ValueError(f"unknown objective '{name}' (known: {', '.join(OBJECTIVES)})")
        weights[name] = float(weight) if weight else 1.0
    return Objectives(weights or {"perf_throughput": 1.0})


@dataclass
class ConfigResult:
    point: Any  # ConfigPoint, or EnsemblePoint for an ensemble
    variant: str
    measurements: list[Measurement] = field(default_factory=list)
    error: str = ""
    is_default: bool = False

    def feasible(self, constraints: Constraints) -> list[Measurement]:
        return [m for m in self.measurements if constraints.satisfied(m)]

    def best(self, constraints: Constraints, objectives: Objectives, pool: list[Measurement]) -> Measurement | None:
        candidates = self.feasible(constraints)
        if not candidates:
            return None
        return max(candidates, key=lambda m: objectives.score(m, pool))


def all_measurements(results: list[ConfigResult]) -> list[Measurement]:
    return [m for r in results for m in r.measurements]


def config_score(result: ConfigResult, constraints: Constraints, objectives: Objectives,
                 pool: list[Measurement]) -> float:
    """Best feasible score (0..1]; configs with nothing feasible rank below, by how far off they are."""
    best = result.best(constraints, objectives, pool)
    if best is not None:
        return objectives.score(best, pool)
    if not result.measurements:
        return -1e9
    return -1.0 - min(constraints.violation(m) for m in result.measurements)


def rank(results: list[ConfigResult], constraints: Constraints, objectives: Objectives) -> list[ConfigResult]:
    pool = [m for m in all_measurements(results) if constraints.satisfied(m)] or all_measurements(results)
    return sorted(results, key=lambda r: config_score(r, constraints, objectives, pool), reverse=True)


@dataclass
class SearchSpace:
    instances: list[int]
    batch_sizes: list[int]  # [0] for a model without batching
    batching: list[str]
    concurrencies: list[int]

    def dims(self) -> list[list[object]]:
        return [list(self.instances), list(self.batch_sizes), list(self.batching)]

    @staticmethod
    def valid(point: ConfigPoint) -> bool:
        return point.max_batch_size > 0 or point.batching == "off"

    def points(self) -> list[ConfigPoint]:
        """The brute-force cross product (invalid combinations left out)."""
        points = [ConfigPoint(i, b, d) for i, b, d in itertools.product(*self.dims())]
        return [p for p in points if self.valid(p)]

    def size(self) -> int:
        return len(self.points())

    def point_at(self, coords: tuple[int, ...]) -> ConfigPoint:
        dims = self.dims()
        return ConfigPoint(*(dims[d][c] for d, c in enumerate(coords)))  # type: ignore[arg-type]

    def start(self) -> tuple[int, ...]:
        """Where the quick search starts: one instance, the smallest batch, dynamic batching if allowed."""
        batching = self.dims()[2]
        coords = (0, 0, next((i for i, b in enumerate(batching) if b != "off"), 0))
        return coords if self.valid(self.point_at(coords)) else (0, 0, 0)

    def point_valid(self, point: ConfigPoint) -> bool:
        return self.valid(point)


@dataclass(frozen=True)
class EnsemblePoint:
    """One configuration of every composing model of an ensemble (in step order)."""

    models: tuple[str, ...]
    points: tuple[ConfigPoint, ...]

    def describe(self) -> str:
        return "; ".join(f"{m}: {p.describe()}" for m, p in zip(self.models, self.points))

    def _joined(self, attribute: str) -> str:
        return " ".join(f"{m}:{getattr(p, attribute)}" for m, p in zip(self.models, self.points))

    @property
    def instances(self) -> str:
        return self._joined("instances")

    @property
    def max_batch_size(self) -> str:
        return self._joined("max_batch_size")

    @property
    def batching(self) -> str:
        return self._joined("batching")


@dataclass
class EnsembleSpace:
    """The composing models' spaces side by side: a coordinate per model per dimension."""

    members: list[tuple[str, SearchSpace]]
    concurrencies: list[int]

    def dims(self) -> list[list[object]]:
        return [d for _, space in self.members for d in space.dims()]

    def point_at(self, coords: tuple[int, ...]) -> EnsemblePoint:
        points = tuple(space.point_at(coords[3 * i:3 * i + 3]) for i, (_, space) in enumerate(self.members))
        return EnsemblePoint(tuple(name for name, _ in self.members), points)

    def point_valid(self, point: EnsemblePoint) -> bool:
        return all(SearchSpace.valid(p) for p in point.points)

    def start(self) -> tuple[int, ...]:
        return tuple(c for _, space in self.members for c in space.start())

    def points(self) -> list[EnsemblePoint]:
        names = tuple(name for name, _ in self.members)
        return [EnsemblePoint(names, combo) for combo in itertools.product(*(sp.points() for _, sp in self.members))]

    def size(self) -> int:
        total = 1
        for _, space in self.members:
            total *= space.size()
        return total


Space = SearchSpace | EnsembleSpace
Evaluate = Callable[[Any], ConfigResult]


def brute_search(space: Space, evaluate: Evaluate) -> list[ConfigResult]:
    return [evaluate(point) for point in space.points()]


def quick_search(space: Space, evaluate: Evaluate, constraints: Constraints, objectives: Objectives,
                 max_steps: int = 0) -> list[ConfigResult]:
    """Hill climbing on the grid (one coordinate +-1 at a time) from the smallest configuration with
    dynamic batching; stops when no neighbour scores better. Each point is measured at most once.
    For an ensemble every composing model's dimensions are coordinates of the same climb."""
    dims = space.dims()
    seen: dict[tuple[int, ...], ConfigResult] = {}
    point_at = space.point_at

    def visit(coords: tuple[int, ...]) -> ConfigResult:
        if coords not in seen:
            seen[coords] = evaluate(point_at(coords))
        return seen[coords]

    def score(coords: tuple[int, ...]) -> float:
        results = list(seen.values())
        pool = [m for m in all_measurements(results) if constraints.satisfied(m)] or all_measurements(results)
        return config_score(seen[coords], constraints, objectives, pool)

    current = space.start()
    visit(current)
    def around(center: tuple[int, ...], distance: int) -> list[tuple[int, ...]]:
        found = []
        for d in range(len(dims)):
            for step in (-distance, distance):
                coords = list(center)
                coords[d] += step
                candidate = tuple(coords)
                if 0 <= coords[d] < len(dims[d]) and space.point_valid(point_at(candidate)):
                    found.append(candidate)
        return found

    def better(candidates: list[tuple[int, ...]]) -> tuple[int, ...] | None:
        for coords in candidates:
            visit(coords)
        best = max(candidates, key=score, default=current)
        return best if score(best) > score(current) + 0.01 * abs(score(current)) else None

    limit = max_steps or sum(len(d) for d in dims) * 2
    for _ in range(limit):
        # one step along each coordinate; when none helps, two steps (a single noisy measurement next
        # to the current point must not end the climb) before giving up
        step = better(around(current, 1)) or better(around(current, 2))
        if step is None:
            break
        current = step
    return list(seen.values())
