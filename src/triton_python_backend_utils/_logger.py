"""pb_utils.Logger: model log lines go to the server's log (plain Python logging outside a worker)."""

from __future__ import annotations

import logging
import os
import sys

from triton_python_backend_utils import _runtime


class LogLevel:
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_PY_LEVELS = {LogLevel.INFO: logging.INFO, LogLevel.WARNING: logging.WARNING, LogLevel.ERROR: logging.ERROR,
              LogLevel.VERBOSE: logging.DEBUG}


def _caller() -> tuple[str, int]:
    frame = sys._getframe(3)
    return os.path.basename(frame.f_code.co_filename), frame.f_lineno


class Logger:
    """Static logging helpers, as in Triton: Logger.log_info("...") or Logger.log("...", Logger.INFO)."""

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def _emit(message: str, level: int) -> None:
        filename, line = _caller()
        runtime = _runtime.optional()
        if runtime is not None:
            runtime.log(int(level), str(message), filename, line)
        else:
            logging.getLogger("triton_python_backend_utils").log(_PY_LEVELS.get(level, logging.INFO), "%s:%d] %s", filename, line, message)

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        Logger._emit(message, level)

    @staticmethod
    def log_info(message: str) -> None:
        Logger._emit(message, LogLevel.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger._emit(message, LogLevel.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger._emit(message, LogLevel.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger._emit(message, LogLevel.VERBOSE)
