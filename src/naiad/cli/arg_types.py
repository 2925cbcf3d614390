"""Value parsers for command-line flags shared by every flag group."""

from __future__ import annotations

import argparse


def _positive(text: str, unit: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of {unit}, got '{text}'") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 {unit}, got '{text}'")
    return value


def parse_positive_secs(text: str) -> float:
    """A duration in seconds that must be more than zero."""
    return _positive(text, "seconds")


def parse_positive_ms(text: str) -> float:
    """A duration in milliseconds that must be more than zero."""
    return _positive(text, "milliseconds")


def parse_bool(text: str) -> bool:
    """tritonserver's boolean values: true/false, 1/0, yes/no, on/off."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")
