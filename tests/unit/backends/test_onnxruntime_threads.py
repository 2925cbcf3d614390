"""ONNX Runtime's intra-op pool: the config's count, else sized to the CPUs the process may use."""

from __future__ import annotations

import os

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends import onnxruntime_backend
from naiad.config.model_config import ConfigError


def _config(**params: str) -> mc.ModelConfig:
    config = mc.ModelConfig(name="m")
    for key, value in params.items():
        config.parameters[key].string_value = value
    return config


def test_a_process_pinned_to_fewer_cpus_than_the_machine_has_gets_that_many_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert onnxruntime_backend._session_options(_config()).intra_op_num_threads == 1


def test_a_process_free_to_use_every_cpu_keeps_onnx_runtimes_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert onnxruntime_backend._session_options(_config()).intra_op_num_threads == 0


def test_the_configured_count_wins_over_the_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert onnxruntime_backend._session_options(_config(intra_op_thread_count="3")).intra_op_num_threads == 3
    with pytest.raises(ConfigError, match="must be integers"):
        onnxruntime_backend._session_options(_config(intra_op_thread_count="many"))
