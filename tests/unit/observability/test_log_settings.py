"""The logging extension's settings rules and Triton's log line formats."""

import logging
import re

import pytest

from naiad.observability.log_settings import (
    LogSettings,
    SettingsFilter,
    TritonFormatter,
)
from naiad.protocol.errors import ErrorCode, NaiadError


def test_update_rules():
    settings = LogSettings()
    assert settings.update({"log_info": False, "log_verbose_level": 2, "log_error": None}) == {
        "log_file": "", "log_info": False, "log_warning": True, "log_error": True, "log_verbose_level": 2, "log_format": "default",
    }
    for body, code, text in [
        ({"log_file": "/tmp/x"}, ErrorCode.UNSUPPORTED, "log file location can not be updated through network protocol"),
        ({"log_verbose_level": -1}, ErrorCode.INVALID_ARG, "log_verbose_level"),
        ({"log_info": "yes"}, ErrorCode.INVALID_ARG, "log_info"),
        ({"log_format": "xml"}, ErrorCode.UNAVAILABLE, "invalid argument for --log_format, got: xml"),
    ]:
        with pytest.raises(NaiadError) as err:
            settings.update(body)
        assert err.value.code is code and text in err.value.message
    assert settings.log_verbose_level == 2  # a refused update changes nothing


def _record(level, msg="hello \"world\""):
    return logging.LogRecord("naiad.x", level, "/src/naiad/core/server.py", 42, msg, None, None)


def test_formats_and_filter():
    settings = LogSettings()
    formatter = TritonFormatter(settings)
    line = formatter.format(_record(logging.INFO))
    assert re.fullmatch(r'I\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ server\.py:42\] "hello \\"world\\""', line), line
    settings.update({"log_format": "ISO8601"})
    line = formatter.format(_record(logging.WARNING))
    assert re.fullmatch(r'\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ W \d+ server\.py:42\] ".*"', line), line
    gate = SettingsFilter(settings)
    assert not gate.filter(_record(logging.DEBUG))
    settings.update({"log_verbose_level": 1, "log_warning": False})
    assert gate.filter(_record(logging.DEBUG)) and not gate.filter(_record(logging.WARNING))


def test_a_traceback_stays_multi_line_after_the_escaped_message():
    formatter = TritonFormatter(LogSettings())
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord("naiad.x", logging.ERROR, "/src/naiad/x.py", 7, 'failed "here"', None, sys.exc_info())
    lines = formatter.format(record).splitlines()
    assert lines[0].endswith('x.py:7] "failed \\"here\\""')
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: boom"


def test_verbatim_records_keep_their_lines():
    from naiad.observability.log_settings import VERBATIM

    record = _record(logging.INFO, "\n+---+\n| a |\n+---+")
    setattr(record, VERBATIM, True)
    text = TritonFormatter(LogSettings()).format(record)
    assert text.splitlines()[1:] == ["+---+", "| a |", "+---+"]
    assert "\\n" not in text
