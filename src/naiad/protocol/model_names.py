"""Which model names are safe: a name becomes a directory inside a repository, so it must not escape it."""

from __future__ import annotations

from naiad.protocol.errors import invalid_arg


def model_name_problem(name: str) -> str | None:
    """Why a model name cannot name a directory inside a repository, or None when it can."""
    if name in (".", ".."):
        return "a model name cannot be '.' or '..'"
    for bad, label in (("/", "'/'"), ("\\", "'\\'"), ("\x00", "NUL")):
        if bad in name:
            return f"a model name cannot contain {label}"
    return None


def check_model_name(name: str) -> None:
    """Refuse (INVALID_ARG, HTTP 400) a model name that could escape a repository directory."""
    problem = model_name_problem(name)
    if problem is not None:
        shown = name.replace("\x00", "\\0")
        raise invalid_arg(f"invalid model name '{shown}': {problem}")
