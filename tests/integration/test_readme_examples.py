"""The README's examples, run as a new user would paste them (ports swapped for free ones)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import start_server

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, re.DOTALL)


@pytest.fixture(scope="module")
def server():
    with start_server(ROOT / "examples" / "models") as running:
        yield running


def _localize(text: str, server) -> str:
    return (text.replace("localhost:8000", server.http_url)
                .replace("localhost:8001", server.grpc_url)
                .replace("localhost:8002", f"127.0.0.1:{server.metrics_port}"))


def test_readme_starts_with_the_two_commands():
    first, second = _blocks("bash")[:2]
    assert "pip install -e ." in first and "naiad serve --model-repository examples/models" in first
    assert first.strip().count("\n") == 0 and second.strip() == "bash scripts/test.sh"
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_examples(server):
    block = next(b for b in _blocks("bash") if "curl" in b)
    script = _localize(block, server)
    result = subprocess.run(["bash", "-c", "set -e\n" + script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("200\n")
    assert '"OUTPUT0","datatype":"FP32","shape":[1,16],"data":[1.0,2.0,3.0' in result.stdout
    assert 'nv_inference_request_success{model="add_sub",version="1"} 1' in result.stdout


@pytest.mark.parametrize("script", ["http_infer.py", "grpc_infer.py"])
def test_client_scripts(server, script):
    url = server.http_url if script.startswith("http") else server.grpc_url
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "clients" / script), "--url", url],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_python_snippets(server):
    snippets = [_localize(b, server) for b in _blocks("python")]
    assert len(snippets) >= 2
    for snippet in snippets:
        result = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert result.returncode == 0, snippet + result.stderr
        assert "[[" in result.stdout  # each prints an output array
