"""What `naiad serve` tells at start: its version, the settings a user changed, the model table, the endpoints."""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from naiad.cli.startup_checks import Listener


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def changed_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[tuple[str, str]]:
    """(flag, value) for every flag whose value is not its default, in --help order."""
    rows = []
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help",):
            continue
        value = getattr(args, action.dest, action.default)
        if value == action.default or value in ([], None, ""):
            continue
        rows.append((max(action.option_strings, key=len), _shown(value)))
    return rows


def table(headers: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> str:
    """Triton's boxed table (`+----+` rules and `| cell |` rows), one line per row."""
    rows = list(rows)
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(headers)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(cell.ljust(w) for cell, w in zip(cells, widths)) + " |"

    return "\n".join([rule, line(headers), rule, *(line(row) for row in rows), rule])


def model_rows(index: list[dict]) -> list[tuple[str, str, str]]:
    """The repository index as (model, version, status) rows; a failure's reason follows its state,
    its further lines (a traceback) on rows of their own."""
    rows = []
    for entry in index:
        if "version" not in entry:
            continue  # in the repository but never asked for (explicit mode)
        status = entry["state"]
        reason_lines = entry.get("reason", "").rstrip().splitlines()
        if reason_lines:
            status += ": " + reason_lines[0]
        rows.append((entry["name"], entry["version"], status))
        rows.extend(("", "", text) for text in reason_lines[1:] if text.strip())
    return rows


def model_table(index: list[dict]) -> str:
    return table(("Model", "Version", "Status"), model_rows(index))


def load_counts(index: list[dict]) -> tuple[int, int]:
    """(ready, failed) models; a model with any READY version is ready."""
    states: dict[str, set[str]] = {}
    for entry in index:
        if "version" in entry:
            states.setdefault(entry["name"], set()).add(entry["state"])
    ready = sum(1 for s in states.values() if "READY" in s)
    return ready, len(states) - ready


def load_summary(index: list[dict]) -> str:
    """`3 models ready, 1 failed: ...`."""
    ready, failed = load_counts(index)
    text = f"{ready} model{'s' if ready != 1 else ''} ready, {failed} failed"
    return text + (" (reasons in the table above)" if failed else "")


def endpoint_line(bound: list[tuple[Listener, int]]) -> str:
    """Where to send requests, e.g. `HTTP http://0.0.0.0:8000, gRPC 0.0.0.0:8001, metrics http://...`."""
    parts = []
    for listener, port in bound:
        where = f"{listener.host}:{port}"
        parts.append({
            "http_port": f"HTTP/REST http://{where}/v2",
            "grpc_port": f"gRPC {where}",
            "metrics_port": f"metrics http://{where}/metrics",
            "sagemaker_port": f"SageMaker http://{where}/invocations",
            "vertex_ai_port": f"Vertex AI http://{where}",
            "openai_port": f"OpenAI http://{where}/v1",
        }[listener.key])
    return ", ".join(parts) if parts else "no endpoint enabled"
