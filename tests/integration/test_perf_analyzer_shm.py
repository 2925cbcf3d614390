"""Triton's perf_analyzer (2.60) with `--shared-memory system` over HTTP, unchanged, against the real server.

perf_analyzer's HTTP client reads `binary_data_size` from every output that has `parameters`; an
output written to shared memory must therefore come back with none, as Triton returns it.
Opt-in: NAIAD_PERF_ANALYZER names the perf_analyzer command (it needs glibc 2.38, so it is
usually a wrapper script around its own loader)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from tests.support.onnx_models import add_sub_model
from tests.support.servers import RunningServer, start_server

PERF_ANALYZER = os.environ.get("NAIAD_PERF_ANALYZER", "")

pytestmark = pytest.mark.skipif(
    not (PERF_ANALYZER and shutil.which(PERF_ANALYZER)),
    reason="set NAIAD_PERF_ANALYZER to a perf_analyzer 2.60 command to run Triton's own load generator",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("perf_analyzer") / "models"
    add_sub_model(repo, "add_sub")
    with start_server(repo) as running:
        yield running


def test_http_with_system_shared_memory(server: RunningServer) -> None:
    result = subprocess.run(
        [PERF_ANALYZER, "-m", "add_sub", "-i", "http", "-u", server.http_url, "--shared-memory", "system",
         "--concurrency-range", "1", "--measurement-mode", "count_windows", "--measurement-request-count", "50",
         "--stability-percentage", "1000", "--max-trials", "3"],  # a loaded machine: no stability demanded
        capture_output=True, text=True, timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "Concurrency: 1, throughput:" in output
    assert "binary_data_size" not in output
