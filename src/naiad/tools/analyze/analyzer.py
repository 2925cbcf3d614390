"""`naiad analyze`: measure config variants of one model on servers it starts, pick the best, write the report."""

from __future__ import annotations

import io
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from naiad.tools.analyze.report import AnalysisReport, rank_results, summary_lines, write_csv, write_html
from naiad.tools.analyze.search import (
    ConfigPoint,
    ConfigResult,
    Constraints,
    Measurement,
    Objectives,
    SearchSpace,
    brute_search,
    quick_search,
)
from naiad.tools.analyze.server import ManagedServer, ServerStartError
from naiad.tools.analyze.variants import (
    VariantError,
    apply_point,
    check_variable,
    config_from_json,
    config_text,
    read_config,
    write_variant,
)
from naiad.tools.perf import PerfError, PerfOptions
from naiad.tools.perf.profiler import Profiler
from naiad.tools.perf.report import LevelResult
from naiad.tools.v2client import HttpControl

GAIN_TO_CONTINUE = 1.05  # a concurrency step must add 5% throughput (twice in a row) to keep climbing


class AnalyzeError(RuntimeError):
    """The analysis cannot run (message is for the user)."""


def powers_of_two(low: int, high: int) -> list[int]:
    values, value = [], 1
    while value <= high:
        if value >= low:
            values.append(value)
        value *= 2
    return values or [low]


@dataclass
class AnalyzeOptions:
    model_repository: Path
    model: str
    output_repository: Path = Path("output_model_repository")
    export_path: Path = Path("results")
    override_output: bool = False
    search_mode: str = "brute"
    min_instances: int = 1
    max_instances: int = 3
    min_batch_size: int = 1
    max_batch_size: int = 16
    batching: list[str] = field(default_factory=lambda: ["off", "on"])
    min_concurrency: int = 1
    max_concurrency: int = 32
    constraints: Constraints = field(default_factory=Constraints)
    objectives: Objectives = field(default_factory=Objectives)
    protocol: str = "http"
    client_batch_size: int = 1
    measurement_interval_ms: float = 1000.0
    stability_percentage: float = 20.0
    max_trials: int = 6
    top: int = 3
    server_args: list[str] = field(default_factory=list)
    server_timeout_s: float = 120.0


def point_of(config) -> ConfigPoint:
    """The ConfigPoint an existing ModelConfig corresponds to."""
    instances = sum(g.count or 1 for g in config.instance_group) or 1
    batching = "off"
    if config.HasField("dynamic_batching"):
        batching = "preferred" if config.dynamic_batching.preferred_batch_size else "on"
    return ConfigPoint(instances, int(config.max_batch_size), batching)


