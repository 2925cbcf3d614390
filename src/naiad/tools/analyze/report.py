"""The analyzer's outputs: results CSV, best config.pbtxt files, a summary a person can act on, the HTML report."""

from __future__ import annotations

import csv
import html
from dataclasses import dataclass, field
from pathlib import Path

from naiad.tools.analyze.search import (
    ConfigResult,
    Constraints,
    Measurement,
    Objectives,
    all_measurements,
)
from naiad.tools.analyze.svg import PALETTE, Series, bar_chart, line_chart

# Model Analyzer's default columns (results/metrics-model-inference.csv), then the measurements it leaves out.
INFERENCE_COLUMNS = ["Model", "Batch", "Concurrency", "Model Config Path", "Instance Group", "Max Batch Size",
                     "Satisfies Constraints", "Throughput (infer/sec)", "p99 Latency (ms)"]
EXTRA_COLUMNS = ["p95 Latency (ms)", "p90 Latency (ms)", "Avg Latency (ms)", "Server Queue (ms)",
                 "Server Compute (ms)", "RAM Usage (MB)", "Dynamic Batching", "Stable"]
CSV_COLUMNS = INFERENCE_COLUMNS + EXTRA_COLUMNS
# Model Analyzer's GPU tables: written with their header so scripts find them; no GPU, no rows.
GPU_COLUMNS = ["Model", "GPU UUID", "Batch", "Concurrency", "Model Config Path", "Instance Group",
               "Satisfies Constraints", "GPU Memory Usage (MB)", "GPU Utilization (%)", "GPU Power Usage (W)"]
SERVER_ONLY_COLUMNS = ["Model", "GPU UUID", "GPU Memory Usage (MB)", "GPU Utilization (%)", "GPU Power Usage (W)"]


@dataclass
class Ranked:
    result: ConfigResult
    best: Measurement | None  # best feasible measurement


@dataclass
class AnalysisReport:
    model: str
    search_mode: str
    constraints: Constraints
    objectives: Objectives
    ranked: list[Ranked]
    top: int
    seconds: float
    members: list[str] = field(default_factory=list)  # an ensemble's composing models (empty otherwise)

    def results(self) -> list[ConfigResult]:
        return [r.result for r in self.ranked]

    def default(self) -> Ranked | None:
        return next((r for r in self.ranked if r.result.is_default), None)

    def winners(self) -> list[Ranked]:
        return [r for r in self.ranked if r.best is not None][: self.top]


def rank_results(results: list[ConfigResult], constraints: Constraints, objectives: Objectives) -> list[Ranked]:
    from naiad.tools.analyze.search import rank

    ordered = rank(results, constraints, objectives)
    pool = [m for m in all_measurements(results) if constraints.satisfied(m)] or all_measurements(results)
    return [Ranked(r, r.best(constraints, objectives, pool)) for r in ordered]


def _instance_group(instances: object) -> str:
    """Model Analyzer's "<count>:<kind>" (an ensemble's cells name each composing model)."""
    text = str(instances)
    if ":" in text:  # "pre:1 post:2"
        return " ".join(f"{name}:{count}:CPU" for name, count in (part.split(":") for part in text.split()))
    return f"{text}:CPU"


