"""`naiad analyze` end to end: it starts its own servers, sweeps a tiny space, honours the latency budget,
writes the best configs (which load), the CSV and the HTML report."""

import csv
import subprocess
import sys

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from tests.support.onnx_models import add_sub_model
from tests.support.servers import start_server

BUDGET_MS = 250.0


def test_brute_sweep_with_a_latency_budget(tmp_path):
    source = tmp_path / "models"
    add_sub_model(source, "add_sub", dims=16, max_batch_size=8, scheduler="")
    out_repo, export = tmp_path / "variants", tmp_path / "export"
    done = subprocess.run(
        [sys.executable, "-m", "naiad", "analyze", "profile", "--model-repository", str(source),
         "--profile-models", "add_sub", "--output-model-repository-path", str(out_repo), "--export-path", str(export),
         "--run-config-search-max-instance-count", "1", "--run-config-search-min-model-batch-size", "4",
         "--run-config-search-max-model-batch-size", "4", "--dynamic-batching", "on,preferred",
         "--run-config-search-max-concurrency", "2", "--measurement-interval", "150", "--stability-percentage", "100",
         "--max-trials", "3", "--latency-budget", str(BUDGET_MS)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Best: add_sub_config_" in done.stdout
    # the current config plus the two variants of the space, each loaded from the output repository
    assert sorted(p.name for p in out_repo.iterdir()) == ["add_sub_config_0", "add_sub_config_1", "add_sub_config_default"]
    rows = list(csv.DictReader((export / "results" / "metrics-model-inference.csv").open()))
    assert {r["Model Config Path"] for r in rows} == {"add_sub_config_default", "add_sub_config_0", "add_sub_config_1"}
    assert {r["Concurrency"] for r in rows} == {"1", "2"}
    feasible = [r for r in rows if float(r["p99 Latency (ms)"]) <= BUDGET_MS]
    assert all(r["Satisfies Constraints"] == ("yes" if r in feasible else "no") for r in rows)
    best_dirs = sorted((export / "best_configs").iterdir())
    assert best_dirs and best_dirs[0].name.startswith("1_add_sub_config_")
    chosen = best_dirs[0].name[2:]
    top = max(feasible, key=lambda r: float(r["Throughput (infer/sec)"]))
    assert top["Model Config Path"] == chosen  # the pick is the best throughput within the budget
    config = text_format.Parse((best_dirs[0] / "config.pbtxt").read_text(), mc.ModelConfig())
    measured = text_format.Parse((out_repo / chosen / "config.pbtxt").read_text(), mc.ModelConfig())
    measured.name = "add_sub"
    assert config == measured  # the measured variant, renamed to drop in for the original
    if chosen != "add_sub_config_default":
        assert config.max_batch_size == 4 and config.HasField("dynamic_batching")
    page = (export / "reports" / "summary.html").read_text()
    assert page.count("<svg") == 3 and "Throughput vs p99 latency" in page and chosen in page
    assert (export / "reports" / "summary.txt").read_text().startswith("Model: add_sub.")
    # the winning config loads unchanged in place of the original
    (source / "add_sub" / "config.pbtxt").write_text((best_dirs[0] / "config.pbtxt").read_text())
    with start_server(source) as running:
        assert running.process.poll() is None


def test_a_model_that_does_not_load_is_reported(tmp_path):
    source = tmp_path / "models"
    (source / "broken" / "1").mkdir(parents=True)
    (source / "broken" / "config.pbtxt").write_text('name: "broken"\nbackend: "onnxruntime"\n')
    done = subprocess.run(
        [sys.executable, "-m", "naiad", "analyze", "--model-repository", str(source), "--profile-models", "broken",
         "--output-model-repository-path", str(tmp_path / "o"), "--export-path", str(tmp_path / "e")],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "does not load" in done.stderr
