"""Value parsers for command-line flags shared by every flag group."""

from __future__ import annotations

import argparse


def parse_positive_secs(text: str) -> float:
    """A duration in seconds that must be more than zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got '{text}'") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got '{text}'")
    return value


def parse_bool(text: str) -> bool:
    """tritonserver's boolean values: true/false, 1/0, yes/no, on/off."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")
