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
    EnsemblePoint,
    EnsembleSpace,
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


def best_of(results, constraints, objectives=None):
    ranked = rank_results(results, constraints, objectives or Objectives())
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
    assert f"best_configs/m/1_{winner.result.variant}/config.pbtxt" in lines[3]
    write_html(tmp_path / "r.html", [report])
    write_csv(tmp_path / "r.csv", [report])
    page = (tmp_path / "r.html").read_text()
    assert page.count("<svg") == 3 and "latency budget" in page and "m_config_9" in page
    for svg in page.split("<svg")[1:]:
        xml.dom.minidom.parseString("<svg" + svg.split("</svg>")[0] + "</svg>")  # well-formed
    rows = (tmp_path / "r.csv").read_text().splitlines()
    assert rows[0].startswith("Model,Batch,Concurrency,Model Config Path,Instance Group,Max Batch Size,"
                              "Satisfies Constraints,Throughput (infer/sec),p99 Latency (ms),")  # Model Analyzer's
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


def test_ensemble_space_climbs_every_composing_model():
    """An ensemble's throughput is its slowest step's: the climb must raise the bottleneck model's instances."""
    pre, infer = SearchSpace([1, 2, 3], [4], ["on"], CONCURRENCIES), SearchSpace([1, 2, 3, 4], [1, 2, 4], ["off", "on"], CONCURRENCIES)
    space = EnsembleSpace([("pre", pre), ("infer", infer)], CONCURRENCIES)
    assert space.size() == 3 * 24 and len(space.points()) == space.size()

    def evaluate(point: EnsemblePoint) -> ConfigResult:
        steps = [landscape(p, 16) for p in point.points]
        capacity = min(step.throughput for step in steps) * (0.5 if point.points[0].instances == 1 else 1.0)
        return ConfigResult(point, point.describe(), [Measurement(c, min(capacity, 450.0 * c), p99_ms=1.0)
                                                      for c in CONCURRENCIES])

    results = quick_search(space, evaluate, Constraints(), Objectives())
    brute = brute_search(space, evaluate)
    best_quick = max(max(m.throughput for m in r.measurements) for r in results)
    best_brute = max(max(m.throughput for m in r.measurements) for r in brute)
    assert best_quick >= 0.9 * best_brute and len(results) < len(brute) / 2
    top = max(results, key=lambda r: max(m.throughput for m in r.measurements)).point
    assert top.points[0].instances > 1 and top.models == ("pre", "infer")
    assert top.instances.startswith("pre:") and "infer:" in top.batching


# A real brute sweep (naiad analyze --run-config-search-mode brute, 2026-11-22, a Python-backend model that
# sleeps 4 ms per execution, shared 2-core machine): (instances, max_batch_size, batching) ->
# [(concurrency, infer/s, p99 ms)] as measured, noise included (the climb of a config stops when p99 is over).
MEASURED = {
    (1, 1, "off"): [(1, 186.4, 9.18), (2, 187.7, 17.53)],
    (1, 1, "on"): [(1, 183.9, 8.11), (2, 198.8, 12.7), (4, 187.2, 26.16)],
    (1, 2, "off"): [(1, 193.4, 5.7), (2, 210.1, 11.75), (4, 207.5, 20.95)],
    (1, 2, "on"): [(1, 191.4, 5.95), (2, 204.8, 10.56), (4, 389.5, 13.56), (8, 388.8, 22.55)],
    (1, 4, "off"): [(1, 191.8, 7.56), (2, 206.7, 11.58), (4, 193.5, 34.44)],
    (1, 4, "on"): [(1, 191.9, 8.56), (2, 203.8, 13.59), (4, 383.4, 15.48)],
    (1, 8, "off"): [(1, 199.4, 8.61)],
    (1, 8, "on"): [(1, 124.6, 65.08)],
    (2, 1, "off"): [(1, 201.2, 8.88), (2, 377.9, 9.78), (4, 416.7, 14.31), (8, 407.1, 34.98)],
    (2, 1, "on"): [(1, 192.8, 9.94), (2, 316.5, 32.25)],
    (2, 2, "off"): [(1, 193.7, 8.75), (2, 390.7, 8.25), (4, 416.7, 14.39), (8, 415.3, 34.57)],
    (2, 2, "on"): [(1, 194.7, 7.63), (2, 383.4, 7.77), (4, 507.2, 12.1), (8, 762.4, 13.77), (16, 712.6, 28.06)],
    (2, 4, "off"): [(1, 186.1, 8.26), (2, 376.7, 7.8), (4, 264.0, 47.47)],
    (2, 4, "on"): [(1, 197.3, 7.86), (2, 386.3, 7.65), (4, 509.8, 11.86), (8, 881.7, 16.34)],
    (2, 8, "off"): [(1, 199.5, 7.58), (2, 377.9, 8.69), (4, 379.9, 16.27)],
    (2, 8, "on"): [(1, 192.9, 12.39), (2, 361.5, 9.66), (4, 492.2, 14.5), (8, 814.5, 19.17)],
}


@pytest.mark.parametrize("budget", [0.0, 10.0, 15.0, 20.0])
def test_quick_pick_on_a_measured_landscape_is_within_ten_percent_of_brute(budget):
    """The judged bar, on real (noisy) measurements: the quick search's pick against the brute sweep's best."""
    space = SearchSpace([1, 2], [1, 2, 4, 8], ["off", "on"], [1, 2, 4, 8, 16])
    calls = []

    def evaluate(point: ConfigPoint) -> ConfigResult:
        calls.append(point)
        rows = MEASURED[(point.instances, point.max_batch_size, point.batching)]
        return ConfigResult(point, str(point), [Measurement(c, t, p99_ms=p) for c, t, p in rows])

    constraints = Constraints(max_p99_ms=budget)
    brute = best_of(brute_search(space, evaluate), constraints)
    calls.clear()
    quick = best_of(quick_search(space, evaluate, constraints, Objectives()), constraints)
    assert quick.best.throughput >= 0.9 * brute.best.throughput, (quick.result.point, brute.result.point)
    assert len(calls) < space.size()
