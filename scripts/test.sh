#!/usr/bin/env bash
# Installs Naiad with its test dependencies into .venv and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test]"
.venv/bin/python examples/generate_models.py --check
.venv/bin/lint-imports
.venv/bin/ruff check src tests benchmarks examples
.venv/bin/mypy  # files and strictness: [tool.mypy] in pyproject.toml
.venv/bin/python -m pytest -n auto -q "$@"
