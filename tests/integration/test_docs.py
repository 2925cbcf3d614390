"""The documentation speaks to strangers and stays true to `naiad serve --help`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").glob("*.md"),
               *(ROOT / "benchmarks").glob("*.md")])
# Paths and circumstances of one particular machine: absolute work areas, named temporary files, links
# outside the repository, talk of "this shared machine" or of the people who wrote it.
MACHINE_PATH = re.compile(r"/work/|/tmp/[A-Za-z]|\.\./shared/|this shared|shared \d-core|another engineer", re.IGNORECASE)
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")


@pytest.fixture(scope="module")
def serve_help() -> str:
    env = dict(os.environ, COLUMNS="1000")  # one line per flag: no flag name broken at a hyphen
    done = subprocess.run([sys.executable, "-m", "naiad", "serve", "--help"], capture_output=True, text=True, timeout=60,
                          env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _flags(text: str) -> set[str]:
    return set(FLAG.findall(text))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_machine_paths(doc: Path) -> None:
    hits = [f"{doc.relative_to(ROOT)}:{n}: {line.strip()}" for n, line in enumerate(doc.read_text().splitlines(), 1)
            if MACHINE_PATH.search(line)]
    assert not hits, "\n".join(hits)


def test_every_flag_in_the_migration_guide_exists(serve_help: str) -> None:
    named = _flags((ROOT / "docs" / "migrating-from-triton.md").read_text())
    assert len(named) > 30  # the guide does name the flags that differ
    assert not named - _flags(serve_help), sorted(named - _flags(serve_help))


def test_configuration_documents_every_flag(serve_help: str) -> None:
    documented = _flags((ROOT / "docs" / "configuration.md").read_text())
    missing = _flags(serve_help) - documented - {"--help"}
    assert not missing, sorted(missing)
    assert not documented - _flags(serve_help), sorted(documented - _flags(serve_help))
