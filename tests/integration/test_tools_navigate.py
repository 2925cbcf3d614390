"""`naiad navigate` on the command line: variants checked, a wrong candidate rejected, and the written
repository served by the real server (--verify-server) with the original's answers."""

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.support.onnx_models import add_sub_onnx, classifier_onnx
from tests.unit.tools.test_tools_navigate_check import wrong_add_sub


def navigate(*args):
    return subprocess.run([sys.executable, "-m", "naiad", "navigate", *args], capture_output=True, text=True, timeout=240)


def test_fastest_correct_variant_is_served(tmp_path):
    source, wrong = tmp_path / "add_sub.onnx", tmp_path / "wrong.onnx"
    add_sub_onnx(source)
    wrong_add_sub(wrong)
    done = navigate("--onnx", str(source), "--model-name", "add_sub_fast", "--output-repository", str(tmp_path / "repo"),
                    "--workspace", str(tmp_path / "ws"), "--batch-sizes", "1,4", "--measure-seconds", "0.05",
                    "--formats", "onnx", "--extra-onnx", str(wrong), "--verify-server")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "extra-0-wrong" in done.stdout and "INCORRECT" in done.stdout
    assert "Verified: naiad serve loads the repository" in done.stdout
    report = json.loads((tmp_path / "ws" / "navigation_report.json").read_text())
    assert report["chosen"] != "extra-0-wrong"
    assert {v["status"] for v in report["variants"] if v["name"] != "extra-0-wrong"} == {"ok"}


def test_classifier_with_sample_file(tmp_path):
    source = tmp_path / "classifier.onnx"
    classifier_onnx(source)
    samples = tmp_path / "samples.npz"
    np.savez(samples, INPUT=np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32))
    done = navigate("--onnx", str(source), "--model-name", "clf", "--output-repository", str(tmp_path / "repo"),
                    "--workspace", str(tmp_path / "ws"), "--sample-inputs", str(samples), "--batch-sizes", "2,5",
                    "--measure-seconds", "0.05", "--optimize-for", "latency", "--max-batch-size", "16",
                    "--verify-server")
    assert done.returncode == 0, done.stdout + done.stderr
    config = (tmp_path / "repo" / "clf" / "config.pbtxt").read_text()
    assert "max_batch_size: 16" in config and 'name: "PROBS"' in config


def test_torch_source_without_torch_is_explained(tmp_path):
    try:
        import torch  # noqa: F401
    except ImportError:
        done = navigate("--torch-module", "mypkg.net:build", "--model-name", "m", "--output-repository",
                        str(tmp_path / "repo"), "--workspace", str(tmp_path / "ws"))
        assert done.returncode == 2 and "needs PyTorch" in done.stderr


TORCH_MODULES = '''
import torch


class Score(torch.nn.Module):
    """One number per row: the output has no dimension besides the batch one."""

    def forward(self, x):
        return (x * 2.0).sum(dim=1)


def build():
    return Score()


def broken():
    raise RuntimeError("weights file is missing")


not_a_module = 42
'''


def _torch_case(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "scoring.py").write_text(TORCH_MODULES)
    samples = tmp_path / "samples.npz"
    np.savez(samples, x=np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32))
    return samples


def navigate_torch(tmp_path, module, *more):
    import os

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "pkg"), os.environ.get("PYTHONPATH", "")]))
    args = ["--torch-module", module, "--model-name", "score", "--output-repository", str(tmp_path / "repo"),
            "--workspace", str(tmp_path / "ws"), "--sample-inputs", str(tmp_path / "samples.npz"),
            "--batch-sizes", "1,2", "--measure-seconds", "0.05", *more]
    return subprocess.run([sys.executable, "-m", "naiad", "navigate", *args], capture_output=True, text=True,
                          timeout=300, env=env)


def test_torch_output_with_only_a_batch_dimension_is_served(tmp_path):
    pytest.importorskip("torch")
    _torch_case(tmp_path)
    done = navigate_torch(tmp_path, "scoring:build", "--formats", "torchscript,onnx", "--verify-server")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Verified: naiad serve loads the repository" in done.stdout
    config = (tmp_path / "repo" / "score" / "config.pbtxt").read_text()
    assert "dims: 1" in config and "reshape {" in config
    report = json.loads((tmp_path / "ws" / "navigation_report.json").read_text())
    status = {v["name"]: v["status"] for v in report["variants"]}
    assert status["torchscript-trace"] == "ok"
    assert [s for name, s in status.items() if name.startswith("torch-onnx")] and all(
        s == "ok" for name, s in status.items() if name.startswith("torch-onnx")), status  # PyTorch -> ONNX export works


@pytest.mark.parametrize(("module", "message"), [
    ("nowhere.net:build", "cannot import 'nowhere.net'"),
    ("scoring:missing", "module 'scoring' has no attribute 'missing'"),
    ("scoring:broken", "calling broken() failed: RuntimeError: weights file is missing"),
    ("scoring:not_a_module", "'not_a_module' is neither a torch.nn.Module"),
    ("scoring", "expects package.module:factory"),
])
def test_bad_torch_module_is_one_error_line(tmp_path, module, message):
    pytest.importorskip("torch")
    _torch_case(tmp_path)
    done = navigate_torch(tmp_path, module)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith("naiad navigate: error: ") and message in done.stderr


def test_bad_onnx_inputs_are_one_error_line(tmp_path):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a protobuf at all")
    samples = tmp_path / "s.npz"
    np.savez(samples, WRONG=np.zeros((1, 2), np.float32))
    add_sub_onnx(tmp_path / "add_sub.onnx")
    cases = [["--onnx", str(tmp_path / "absent.onnx")], ["--onnx", str(garbage)],
             ["--onnx", str(tmp_path / "add_sub.onnx"), "--sample-inputs", str(samples)]]
    for case in cases:
        done = navigate(*case, "--model-name", "m", "--output-repository", str(tmp_path / "repo"),
                        "--workspace", str(tmp_path / "ws"), "--measure-seconds", "0.05")
        assert done.returncode == 2 and "Traceback" not in done.stderr, (case, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("naiad navigate: error: "), case