class Analyzer:
    def __init__(self, options: AnalyzeOptions, out: TextIO | None = None) -> None:
        self.options = options
        self.out = out or sys.stdout
        self.source_dir = Path(options.model_repository) / options.model
        self.count = 0
        self.default: ConfigResult | None = None
        self.base = None

    def log(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    # --------------------------------------------------------------- measuring one variant
    def _stop_rule(self, server: ManagedServer, memory: dict[int, float]):
        budget = self.options.constraints.max_p99_ms

        def stop(results: list[LevelResult]) -> bool:
            last = results[-1]
            memory[int(last.value)] = server.memory_mb()
            if budget > 0 and last.measurement.percentile_us(99) / 1000.0 > budget:
                return True  # more clients only add latency
            throughputs = [r.measurement.throughput for r in results]
            if len(throughputs) >= 3:
                best_before = max(throughputs[:-2])
                return all(t < best_before * GAIN_TO_CONTINUE for t in throughputs[-2:])
            return False

        return stop

    def _measure(self, variant: str, point: ConfigPoint) -> ConfigResult:
        o = self.options
        result = ConfigResult(point, variant)
        started = time.monotonic()
        try:
            with ManagedServer(o.output_repository, [variant], o.server_args, o.server_timeout_s) as server:
                memory: dict[int, float] = {}
                perf = PerfOptions(
                    model=variant, url=server.url(o.protocol), protocol=o.protocol, batch_size=o.client_batch_size,
                    levels_override=[float(c) for c in powers_of_two(o.min_concurrency, o.max_concurrency)],
                    measurement_interval_ms=o.measurement_interval_ms, stability_percentage=o.stability_percentage,
                    max_trials=o.max_trials, percentile=99, progress="off")
                profile = Profiler(perf, io.StringIO(), io.StringIO(), self._stop_rule(server, memory)).run()
                for level in profile.levels:
                    m = level.measurement
                    server_side = m.server()
                    result.measurements.append(Measurement(
                        concurrency=int(level.value), throughput=m.throughput, p99_ms=m.percentile_us(99) / 1000.0,
                        p95_ms=m.percentile_us(95) / 1000.0, p90_ms=m.percentile_us(90) / 1000.0,
                        avg_ms=m.avg_latency_us() / 1000.0, memory_mb=memory.get(int(level.value), 0.0),
                        queue_ms=server_side.queue_us / 1000.0 if server_side else 0.0,
                        compute_ms=(server_side.compute_infer_us + server_side.compute_input_us
                                    + server_side.compute_output_us) / 1000.0 if server_side else 0.0,
                        stable=level.stable))
        except (ServerStartError, PerfError) as exc:
            result.error = str(exc)
        best = max(result.measurements, key=lambda m: m.throughput, default=None)
        status = (f"best {best.throughput:.1f} infer/s at concurrency {best.concurrency} (p99 {best.p99_ms:.2f} ms)"
                  if best else f"failed: {result.error.splitlines()[0] if result.error else 'no data'}")
        self.log(f"  {variant}: {point.describe()}: {status} [{time.monotonic() - started:.1f} s]")
        return result

    def _evaluate(self, point: ConfigPoint) -> ConfigResult:
        assert self.default is not None and self.base is not None
        if point == self.default.point:
            return self.default
        name = f"{self.options.model}_config_{self.count}"
        self.count += 1
        write_variant(self.source_dir, self.options.output_repository / name, apply_point(self.base, name, point))
        return self._measure(name, point)

    # --------------------------------------------------------------- the run
    def _prepare_output(self) -> None:
        out = Path(self.options.output_repository)
        if out.exists() and any(out.iterdir()):
            if not self.options.override_output:
                raise AnalyzeError(f"{out} is not empty: pass --override-output-model-repository to replace it")
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)

    def _default_variant(self) -> ConfigResult:
        """Measure the model as configured today; its server-side config becomes the base of every variant."""
        o = self.options
        name = f"{o.model}_config_default"
        original = read_config(self.source_dir)
        target = o.output_repository / name
        if original is not None:
            check_variable(original)
            original.name = name
            write_variant(self.source_dir, target, original)
        else:
            write_variant(self.source_dir, target, None)
        try:
            with ManagedServer(o.output_repository, [name], o.server_args, o.server_timeout_s) as server:
                control = HttpControl(server.url("http"))
                doc = control.config(name)
                control.close()
        except ServerStartError as exc:
            raise AnalyzeError(f"the model as configured does not load:\n{exc}") from None
        served = config_from_json(doc)
        check_variable(served)
        self.base = original if original is not None else served
        if original is None:
            (target / "config.pbtxt").write_text(config_text(served))
        self.log(f"Measuring {name} (the current config)")
        result = self._measure(name, point_of(self.base))
        result.is_default = True
        return result

    def space(self) -> SearchSpace:
        o = self.options
        assert self.base is not None
        batchable = self.base.max_batch_size > 0
        stateful = self.base.HasField("sequence_batching")
        return SearchSpace(
            instances=list(range(o.min_instances, o.max_instances + 1)),
            batch_sizes=powers_of_two(o.min_batch_size, o.max_batch_size) if batchable else [0],
            batching=list(o.batching) if batchable and not stateful else ["off"],
            concurrencies=powers_of_two(o.min_concurrency, o.max_concurrency),
        )

    def run(self) -> AnalysisReport:
        o = self.options
        if not self.source_dir.is_dir():
            raise AnalyzeError(f"no model directory {self.source_dir}")
        started = time.monotonic()
        try:
            self._prepare_output()
            self.default = self._default_variant()
            space = self.space()
            self.log(f"Search ({o.search_mode}): {space.size()} configurations in the space, "
                     f"concurrency {space.concurrencies[0]}..{space.concurrencies[-1]}")
            if o.search_mode == "quick":
                results = quick_search(space, self._evaluate, o.constraints, o.objectives)
            else:
                results = brute_search(space, self._evaluate)
        except VariantError as exc:
            raise AnalyzeError(str(exc)) from None
        unique: dict[int, ConfigResult] = {id(self.default): self.default}
        for r in results:
            unique.setdefault(id(r), r)
        ranked = rank_results(list(unique.values()), o.constraints, o.objectives)
        report = AnalysisReport(o.model, o.search_mode, o.constraints, o.objectives, ranked, o.top,
                                time.monotonic() - started)
        self._write(report)
        return report

    def _write(self, report: AnalysisReport) -> None:
        export = Path(self.options.export_path)
        write_csv(export / "results" / "metrics-model-inference.csv", report)
        best_dir = export / "best_configs"
        if best_dir.exists():
            shutil.rmtree(best_dir)
        for rank, ranked in enumerate(report.winners(), 1):
            source = self.options.output_repository / ranked.result.variant / "config.pbtxt"
            config = read_config(source.parent)
            if config is None:
                continue
            config.name = self.options.model  # a drop-in replacement for the original
            target = best_dir / f"{rank}_{ranked.result.variant}"
            target.mkdir(parents=True, exist_ok=True)
            (target / "config.pbtxt").write_text(config_text(config))
        lines = summary_lines(report)
        (export / "reports").mkdir(parents=True, exist_ok=True)
        (export / "reports" / "summary.txt").write_text("\n".join(lines) + "\n")
        write_html(export / "reports" / "summary.html", report)
        self.log("")
        for line in lines:
            self.log(line)
        self.log(f"Report: {export / 'reports' / 'summary.html'}")


def run_analyze(options: AnalyzeOptions, out: TextIO | None = None) -> AnalysisReport:
    return Analyzer(options, out).run()
