"""The analyzer's search and choice on synthetic measurements (no server), config variants, and the report."""

import xml.dom.minidom

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from naiad.tools.analyze.report import AnalysisReport, rank_results, summary_lines, write_csv, write_html
from naiad.tools.analyze.search import (
    ConfigPoint,
    ConfigResult,
    Constraints,
    Measurement,
    Objectives,
    SearchSpace,
    brute_search,
    parse_objectives,
    quick_search,
)
from naiad.tools.analyze.svg import Series, bar_chart, line_chart
from naiad.tools.analyze.variants import apply_point, config_text

CONCURRENCIES = [1, 2, 4, 8, 16]


def landscape(point: ConfigPoint, concurrency: int) -> Measurement:
    """A plausible model: capacity grows with instances and batching; latency grows with queueing."""
    per_instance = 400.0 * (1 + (0.9 * point.max_batch_size ** 0.5 if point.batching != "off" else 0.0))
    if point.batching == "preferred":
        per_instance *= 1.05
    capacity = per_instance * point.instances ** 0.8
    throughput = min(capacity, 450.0 * concurrency)
    latency_ms = 1000.0 * concurrency / throughput
    memory = 100.0 + 40.0 * point.instances + 2.0 * point.max_batch_size
    return Measurement(concurrency, throughput, p99_ms=latency_ms * 1.5, avg_ms=latency_ms, memory_mb=memory)


class Recorder:
    def __init__(self):
        self.calls = 0

    def __call__(self, point: ConfigPoint) -> ConfigResult:
        self.calls += 1
        return ConfigResult(point, f"m_config_{self.calls}", [landscape(point, c) for c in CONCURRENCIES])


SPACE = SearchSpace(instances=[1, 2, 3, 4], batch_sizes=[1, 2, 4, 8, 16], batching=["off", "on", "preferred"],
                    concurrencies=CONCURRENCIES)


def best_of(results, constraints, objectives=Objectives()):
    ranked = rank_results(results, constraints, objectives)
    return ranked[0] if ranked[0].best is not None else None


def test_space_skips_batching_without_max_batch_size():
    space = SearchSpace([1, 2], [0], ["off", "on"], [1])
    assert space.points() == [ConfigPoint(1, 0, "off"), ConfigPoint(2, 0, "off")]
    assert SPACE.size() == 4 * 5 * 3


def test_brute_choice_meets_the_latency_budget():
    results = brute_search(SPACE, Recorder())
    unconstrained = best_of(results, Constraints())
    constrained = best_of(results, Constraints(max_p99_ms=12.0))
    assert constrained.best.p99_ms <= 12.0
    every_feasible = [m for r in results for m in r.measurements if m.p99_ms <= 12.0]
    assert constrained.best.throughput == max(m.throughput for m in every_feasible)
    assert unconstrained.best.throughput >= constrained.best.throughput


def test_memory_constraint_and_throughput_floor():
    results = brute_search(SPACE, Recorder())
    best = best_of(results, Constraints(max_memory_mb=190.0))
    assert best.best.memory_mb <= 190.0 and best.result.point.instances <= 2
    assert best_of(results, Constraints(min_throughput=1e9)) is None


def test_latency_objective_prefers_fast_answers():
    results = brute_search(SPACE, Recorder())
    best = best_of(results, Constraints(), parse_objectives("perf_latency_p99"))
    assert best.best.p99_ms == min(m.p99_ms for r in results for m in r.measurements)


@pytest.mark.parametrize("budget", [0.0, 6.0, 12.0, 30.0])
def test_quick_search_is_within_ten_percent_of_brute_with_fewer_measurements(budget):
    constraints = Constraints(max_p99_ms=budget)
    brute = best_of(brute_search(SPACE, Recorder()), constraints)
    recorder = Recorder()
    quick = best_of(quick_search(SPACE, recorder, constraints, Objectives()), constraints)
    assert quick is not None
    assert quick.best.throughput >= 0.9 * brute.best.throughput
    assert recorder.calls < SPACE.size()


def test_objective_parsing():
    assert parse_objectives("perf_throughput:2,cpu_used_ram").weights == {"perf_throughput": 2.0, "cpu_used_ram": 1.0}
    with pytest.raises(ValueError, match="unknown objective"):
        parse_objectives("gpu_utilization")


def test_apply_point_writes_a_valid_variant():
    base = mc.ModelConfig()
    text_format.Parse('name: "m" backend: "onnxruntime" max_batch_size: 8 '
                      'instance_group [{ kind: KIND_CPU count: 1 }] dynamic_batching { max_queue_delay_microseconds: 50 }',
                      base)
    variant = apply_point(base, "m_config_3", ConfigPoint(3, 16, "preferred"))
    assert variant.name == "m_config_3" and variant.max_batch_size == 16
    assert [(g.count, g.kind) for g in variant.instance_group] == [(3, mc.ModelInstanceGroup.KIND_CPU)]
    assert list(variant.dynamic_batching.preferred_batch_size) == [16]
    assert variant.dynamic_batching.max_queue_delay_microseconds == 50
    off = apply_point(base, "m_config_4", ConfigPoint(1, 4, "off"))
    assert not off.HasField("dynamic_batching")
    reparsed = text_format.Parse(config_text(off), mc.ModelConfig())
    assert reparsed.max_batch_size == 4 and base.name == "m"


def _report(results, constraints):
    results[0].is_default = True
    ranked = rank_results(results, constraints, Objectives())
    return AnalysisReport("m", "brute", constraints, Objectives(), ranked, 3, 12.0)


def test_summary_and_html_report(tmp_path):
    space = SearchSpace([1, 2], [4, 8], ["off", "on"], CONCURRENCIES)
    results = brute_search(space, Recorder())
    results.append(ConfigResult(ConfigPoint(3, 8, "on"), "m_config_9", error="naiad serve did not start:\nboom"))
    report = _report(results, Constraints(max_p99_ms=12.0))
    lines = summary_lines(report)
    winner = report.winners()[0]
    assert lines[1].startswith(f"Best: {winner.result.variant}")
    assert "x the throughput of the current config" in lines[2]
    assert "best_configs/1_" in lines[3]
    write_html(tmp_path / "r.html", report)
    write_csv(tmp_path / "r.csv", report)
    page = (tmp_path / "r.html").read_text()
    assert page.count("<svg") == 3 and "latency budget" in page and "m_config_9" in page
    for svg in page.split("<svg")[1:]:
        xml.dom.minidom.parseString("<svg" + svg.split("</svg>")[0] + "</svg>")  # well-formed
    rows = (tmp_path / "r.csv").read_text().splitlines()
    assert rows[0].startswith("Model,Model Config Path,Instance Count,Max Batch Size,Dynamic Batching,Concurrency")
    assert len(rows) == 1 + sum(len(r.measurements) for r in results)


def test_summary_when_nothing_meets_the_constraints():
    results = brute_search(SearchSpace([1], [4], ["on"], CONCURRENCIES), Recorder())
    lines = summary_lines(_report(results, Constraints(min_throughput=1e9)))
    assert "No configuration met the constraints" in lines[1]


def test_charts_scale_to_the_data():
    svg = line_chart("t", "x", "y", [Series("a", [(1.0, 2816.0), (5.0, 100.0)])])
    assert "3,000" in svg  # the top tick is above the largest value
    bars = bar_chart("b", "MB", [("a & b", 3.0, ""), ("c", 1.5, "#000")])
    assert "a &amp; b" in bars
