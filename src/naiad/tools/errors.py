"""How every tool fails: one line `naiad <tool>: error: ...` on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


class ToolError(Exception):
    """A failure the tool explains itself; its message is shown as is."""


def one_line(exc: BaseException) -> str:
    """The message of `exc` on one line; errors the tool did not anticipate keep their type name as a hint."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, (ToolError, ValueError, OSError)):
        return text
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text


def fail(tool: str, message: str) -> int:
    print(f"naiad {tool}: error: {' '.join(message.split())}", file=sys.stderr)
    return EXIT_ERROR


def run_tool(tool: str, body: Callable[[], int], interrupted: str = "interrupted") -> int:
    """Runs a tool's command; any exception becomes one error line and exit status 2."""
    try:
        return body()
    except KeyboardInterrupt:
        print(f"naiad {tool}: {interrupted}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        return fail(tool, one_line(exc))
