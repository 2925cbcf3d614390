"""docs/getting-started.md pasted as a new user would: every block, in order, in an empty directory.

Install lines are skipped (the test environment has the packages); `naiad serve` is started on free
ports, and restarted after a block changed the repository, as the guide tells the reader to do."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import RunningServer, start_server

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "docs" / "getting-started.md").read_text()

# What the guide says each call answers (a block is recognised by a piece of its text).
EXPECTED = {
    "/v2/health/ready": "200",
    "models/scale/infer": '"data":[1.0,3.0,5.0,7.0,9.0,11.0,13.0,15.0]',
    "models/shout/infer": '"data":["HELLO!","NAIAD!"]',
    "tiny_llm/generate": '"text_output"',
    "/v1/completions": '"choices"',
    'print(client.infer("scale"': "[[3. 5. 7. 9.]]",
}


def _blocks() -> list[tuple[str, str]]:
    return re.findall(r"```(\w*)\n(.*?)```", GUIDE, re.DOTALL)


def _commands(text: str) -> str:
    """The guide's `.venv/bin/...` commands, run with this interpreter."""
    python = shlex.quote(sys.executable)
    return re.sub(r"\.venv/bin/(naiad|python)\b", lambda m: f"{python} -m naiad" if m[1] == "naiad" else python, text)


def _local(text: str, server: RunningServer) -> str:
    text = text.replace("localhost:8000", server.http_url).replace("localhost:8001", server.grpc_url)
    return _commands(text)


def _expect(block: str, output: str) -> None:
    for marker, answer in EXPECTED.items():
        if marker in block:
            assert answer in output, (block, output)


@pytest.mark.timeout(600)
def test_the_guide_runs_as_written(tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    server: RunningServer | None = None
    repository: str | None = None
    changed = False
    checked = 0
    try:
        for language, block in _blocks():
            if language not in ("bash", "python"):
                continue  # sample output, layouts
            if language == "bash":
                lines = [line for line in block.splitlines() if "pip install" not in line and "-m venv" not in line]
                serve = [line for line in lines if "naiad serve" in line]
                if serve:
                    repository = serve[0].split("--model-repository", 1)[1].split()[0]
                    changed = True
                    continue
                if not any(("curl" in line) for line in lines):
                    script = _commands("\n".join(lines))
                    done = subprocess.run(["bash", "-ec", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
                    assert done.returncode == 0, (script, done.stdout, done.stderr)
                    changed = True
                    continue
            if changed or server is None:
                if server is not None:
                    assert server.stop() == 0
                assert repository is not None, "the guide calls the server before starting it"
                server = start_server(tmp_path / repository)
                changed = False
            if language == "bash":
                done = subprocess.run(["bash", "-ec", _local(block, server)], cwd=tmp_path, capture_output=True,
                                      text=True, timeout=120)
            else:
                done = subprocess.run([sys.executable, "-c", _local(block, server)], cwd=tmp_path, capture_output=True,
                                      text=True, timeout=120)
            assert done.returncode == 0, (block, done.stdout, done.stderr)
            _expect(block, done.stdout)
            checked += 1
        log = "".join(server.output) if server else ""
    finally:
        if server is not None:
            server.stop()
    assert checked >= 5  # every block of calls in the guide ran against a server
    assert "| tiny_llm " in log and "| shout " in log and "| scale " in log
    assert "UNAVAILABLE" not in log
