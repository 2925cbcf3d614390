"""docs/architecture.md names only files, classes and functions that exist in the code."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
SOURCE = "\n".join(path.read_text(encoding="utf-8") for path in (ROOT / "src" / "naiad").rglob("*.py"))
CODE_SPANS = re.findall(r"`([^`\n]+)`", DOC)


def test_every_named_path_exists():
    paths = [span for span in CODE_SPANS if span.startswith(("src/", "tests/", "docs/"))]
    assert len(paths) > 30
    missing = [path for path in paths if not (ROOT / path).exists()]
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


def test_every_named_function_and_class_exists():
    calls = [span[:-2] for span in CODE_SPANS if re.fullmatch(r"[A-Za-z_][\w.]*\(\)", span)]
    classes = [span for span in CODE_SPANS if re.fullmatch(r"[A-Z][a-z]+[A-Za-z0-9]*", span)]
    assert len(calls) > 30 and len(classes) > 15
    missing = []
    for call in calls:
        *owner, name = call.split(".")
        if not re.search(rf"^\s*(async )?def {name}\(", SOURCE, re.MULTILINE):
            missing.append(call)
        if owner and not re.search(rf"^class {owner[-1]}\b", SOURCE, re.MULTILINE):
            missing.append(call)
    for name in classes:
        if not re.search(rf"^(class {name}\b|{name} = )", SOURCE, re.MULTILINE):
            missing.append(name)
    assert not missing, f"docs/architecture.md names code that does not exist: {missing}"
