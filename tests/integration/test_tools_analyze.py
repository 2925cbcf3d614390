"""`naiad analyze` end to end: it starts its own servers, sweeps a tiny space, honours the latency budget,
writes the best configs (which load), the CSV and the HTML report."""

import csv
import subprocess
import sys

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from naiad.tools.v2client import HttpControl
from tests.support.onnx_models import add_sub_model, ensemble_model
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
    feasible = [r for r in rows if r["Satisfies Constraints"] == "Yes"]
    assert all((float(r["p99 Latency (ms)"]) <= BUDGET_MS + 0.05) == (r in feasible) for r in rows)
    best_dirs = sorted((export / "best_configs" / "add_sub").iterdir())
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
    assert (export / "reports" / "summaries" / "add_sub" / "summary.html").read_text().count("<svg") == 3
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
    assert done.returncode == 2 and "does not load" in done.stderr and "Traceback" not in done.stderr


def test_several_models_and_an_ensemble_in_one_run(tmp_path):
    source = tmp_path / "models"
    add_sub_model(source, "add_sub", dims=16, max_batch_size=8, scheduler="")
    add_sub_model(source, "pre", dims=16, max_batch_size=8, scheduler="")
    add_sub_model(source, "post", dims=16, max_batch_size=8, scheduler="")
    ensemble_model(source, "pipe", [("pre", {"INPUT0": "IN0", "INPUT1": "IN1"}, {"OUTPUT0": "SUM", "OUTPUT1": "DIFF"}),
                                    ("post", {"INPUT0": "SUM", "INPUT1": "DIFF"}, {"OUTPUT0": "OUT"})],
                   [("IN0", "FP32", [16]), ("IN1", "FP32", [16])], [("OUT", "FP32", [16])])
    out_repo, export = tmp_path / "variants", tmp_path / "export"
    done = subprocess.run(
        [sys.executable, "-m", "naiad", "analyze", "--model-repository", str(source), "--profile-models", "add_sub,pipe",
         "--output-model-repository-path", str(out_repo), "--export-path", str(export),
         "--run-config-search-max-instance-count", "2", "--run-config-search-min-model-batch-size", "4",
         "--run-config-search-max-model-batch-size", "4", "--dynamic-batching", "on",
         "--run-config-search-max-concurrency", "2", "--measurement-interval", "150", "--stability-percentage", "100",
         "--max-trials", "3"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Search (brute): 2 configurations" in done.stdout  # add_sub: 1 or 2 instances
    assert "Search (quick): 4 configurations" in done.stdout  # pipe: pre and post, 1 or 2 instances each
    rows = list(csv.DictReader((export / "results" / "metrics-model-inference.csv").open()))
    assert {r["Model"] for r in rows} == {"add_sub", "pipe"}
    pipe_rows = [r for r in rows if r["Model"] == "pipe"]
    assert all(r["Instance Group"].startswith("pre:") and " post:" in r["Instance Group"] for r in pipe_rows)
    # each ensemble variant is a repository of its own: the ensemble plus its composing models' variant configs
    variant = next(p for p in sorted(out_repo.iterdir()) if p.name.startswith("pipe_config_") and p.name[-1].isdigit())
    assert sorted(p.name for p in variant.iterdir()) == ["pipe", "post", "pre"]
    best = sorted((export / "best_configs" / "pipe").iterdir())[0]
    assert sorted(p.name for p in best.iterdir()) == ["post", "pre"]
    winner = out_repo / best.name.split("_", 1)[1]  # the variant repository it was measured in
    for member in ("pre", "post"):
        config = text_format.Parse((best / member / "config.pbtxt").read_text(), mc.ModelConfig())
        measured = text_format.Parse((winner / member / "config.pbtxt").read_text(), mc.ModelConfig())
        assert config == measured and config.name == member
        if winner.name != "pipe_config_default":  # a variant of the space: batch 4 with dynamic batching
            assert config.max_batch_size == 4 and config.HasField("dynamic_batching")
    page = (export / "reports" / "summary.html").read_text()
    assert 'id="add_sub"' in page and 'id="pipe"' in page and page.count("<svg") == 6
    summary = (export / "reports" / "summary.txt").read_text()
    assert "Model: add_sub." in summary and "Model: pipe (ensemble of pre, post, measured end to end)" in summary


MA_INFERENCE = ["Model", "Batch", "Concurrency", "Model Config Path", "Instance Group", "Max Batch Size",
                "Satisfies Constraints", "Throughput (infer/sec)", "p99 Latency (ms)"]


def test_remote_mode_loads_variants_into_a_running_server(tmp_path):
    source = tmp_path / "models"
    add_sub_model(source, "add_sub", dims=16, max_batch_size=8, scheduler="")
    out_repo, export = tmp_path / "variants", tmp_path / "export"
    with start_server(source, "--model-control-mode", "explicit", "--load-model", "add_sub") as running:
        done = subprocess.run(
            [sys.executable, "-m", "naiad", "analyze", "profile", "--triton-launch-mode", "remote",
             "--triton-http-endpoint", running.http_url, "--triton-grpc-endpoint", running.grpc_url,
             "--profile-models", "add_sub", "--output-model-repository-path", str(out_repo),
             "--export-path", str(export), "--run-config-search-max-instance-count", "2",
             "--run-config-search-min-model-batch-size", "4", "--run-config-search-max-model-batch-size", "4",
             "--dynamic-batching", "on", "--run-config-search-max-concurrency", "2", "--measurement-interval", "150",
             "--stability-percentage", "100", "--max-trials", "3", "--client-protocol", "grpc"],
            capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        control = HttpControl(running.http_url)
        try:
            config = control.config("add_sub")  # reloaded from the repository: the original config again
        finally:
            control.close()
        log = "".join(running.output)
    assert config["max_batch_size"] == 8 and "dynamic_batching" not in config
    # loaded at start, then once per variant of the space and once more to restore the original config
    assert log.count("successfully loaded 'add_sub'") == 1 + 2 + 1
    rows = list(csv.DictReader((export / "results" / "metrics-model-inference.csv").open()))
    with (export / "results" / "metrics-model-inference.csv").open() as handle:
        assert next(csv.reader(handle))[:9] == MA_INFERENCE
    assert {r["Model Config Path"] for r in rows} == {"add_sub_config_default", "add_sub_config_0", "add_sub_config_1"}
    assert {r["Instance Group"] for r in rows} == {"1:CPU", "2:CPU"}
    assert {r["Satisfies Constraints"] for r in rows} == {"Yes"} and {r["Batch"] for r in rows} == {"1"}
    with (export / "results" / "metrics-model-gpu.csv").open() as handle:
        assert next(csv.reader(handle))[:3] == ["Model", "GPU UUID", "Batch"]
    with (export / "results" / "metrics-server-only.csv").open() as handle:
        assert next(csv.reader(handle)) == ["Model", "GPU UUID", "GPU Memory Usage (MB)", "GPU Utilization (%)",
                                            "GPU Power Usage (W)"]
    best = sorted((export / "best_configs" / "add_sub").iterdir())[0]
    assert text_format.Parse((best / "config.pbtxt").read_text(), mc.ModelConfig()).name == "add_sub"


def test_remote_mode_errors_are_one_line(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cases = [
        (["--triton-launch-mode", "remote", "--triton-http-endpoint", f"127.0.0.1:{port}"], "no ready server at"),
        (["--triton-launch-mode", "docker"], "--triton-launch-mode docker is not available"),
        ([], "--model-repository is required in local mode"),
    ]
    for args, message in cases:
        done = subprocess.run(
            [sys.executable, "-m", "naiad", "analyze", "--profile-models", "m", *args,
             "--output-model-repository-path", str(tmp_path / "o"), "--override-output-model-repository",
             "--export-path", str(tmp_path / "e")], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("naiad analyze: error: ") and message in lines[0], lines
