"""`naiad navigate` on the command line: variants checked, a wrong candidate rejected, and the written
repository served by the real server (--verify-server) with the original's answers."""

import json
import subprocess
import sys

import numpy as np

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
        assert done.returncode == 1 and "needs PyTorch" in done.stderr
