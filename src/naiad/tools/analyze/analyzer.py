"""`naiad analyze`: measure config variants of each model on servers it starts, pick the best, write the report.

Models are analyzed one after another, each on servers of its own. An ensemble is measured end to end while
its composing models' configs are varied together (each composing model has its own instance count, batch
size and batching coordinates), as Model Analyzer does; each ensemble variant is a small repository of its own.
"""

from __future__ import annotations

import io
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from naiad.tools.analyze.remote import RemoteServer, restore, served_config
from naiad.tools.analyze.report import (
    AnalysisReport,
    rank_results,
    summary_lines,
    write_csv,
    write_gpu_tables,
    write_html,
)
from naiad.tools.analyze.search import (
    ConfigPoint,
    ConfigResult,
    Constraints,
    EnsemblePoint,
    EnsembleSpace,
    Measurement,
    Objectives,
    SearchSpace,
    Space,
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
    ensemble_members,
    is_ensemble,
    read_config,
    write_ensemble_variant,
    write_variant,
)
from naiad.tools.errors import ToolError
from naiad.tools.perf import PerfError, PerfOptions
from naiad.tools.perf.profiler import Profiler
from naiad.tools.perf.report import LevelResult
from naiad.tools.v2client import HttpControl, ServerError

GAIN_TO_CONTINUE = 1.05  # a concurrency step must add 5% throughput (twice in a row) to keep climbing


class AnalyzeError(ToolError):
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
    models: list[str]  # --profile-models a,b: analyzed one after another
    output_repository: Path = Path("output_model_repository")
    export_path: Path = Path("results")
    override_output: bool = False
    search_mode: str = ""  # brute | quick; "" = brute, quick for ensembles (Model Analyzer's defaults)
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
    launch_mode: str = "local"  # local: a server per variant; remote: variants loaded into a running server
    http_endpoint: str = "localhost:8000"  # (remote) Model Analyzer's --triton-http-endpoint
    grpc_endpoint: str = "localhost:8001"  # (remote) --triton-grpc-endpoint

    @property
    def remote(self) -> bool:
        return self.launch_mode == "remote"


def point_of(config) -> ConfigPoint:
    """The ConfigPoint an existing ModelConfig corresponds to."""
    instances = sum(g.count or 1 for g in config.instance_group) or 1
    batching = "off"
    if config.HasField("dynamic_batching"):
        batching = "preferred" if config.dynamic_batching.preferred_batch_size else "on"
    return ConfigPoint(instances, int(config.max_batch_size), batching)


