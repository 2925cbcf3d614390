"""Runtime log settings (the logging extension) and Triton's log line formats."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass

from naiad.protocol.errors import invalid_arg, unavailable, unsupported
from naiad.protocol.request_json import json_preview

FORMATS = ("default", "ISO8601")

# `log.info(text, extra={VERBATIM: True})` prints text as written (tables, multi-line reasons the server
# composed itself); other messages are escaped onto one line as Triton does.
VERBATIM = "naiad_verbatim"


@dataclass
class LogSettings:
    """What GET /v2/logging shows; POST changes all but log_file."""

    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self.listeners: list = []  # called with the settings after every change

    def as_dict(self) -> dict:
        return {
            "log_file": self.log_file,
            "log_info": self.log_info,
            "log_warning": self.log_warning,
            "log_error": self.log_error,
            "log_verbose_level": self.log_verbose_level,
            "log_format": self.log_format,
        }

    def update(self, changes: dict) -> dict:
        """Apply a POST body; null values are ignored; errors use Triton's codes and texts."""
        if not isinstance(changes, dict):
            raise invalid_arg("log settings must be a JSON object")
        staged = self.as_dict()
        for key, value in changes.items():
            if value is None:
                continue
            if key == "log_file":
                raise unsupported("log file location can not be updated through network protocol")
            if key in ("log_info", "log_warning", "log_error"):
                if not isinstance(value, bool):
                    raise invalid_arg(f"expect boolean for '{key}'")
                staged[key] = value
            elif key == "log_verbose_level":
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise invalid_arg(f"expect positive integer for '{key}', got {json_preview(value)}")
                staged[key] = value
            elif key == "log_format":
                if value not in FORMATS:
                    shown = value if isinstance(value, str) else json_preview(value)
                    raise unavailable(f"invalid argument for --log_format, got: {shown}")
                staged[key] = value
            else:
                raise invalid_arg(f"unknown log setting '{key}'")
        with self._lock:
            for key, value in staged.items():
                setattr(self, key, value)
        for listener in self.listeners:
            listener(self)
        return self.as_dict()

    @property
    def logger_level(self) -> int:
        """The root level that lets through exactly what the settings want (DEBUG only when verbose:
        library debug calls are not even formatted otherwise, which the request path notices)."""
        return logging.DEBUG if self.log_verbose_level > 0 else logging.INFO


class SettingsFilter(logging.Filter):
    """Drops records the current settings switch off (verbose = DEBUG, gated by the level)."""

    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self.settings = settings

    def filter(self, record: logging.LogRecord) -> bool:
        level = record.levelno
        if level >= logging.ERROR:
            return self.settings.log_error
        if level >= logging.WARNING:
            return self.settings.log_warning
        if level >= logging.INFO:
            return self.settings.log_info
        return self.settings.log_verbose_level > 0


_LETTERS = {logging.DEBUG: "V", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E", logging.CRITICAL: "E"}


class TritonFormatter(logging.Formatter):
    """`I0520 20:03:25.829575 3355 file.py:441] "message"` or the ISO8601 variant."""

    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self.settings = settings
        self.escape = os.environ.get("TRITON_SERVER_ESCAPE_LOG_MESSAGES", "1") != "0"

    def format(self, record: logging.LogRecord) -> str:
        letter = _LETTERS.get(record.levelno, "I")
        message = record.getMessage()
        if self.escape and not getattr(record, VERBATIM, False):
            message = json.dumps(message, ensure_ascii=False)
        # A traceback is for people: it follows the (escaped) message on lines of its own, as Python prints it.
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            message += "\n" + self.formatStack(record.stack_info)
        where = f"{record.filename}:{record.lineno}"
        if self.settings.log_format == "ISO8601":
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
            return f"{stamp} {letter} {record.process} {where}] {message}"
        local = time.localtime(record.created)
        micros = int((record.created % 1) * 1_000_000)
        stamp = time.strftime("%m%d %H:%M:%S", local)
        return f"{letter}{stamp}.{micros:06d} {record.process} {where}] {message}"


def install_root_handler(settings: LogSettings) -> logging.Logger:
    """One handler on the root logger (the log file or stderr), filtered and formatted by `settings`,
    with the chatty libraries held at WARNING; returns the root logger."""
    handler: logging.Handler = logging.FileHandler(settings.log_file) if settings.log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(TritonFormatter(settings))
    handler.addFilter(SettingsFilter(settings))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.logger_level)
    for noisy in ("uvicorn", "uvicorn.error", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return root
