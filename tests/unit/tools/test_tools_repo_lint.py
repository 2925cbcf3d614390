"""`naiad repo lint`: every problem with file, line and field; exit status for CI; a clean repository passes."""

import json
import subprocess
import sys

from naiad.tools.repo_lint.checks import lint_repository
from tests.support.onnx_models import add_sub_model, ensemble_model

BROKEN = """name: "wrong_name"
backend: "onnxruntime"
max_batch_size: 4
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 0 ] },
  { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUT" dims: [ 4 ] label_filename: "labels.txt" }
]
dynamic_batching { preferred_batch_size: [ 8 ] }
version_policy { specific { versions: [ 3 ] } }
"""


def write(repo, name, config, versions=("1",), files=()):
    model = repo / name
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text(config)
    for version in versions:
        (model / version).mkdir()
        for file in files:
            (model / version / file).write_bytes(b"")
    return model


def test_every_problem_is_reported_with_file_line_and_field(tmp_path):
    add_sub_model(tmp_path, "good")
    write(tmp_path, "broken", BROKEN, versions=("1", "01"))
    write(tmp_path, "syntax", 'name: "syntax"\nbackend: "onnxruntime"\nmax_batch_size: [\n')
    (tmp_path / "noconfig" / "1").mkdir(parents=True)
    ensemble_model(tmp_path, "pipeline", [("good", {"INPUT0": "IN0", "INPUT1": "IN1"}, {"OUTPUT0": "OUT"}),
                                          ("missing_model", {"X": "OUT"}, {"Y": "FINAL"})],
                   [("IN0", "FP32", [16]), ("IN1", "FP32", [16])], [("FINAL", "FP32", [16])])
    problems = lint_repository(tmp_path)
    assert not [p for p in problems if p.model == "good"]
    broken = {(p.field, p.line): p for p in problems if p.model == "broken" and p.severity == "error"}
    path = str(tmp_path / "broken" / "config.pbtxt")
    assert broken[("name", 1)].path == path and "wrong_name" in broken[("name", 1)].message
    assert ("input.dims", 5) in broken and ("input", 6) in broken  # dims 0; 'A' twice
    assert ("output.data_type", 9) in broken and ("output.label_filename", 9) in broken
    assert ("dynamic_batching.preferred_batch_size", 11) in broken
    assert ("version_policy.specific.versions", 12) in broken
    assert any(p.severity == "warning" and p.path.endswith("01") for p in problems)
    syntax = [p for p in problems if p.model == "syntax"]
    assert len(syntax) == 1 and syntax[0].line == 3  # the parser's own line
    assert [p.message for p in problems if p.model == "noconfig"][0].startswith("no config.pbtxt")
    pipeline = [p for p in problems if p.model == "pipeline"]
    assert any(p.field == "ensemble_scheduling.step.model_name" and "missing_model" in p.message for p in pipeline)


def test_missing_model_file_and_python_backend(tmp_path):
    write(tmp_path, "py", 'backend: "python"\ninput [{ name: "X" data_type: TYPE_FP32 dims: [1] }]\n'
                          'output [{ name: "Y" data_type: TYPE_FP32 dims: [1] }]\n')
    problems = lint_repository(tmp_path)
    assert [(p.field, p.path) for p in problems] == [("backend", str(tmp_path / "py" / "1"))]
    assert "model.py" in problems[0].message
    (tmp_path / "py" / "1" / "model.py").write_text("")
    assert lint_repository(tmp_path) == []


def test_cli_exit_status_and_json(tmp_path):
    add_sub_model(tmp_path / "ok", "add_sub")
    clean = subprocess.run([sys.executable, "-m", "naiad", "repo", "lint", str(tmp_path / "ok")],
                           capture_output=True, text=True, timeout=60)
    assert clean.returncode == 0 and clean.stdout == "" and "no problems" in clean.stderr
    write(tmp_path / "bad", "m", 'name: "m"\nbackend: "onnxruntime"\nmax_batch_size: -1\n', files=("model.onnx",))
    bad = subprocess.run([sys.executable, "-m", "naiad", "repo", "lint", str(tmp_path / "bad")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert f"{tmp_path / 'bad' / 'm' / 'config.pbtxt'}:3: error: field 'max_batch_size': must be >= 0" in bad.stdout
    as_json = subprocess.run([sys.executable, "-m", "naiad", "repo", "lint", "--format", "json", str(tmp_path / "bad")],
                             capture_output=True, text=True, timeout=60)
    doc = json.loads(as_json.stdout)
    assert doc["errors"] >= 1 and doc["problems"][0]["line"] == 3 and doc["problems"][0]["field"] == "max_batch_size"


ONNX_CONTRADICTIONS = """name: "m"
backend: "onnxruntime"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1, 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "OUTPUT9" data_type: TYPE_FP32 dims: [ 16 ] }
]
"""


def test_config_contradicting_its_onnx_model_is_reported_with_the_servers_reason(tmp_path):
    add_sub_model(tmp_path, "m")  # INPUT0/INPUT1/OUTPUT0/OUTPUT1: FP32 [-1, 16]
    (tmp_path / "m" / "config.pbtxt").write_text(ONNX_CONTRADICTIONS)
    add_sub_model(tmp_path, "fine")
    path = str(tmp_path / "m" / "config.pbtxt")
    problems = {(p.field, p.line): p.message for p in lint_repository(tmp_path) if p.path == path}
    assert problems == {
        ("input.data_type", 5): "unable to load model 'm', configuration expects datatype TYPE_INT32 for input "
                                "'INPUT0', model provides TYPE_FP32",
        ("input.dims", 6): "model 'm', tensor 'INPUT1': the model expects 2 dimensions (shape [-1,16]) but the model "
                           "configuration specifies 3 dimensions (an initial batch dimension because max_batch_size > 0 "
                           "followed by the explicit tensor shape, making complete shape [-1,1,16])",
        ("output", 10): "unexpected inference output 'OUTPUT9', allowed outputs are: OUTPUT0, OUTPUT1",
    }
    assert not [p for p in lint_repository(tmp_path) if p.model == "fine"]
    cli = subprocess.run([sys.executable, "-m", "naiad", "repo", "lint", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 1
    assert f"{path}:6: error: field 'input.dims': model 'm', tensor 'INPUT1'" in cli.stdout


def test_legitimate_onnx_configs_are_clean(tmp_path):
    from tests.support.onnx_models import identity_onnx, io_block, reshape_model

    reshape_model(tmp_path, "reshaped")
    identity_onnx(tmp_path / "specific" / "1" / "model.onnx", "FP32", ["n", 16])
    (tmp_path / "specific" / "config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: 0\n' + io_block("input", "INPUT0", "FP32", [1, 16])
        + io_block("output", "OUTPUT0", "FP32", [-1, 16]))
    identity_onnx(tmp_path / "completed" / "1" / "model.onnx", "FP32", ["n", 16])
    (tmp_path / "completed" / "config.pbtxt").write_text(  # max_batch_size left to auto-complete
        'backend: "onnxruntime"\n' + io_block("input", "INPUT0", "FP32", [16]))
    assert lint_repository(tmp_path) == []


def test_model_py_alone_is_a_python_model(tmp_path):
    (tmp_path / "auto" / "1").mkdir(parents=True)
    (tmp_path / "auto" / "1" / "model.py").write_text("")
    assert lint_repository(tmp_path) == []
