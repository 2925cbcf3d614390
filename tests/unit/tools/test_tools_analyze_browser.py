"""The analyzer's HTML report opened in a real headless browser (Chromium): it parses, the charts are laid
out as SVG with their points and labels, and a screenshot of the page has content. Skipped where no Chromium
is installed (Debian: apt-get install chromium)."""

import shutil
import struct
import subprocess

import pytest

from naiad.tools.analyze.report import AnalysisReport, rank_results, write_html
from naiad.tools.analyze.search import ConfigResult, Constraints, Measurement, Objectives, SearchSpace, brute_search

BROWSER = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                if shutil.which(name)), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium here (Debian: apt-get install chromium)")


def evaluate(point) -> ConfigResult:
    capacity = 500.0 * point.instances * (2.0 if point.batching == "on" else 1.0)
    rows = []
    for concurrency in (1, 2, 4, 8):
        throughput = min(capacity, 400.0 * concurrency)
        rows.append(Measurement(concurrency, throughput, p99_ms=1500.0 * concurrency / throughput,
                                memory_mb=120.0 + 30 * point.instances))
    return ConfigResult(point, f"m_config_{point.instances}_{point.batching}", rows)


def browse(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--disable-dev-shm-usage", *args], capture_output=True, text=True, timeout=120)


def test_report_renders_in_headless_chromium(tmp_path):
    results = brute_search(SearchSpace([1, 2], [8], ["off", "on"], [1, 2, 4, 8]), evaluate)
    results[0].is_default = True
    constraints = Constraints(max_p99_ms=8.0)
    report = AnalysisReport("m", "brute", constraints, Objectives(), rank_results(results, constraints, Objectives()),
                            3, 10.0)
    page = tmp_path / "summary.html"
    write_html(page, [report])
    dom = browse("--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr
    html = dom.stdout
    # what the browser built: the summary, three charts with their lines/bars and axis labels, the ranked table
    assert "Best: m_config_2_on" in html and html.count("<svg") == 3
    assert html.count("<polyline") >= len(results) and "latency budget" in html and "p99 latency (ms)" in html
    assert html.count("<tr>") == 1 + len(results)
    shot = tmp_path / "shot.png"
    done = browse(f"--screenshot={shot}", "--window-size=1100,2200", page.as_uri())
    assert done.returncode == 0 and shot.exists(), done.stderr
    data = shot.read_bytes()
    width, height = struct.unpack(">II", data[16:24])  # the PNG header's IHDR size
    assert (width, height) == (1100, 2200)
    assert len(data) > 40_000  # a blank page compresses to a few kB; charts and text do not