def write_csv(path: Path, reports: list[AnalysisReport], client_batch_size: int = 1) -> None:
    """Every measurement of every model; an ensemble's cells name each composing model (`name:value`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_COLUMNS)
        for model_report, ranked in ((each, ranked) for each in reports for ranked in each.ranked):
            r, p = ranked.result, ranked.result.point
            for m in r.measurements:
                writer.writerow([model_report.model, client_batch_size, m.concurrency, r.variant,
                                 _instance_group(p.instances),
                                 p.max_batch_size, "Yes" if model_report.constraints.satisfied(m) else "No",
                                 f"{m.throughput:.1f}", f"{m.p99_ms:.1f}", f"{m.p95_ms:.3f}", f"{m.p90_ms:.3f}",
                                 f"{m.avg_ms:.3f}", f"{m.queue_ms:.3f}", f"{m.compute_ms:.3f}",
                                 f"{m.memory_mb:.1f}" if m.memory_mb else "", p.batching,
                                 "yes" if m.stable else "no"])


def write_gpu_tables(results_dir: Path) -> None:
    for name, columns in (("metrics-model-gpu.csv", GPU_COLUMNS), ("metrics-server-only.csv", SERVER_ONLY_COLUMNS)):
        with (results_dir / name).open("w", newline="") as handle:
            csv.writer(handle).writerow(columns)


def summary_lines(report: AnalysisReport) -> list[str]:
    kind = f" (ensemble of {', '.join(report.members)}, measured end to end)" if report.members else ""
    lines = [f"Model: {report.model}{kind}. Search: {report.search_mode}, {len(report.ranked)} configurations measured "
             f"in {report.seconds:.0f} s. Constraints: {report.constraints.describe()}. "
             f"Objective: {', '.join(f'{k} (weight {v:g})' for k, v in report.objectives.weights.items())}."]
    winners = report.winners()
    if not winners:
        lines.append("No configuration met the constraints. Relax the latency budget or the throughput floor, "
                     "or widen the search (more instances, larger max_batch_size).")
        errors = [r.result for r in report.ranked if r.result.error]
        for r in errors[:3]:
            lines.append(f"{r.variant} failed: {r.error.splitlines()[0] if r.error else ''}")
        return lines
    best = winners[0]
    m = best.best
    assert m is not None
    lines.append(f"Best: {best.result.variant}: {best.result.point.describe()}. At concurrency {m.concurrency} it "
                 f"serves {m.throughput:.1f} infer/s with p99 latency {m.p99_ms:.2f} ms and {m.memory_mb:.0f} MB of RAM.")
    default = report.default()
    if default is not None and default.result is not best.result:
        if default.best is not None and default.best.throughput > 0:
            ratio = m.throughput / default.best.throughput
            lines.append(f"That is {ratio:.2f}x the throughput of the current config ({default.best.throughput:.1f} "
                         f"infer/s at concurrency {default.best.concurrency}) under the same constraints.")
        elif default.result.error:
            lines.append("The current config failed to load or run: " + default.result.error.splitlines()[0])
        else:
            lines.append("The current config does not meet the constraints at any measured concurrency.")
    if best.result.is_default:
        lines.append("The current config is already the best of those measured: keep it, and run clients at "
                     f"concurrency {m.concurrency}.")
    elif report.members:
        lines.append(f"To use it: copy each best_configs/{report.model}/1_{best.result.variant}/<model>/config.pbtxt "
                     f"over <model>/config.pbtxt in your model repository (composing models "
                     f"{', '.join(report.members)}), and run clients of {report.model} at concurrency {m.concurrency}.")
    else:
        lines.append(f"To use it: copy best_configs/{report.model}/1_{best.result.variant}/config.pbtxt over "
                     f"{report.model}/config.pbtxt in your model repository, and run clients at concurrency "
                     f"{m.concurrency}.")
    for index, other in enumerate(winners[1:], 2):
        om = other.best
        assert om is not None
        lines.append(f"#{index}: {other.result.variant}: {other.result.point.describe()}: {om.throughput:.1f} infer/s, "
                     f"p99 {om.p99_ms:.2f} ms, {om.memory_mb:.0f} MB (concurrency {om.concurrency}).")
    return lines


def _table(report: AnalysisReport) -> str:
    rows = []
    for index, ranked in enumerate(report.ranked, 1):
        r, m = ranked.result, ranked.best
        cells = [str(index), r.variant + (" (current)" if r.is_default else ""), str(r.point.instances),
                 str(r.point.max_batch_size), r.point.batching]
        if m is not None:
            cells += [str(m.concurrency), f"{m.throughput:.1f}", f"{m.p99_ms:.2f}", f"{m.memory_mb:.0f}", "yes"]
        else:
            reason = (r.error.splitlines()[0][:80] if r.error else "no") if r.error or r.measurements else "no data"
            cells += ["", "", "", "", reason]
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ["#", "Config", "Instances", "Max batch", "Dynamic batching",
                                              "Best concurrency", "Throughput (infer/s)", "p99 (ms)", "RAM (MB)",
                                              "Meets constraints"])
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _charts(report: AnalysisReport) -> list[str]:
    winners = {id(r.result) for r in report.winners()}
    series = []
    color_turn = 0
    for ranked in report.ranked:
        r = ranked.result
        if not r.measurements:
            continue
        emphasis = id(r) in winners or r.is_default
        color = ""
        if emphasis:
            color = PALETTE[color_turn % len(PALETTE)]
            color_turn += 1
        label = r.variant + (" (current)" if r.is_default else "")
        series.append(Series(label, [(m.p99_ms, m.throughput) for m in r.measurements], color, emphasis))
    budget = report.constraints.max_p99_ms or None
    charts = [line_chart("Throughput vs p99 latency (one point per concurrency)", "p99 latency (ms)",
                         "throughput (infer/s)", series, budget, "latency budget" if budget else "")]
    bars = []
    for ranked in report.ranked:
        r = ranked.result
        if r.measurements:
            bars.append((r.variant + (" (current)" if r.is_default else ""), max(m.memory_mb for m in r.measurements),
                         PALETTE[0] if id(r) in winners else "#9aa5b1"))
    if bars:
        charts.append(bar_chart("Server RAM per configuration (peak during its run)", "MB", bars))
    throughput_bars = [(r.result.variant, r.best.throughput, PALETTE[2] if id(r.result) in winners else "#9aa5b1")
                       for r in report.ranked if r.best is not None]
    if throughput_bars:
        charts.append(bar_chart("Best throughput that meets the constraints", "infer/s", throughput_bars))
    return charts


STYLE = """body{font-family:sans-serif;margin:24px;max-width:1000px;color:#222}
h1{font-size:22px}h1.model{border-top:2px solid #1f77b4;padding-top:16px;margin-top:40px}h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
td:nth-child(2),th:nth-child(2),td:nth-child(5){text-align:left}thead{background:#f0f3f7}
.summary{background:#f6f8fa;border-left:4px solid #1f77b4;padding:10px 16px}.summary p{margin:6px 0}"""


def _section(report: AnalysisReport, heading: str) -> str:
    summary = "".join(f"<p>{html.escape(line)}</p>" for line in summary_lines(report))
    charts = "".join(f"<div>{svg}</div>" for svg in _charts(report))
    return (f"{heading}<div class=\"summary\">{summary}</div>\n<h2>Throughput, latency and memory</h2>{charts}\n"
            f"<h2>All configurations (ranked)</h2>{_table(report)}\n")


def write_html(path: Path, reports: list[AnalysisReport]) -> None:
    """One page: a section per model (summary, charts, ranked table)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    names = ", ".join(r.model for r in reports)
    if len(reports) == 1:
        body = _section(reports[0], "")
    else:
        index = "".join(f'<li><a href="#{html.escape(r.model)}">{html.escape(r.model)}</a></li>' for r in reports)
        body = f"<ul>{index}</ul>" + "".join(
            _section(r, f'<h1 id="{html.escape(r.model)}" class="model">{html.escape(r.model)}</h1>') for r in reports)
    path.write_text(f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>naiad analyze: {html.escape(names)}</title>
<style>{STYLE}</style></head><body>
<h1>Model configuration report: {html.escape(names)}</h1>
{body}
<p>Every point is a perf measurement (stable windows merged) at one client concurrency; details are in
results/metrics-model-inference.csv.</p>
</body></html>
""")