class Analyzer:
    """The search for one profiled model (a plain model, or an ensemble through its composing models)."""

    def __init__(self, options: AnalyzeOptions, model: str, out: TextIO | None = None) -> None:
        self.options = options
        self.model = model
        self.out = out or sys.stdout
        self.source_repo = Path(options.model_repository)
        self.source_dir = self.source_repo / model
        self.count = 0
        self.default: ConfigResult | None = None
        self.base = None  # the model's config (plain models)
        self.ensemble = None  # the ensemble's own config (ensembles)
        self.member_bases: dict[str, object] = {}  # composing model -> its config (ensembles)
        self.variant_configs: dict[str, object] = {}  # (remote) variant -> the config it is loaded with

    def log(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    # --------------------------------------------------------------- measuring one variant
    def _stop_rule(self, server: ManagedServer, memory: dict[int, float]):
        budget = self.options.constraints.max_p99_ms

        def stop(results: list[LevelResult]) -> bool:
            last = results[-1]
            memory[int(last.value)] = server.memory_mb()
            over = [r.measurement.percentile_us(99) / 1000.0 > budget for r in results[-2:]] if budget > 0 else []
            if over and all(over) and (len(over) == 2 or last.measurement.percentile_us(99) > 2000.0 * budget):
                return True  # more clients only add latency (one noisy p99 alone does not end the climb)
            throughputs = [r.measurement.throughput for r in results]
            if len(throughputs) >= 3:
                best_before = max(throughputs[:-2])
                return all(t < best_before * GAIN_TO_CONTINUE for t in throughputs[-2:])
            return False

        return stop

    def _server(self, repository: Path, model: str, variant: str) -> ManagedServer | RemoteServer:
        o = self.options
        if o.remote:
            return RemoteServer(o.http_endpoint, o.grpc_endpoint, self.model, self.variant_configs.get(variant))
        return ManagedServer(repository, [model], o.server_args, o.server_timeout_s)

    def _where(self, variant: str) -> tuple[Path, str]:
        """The repository a variant's server starts on, and the model it loads and measures."""
        if self.ensemble is not None:
            return self.options.output_repository / variant, self.model
        if self.options.remote:
            return self.options.output_repository, self.model  # each variant is loaded as the model itself
        return self.options.output_repository, variant

    def _measure(self, variant: str, point: ConfigPoint | EnsemblePoint) -> ConfigResult:
        o = self.options
        result = ConfigResult(point, variant)
        started = time.monotonic()
        repository, model = self._where(variant)
        try:
            with self._server(repository, model, variant) as server:
                memory: dict[int, float] = {}
                perf = PerfOptions(
                    model=model, url=server.url(o.protocol), protocol=o.protocol, batch_size=o.client_batch_size,
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

    def _evaluate(self, point: ConfigPoint | EnsemblePoint) -> ConfigResult:
        assert self.default is not None
        if point == self.default.point:
            return self.default
        name = f"{self.model}_config_{self.count}"
        self.count += 1
        if isinstance(point, EnsemblePoint):
            members = {m: apply_point(self.member_bases[m], m, p) for m, p in zip(point.models, point.points)}
            write_ensemble_variant(self.source_repo, self.options.output_repository / name, self.model,
                                   self.ensemble, members)
        elif self.options.remote:
            config = apply_point(self.base, name, point)
            self.variant_configs[name] = config
            write_variant(None, self.options.output_repository / name, config)  # the record of what was loaded
        else:
            write_variant(self.source_dir, self.options.output_repository / name, apply_point(self.base, name, point))
        return self._measure(name, point)

    # --------------------------------------------------------------- the current config
    def _served_configs(self, repository: Path, load: str, names: list[str]) -> dict[str, object]:
        o = self.options
        try:
            with ManagedServer(repository, [load], o.server_args, o.server_timeout_s) as server:
                control = HttpControl(server.url("http"))
                try:
                    return {name: config_from_json(control.config(name)) for name in names}
                finally:
                    control.close()
        except ServerStartError as exc:
            raise AnalyzeError(f"'{self.model}' as configured does not load:\n{exc}") from None

    def _default_remote(self, name: str) -> ConfigResult:
        """Remote mode: the config the running server reports is the current one and the base of every variant."""
        o = self.options
        try:
            served = served_config(o.http_endpoint, self.model)
        except (ServerError, OSError) as exc:
            raise AnalyzeError(f"remote mode: cannot read '{self.model}' from {o.http_endpoint}: {exc}") from None
        if is_ensemble(served):
            raise AnalyzeError(f"remote mode: '{self.model}' is an ensemble; its composing models are varied in "
                               "local mode only")
        self.base = served
        write_variant(None, o.output_repository / name, served)
        self.log(f"Measuring {name} (the config the server at {o.http_endpoint} serves)")
        result = self._measure(name, point_of(served))
        result.is_default = True
        return result

    def _default_variant(self) -> ConfigResult:
        """Measure the model as configured today; its server-side config becomes the base of every variant."""
        o = self.options
        name = f"{self.model}_config_default"
        if o.remote:
            return self._default_remote(name)
        original = read_config(self.source_dir)
        if original is not None and is_ensemble(original):
            return self._default_ensemble(original, name)
        target = o.output_repository / name
        if original is not None:
            check_variable(original)
            original.name = name
        write_variant(self.source_dir, target, original)
        served = self._served_configs(o.output_repository, name, [name])[name]
        check_variable(served)
        self.base = original if original is not None else served
        if original is None:
            (target / "config.pbtxt").write_text(config_text(served))
        self.log(f"Measuring {name} (the current config)")
        result = self._measure(name, point_of(self.base))
        result.is_default = True
        return result

    def _default_ensemble(self, ensemble, name: str) -> ConfigResult:
        members = ensemble_members(ensemble)
        missing = [m for m in members if not (self.source_repo / m).is_dir()]
        if missing:
            raise AnalyzeError(f"ensemble '{self.model}' uses {', '.join(missing)}, not in {self.source_repo}")
        self.ensemble = ensemble
        originals = {m: read_config(self.source_repo / m) for m in members}
        repository = write_ensemble_variant(self.source_repo, self.options.output_repository / name, self.model,
                                            ensemble, originals)
        served = self._served_configs(repository, self.model, members)
        for member in members:
            check_variable(served[member])
            self.member_bases[member] = originals[member] if originals[member] is not None else served[member]
            if originals[member] is None:
                (repository / member / "config.pbtxt").write_text(config_text(served[member]))
        self.log(f"Measuring {name} (the ensemble with its composing models as configured: {', '.join(members)})")
        point = EnsemblePoint(tuple(members), tuple(point_of(self.member_bases[m]) for m in members))
        result = self._measure(name, point)
        result.is_default = True
        return result

    # --------------------------------------------------------------- the search
    def _member_space(self, base) -> SearchSpace:
        o = self.options
        batchable = base.max_batch_size > 0
        stateful = base.HasField("sequence_batching")
        return SearchSpace(
            instances=list(range(o.min_instances, o.max_instances + 1)),
            batch_sizes=powers_of_two(o.min_batch_size, o.max_batch_size) if batchable else [0],
            batching=list(o.batching) if batchable and not stateful else ["off"],
            concurrencies=powers_of_two(o.min_concurrency, o.max_concurrency),
        )

    def space(self) -> Space:
        concurrencies = powers_of_two(self.options.min_concurrency, self.options.max_concurrency)
        if self.ensemble is not None:
            return EnsembleSpace([(m, self._member_space(b)) for m, b in self.member_bases.items()], concurrencies)
        assert self.base is not None
        return self._member_space(self.base)

    def run(self) -> AnalysisReport:
        o = self.options
        if not o.remote and not self.source_dir.is_dir():
            raise AnalyzeError(f"no model directory {self.source_dir}")
        started = time.monotonic()
        self.log(f"Analyzing {self.model}")
        try:
            self.default = self._default_variant()
            space = self.space()
            mode = o.search_mode or ("quick" if self.ensemble is not None else "brute")
            self.log(f"Search ({mode}): {space.size()} configurations in the space, "
                     f"concurrency {space.concurrencies[0]}..{space.concurrencies[-1]}")
            if mode == "quick":
                results = quick_search(space, self._evaluate, o.constraints, o.objectives)
            else:
                results = brute_search(space, self._evaluate)
        except VariantError as exc:
            raise AnalyzeError(str(exc)) from None
        finally:
            if o.remote and self.base is not None:
                self._restore()
        unique: dict[int, ConfigResult] = {id(self.default): self.default}
        for r in results:
            unique.setdefault(id(r), r)
        ranked = rank_results(list(unique.values()), o.constraints, o.objectives)
        return AnalysisReport(self.model, mode, o.constraints, o.objectives, ranked, o.top,
                              time.monotonic() - started, list(self.member_bases))

    def _restore(self) -> None:
        try:
            restore(self.options.http_endpoint, self.model, self.base)
            self.log(f"Reloaded {self.model} with the config it had on {self.options.http_endpoint}")
        except ServerStartError as exc:
            self.log(f"Warning: could not reload {self.model} with the config it had: {exc}")

    def write_best(self, report: AnalysisReport, best_dir: Path) -> None:
        """best_configs/<model>/<rank>_<variant>/: config.pbtxt, or <member>/config.pbtxt for an ensemble."""
        for rank, ranked in enumerate(report.winners(), 1):
            target = best_dir / self.model / f"{rank}_{ranked.result.variant}"
            repository, _ = self._where(ranked.result.variant)
            if self.ensemble is not None:
                for member in self.member_bases:
                    config = read_config(repository / member)
                    if config is not None:
                        (target / member).mkdir(parents=True, exist_ok=True)
                        (target / member / "config.pbtxt").write_text(config_text(config))
                continue
            config = read_config(repository / ranked.result.variant)
            if config is None:
                continue
            config.name = self.model  # a drop-in replacement for the original
            target.mkdir(parents=True, exist_ok=True)
            (target / "config.pbtxt").write_text(config_text(config))


def _prepare_output(options: AnalyzeOptions) -> None:
    out = Path(options.output_repository)
    if out.exists() and any(out.iterdir()):
        if not options.override_output:
            raise AnalyzeError(f"{out} is not empty: pass --override-output-model-repository to replace it")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def _write(options: AnalyzeOptions, analyzers: list[Analyzer], reports: list[AnalysisReport], out: TextIO) -> None:
    export = Path(options.export_path)
    write_csv(export / "results" / "metrics-model-inference.csv", reports, options.client_batch_size)
    write_gpu_tables(export / "results")
    best_dir = export / "best_configs"
    if best_dir.exists():
        shutil.rmtree(best_dir)
    for analyzer, report in zip(analyzers, reports):
        analyzer.write_best(report, best_dir)
        write_html(export / "reports" / "summaries" / report.model / "summary.html", [report])
    lines = [line for report in reports for line in summary_lines(report) + [""]]
    (export / "reports").mkdir(parents=True, exist_ok=True)
    (export / "reports" / "summary.txt").write_text("\n".join(lines))
    write_html(export / "reports" / "summary.html", reports)
    print("", file=out)
    for line in lines:
        print(line, file=out)
    print(f"Report: {export / 'reports' / 'summary.html'}", file=out, flush=True)


def run_analyze(options: AnalyzeOptions, out: TextIO | None = None) -> list[AnalysisReport]:
    """Analyze every model of `options.models` in turn; one report each, written together."""
    out = out or sys.stdout
    if not options.models:
        raise AnalyzeError("no model to analyze: pass --profile-models NAME[,NAME...]")
    _prepare_output(options)
    analyzers = [Analyzer(options, model, out) for model in options.models]
    reports = [analyzer.run() for analyzer in analyzers]
    _write(options, analyzers, reports, out)
    return reports
