"""The served process keeps its start-up heap out of later garbage collections (the HTTP p99) and collects
the young generation less often."""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
from pathlib import Path

import pytest

from naiad.cli import serve
from naiad.cli.main import main
from naiad.config.collector import YOUNG_COLLECTION_THRESHOLD, freeze_startup_heap


def test_freeze_startup_heap_takes_live_objects_out_of_collections() -> None:
    survivors = [[index] for index in range(1000)]
    thresholds = gc.get_threshold()
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() >= len(survivors)
        # young collections wait for more than a batch of waiting requests' objects (CPython's default: 700)
        assert gc.get_threshold() == (YOUNG_COLLECTION_THRESHOLD, *thresholds[1:])
        assert YOUNG_COLLECTION_THRESHOLD >= 10 * 700
        later = [0]
        tracked = {id(obj) for obj in gc.get_objects()}
        assert id(survivors[0]) not in tracked and id(survivors) not in tracked  # frozen: never walked again
        assert id(later) in tracked  # what is created afterwards is collected as usual
        gc.collect()
        assert survivors[999] == [999]
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_serve_freezes_the_heap_once_started_before_announcing_ready(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[int] = []

    def freeze_then_stop() -> None:
        calls.append(len(calls))
        os.kill(os.getpid(), signal.SIGTERM)  # the server's own handler: drain and stop

    monkeypatch.setattr(serve, "freeze_startup_heap", freeze_then_stop)
    args = ["serve", "--model-repository", str(tmp_path), "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
            "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1"]
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    deadline = threading.Timer(60, os.kill, (os.getpid(), signal.SIGTERM))  # stops a server that never froze
    deadline.start()
    try:
        assert main(args) == 0
    finally:
        deadline.cancel()
        root.handlers[:], root.level = handlers, level
    assert calls == [0]
    assert "NAIAD_READY " in capsys.readouterr().out
