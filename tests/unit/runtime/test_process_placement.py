"""Placement of instances (thread, event loop, worker process) and the batch a worker hands a tensor backend."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Backend, ExecutionBatch, InstanceSpec, ModelSource
from naiad.backends.python.backend import PythonBackend
from naiad.backends.registry import BackendRegistry
from naiad.config.model_config import ConfigError
from naiad.runtime.placement import WorkerHostedBackend, backend_for, runs_in_processes, start_instance
from naiad.runtime.process.backend_host import execute_batch, tensor_backend
from naiad.runtime.thread_instance import ThreadInstance


class Doubler:
    """A ModelInstance recording the batches it executes: Y = 2 * X."""

    name = "doubler_0"

    def __init__(self, drop: str = "") -> None:
        self.batches: list[ExecutionBatch] = []
        self.drop = drop

    def execute(self, batch: ExecutionBatch) -> dict[str, np.ndarray]:
        self.batches.append(batch)
        return {"Y": batch.inputs["X"] * 2} if self.drop != "Y" else {}

    def close(self) -> None:
        pass


def _config(value: str | None, backend: str = "onnxruntime") -> mc.ModelConfig:
    config = mc.ModelConfig(name="m", backend=backend)
    if value is not None:
        config.parameters["INSTANCE_PROCESS"].string_value = value
    return config


def test_batching_requests_run_as_one_concatenated_execution_and_are_split_back() -> None:
    instance = Doubler()
    first, second = np.arange(4, dtype=np.float32).reshape(2, 2), np.full((3, 2), 5.0, np.float32)
    results = execute_batch(instance, [{"X": first}, {"X": second}], [["Y"], ["Y"]], batching=True)
    assert len(instance.batches) == 1 and instance.batches[0].batch_size == 5
    np.testing.assert_array_equal(results[0]["Y"], first * 2)
    np.testing.assert_array_equal(results[1]["Y"], second * 2)


def test_non_batching_requests_run_one_execution_each() -> None:
    instance = Doubler()
    inputs = [{"X": np.ones(3, np.float32)}, {"X": np.zeros(3, np.float32)}]
    results = execute_batch(instance, inputs, [["Y"], ["Y"]], batching=False)
    assert [b.batch_size for b in instance.batches] == [1, 1]
    np.testing.assert_array_equal(results[0]["Y"], np.full(3, 2.0))


def test_a_missing_output_fails_the_batch_with_its_name() -> None:
    with pytest.raises(ValueError, match=r"did not produce outputs \['Y'\]"):
        execute_batch(Doubler(drop="Y"), [{"X": np.ones((1, 2), np.float32)}], [["Y"]], batching=True)


@pytest.mark.parametrize(("value", "expected"), [(None, False), ("", False), ("false", False), ("0", False),
                                                 ("true", True), ("TRUE", True), ("yes", True), ("1", True)])
def test_instance_process_parameter(value: str | None, expected: bool) -> None:
    assert runs_in_processes(_config(value)) is expected


def test_an_unknown_instance_process_value_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="INSTANCE_PROCESS must be true or false, got 'maybe'"):
        runs_in_processes(_config("maybe"))


class TensorBackend:
    name = "fake"
    kind = "tensor"

    def auto_complete_config(self, config: mc.ModelConfig, model_file: Path, default_max_batch_size: int) -> None:
        pass

    def create_instance(self, source: ModelSource, spec: InstanceSpec) -> Doubler:
        return Doubler()


class RequestBackend:
    name = "engine"
    kind = "request"

    def auto_complete_config(self, config: mc.ModelConfig, model_file: Path, default_max_batch_size: int) -> None:
        pass

    async def create_instance(self, source: ModelSource, spec: InstanceSpec) -> object:
        raise AssertionError("not reached: the engine cannot run in worker processes")


def _source(config: mc.ModelConfig, tmp_path: Path) -> tuple[ModelSource, InstanceSpec]:
    group = mc.ModelInstanceGroup(name="m", count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    return ModelSource(config, 1, tmp_path, tmp_path, tmp_path / "model"), InstanceSpec("m_0", group, group.kind, 0)


def test_a_tensor_backend_without_the_parameter_gets_a_thread(tmp_path: Path) -> None:
    source, spec = _source(_config(None), tmp_path)
    instance = asyncio.run(start_instance(TensorBackend(), source, spec))  # type: ignore[arg-type]
    assert isinstance(instance, ThreadInstance) and isinstance(instance.instance, Doubler)
    assert not instance.in_worker_process and instance.pid == 0 and instance.memory_bytes() == 0
    instance.close()


class Registry(BackendRegistry):
    """A registry that hands out the given backends and records which it was asked for (loading imports frameworks)."""

    def __init__(self, *backends: object) -> None:
        super().__init__()
        self.known = {b.name: b for b in backends}  # type: ignore[attr-defined]
        self.asked: list[str] = []

    def get(self, name: str, backend_directory: str | None = None) -> Backend:
        self.asked.append(name)
        return self.known[name]  # type: ignore[return-value]


def test_a_request_backend_refuses_worker_processes() -> None:
    with pytest.raises(ConfigError, match=r"backend 'engine' cannot run its instances in worker processes"):
        tensor_backend(Registry(RequestBackend()), "engine")
    assert tensor_backend(Registry(TensorBackend()), "fake").name == "fake"


def test_a_framework_model_with_process_instances_is_never_loaded_by_the_server() -> None:
    registry = Registry()
    backend = backend_for(registry, _config("true", "pytorch"), None)
    assert isinstance(backend, WorkerHostedBackend) and backend.name == "pytorch"
    assert (backend.kind, backend.host, backend.shared_model_file) == ("process", "backend", None)
    assert registry.asked == []  # the registry would have imported torch


def test_python_models_and_thread_instances_keep_their_backend() -> None:
    registry = Registry(PythonBackend(), TensorBackend())
    assert isinstance(backend_for(registry, _config("true", "python"), None), PythonBackend)
    assert backend_for(registry, _config(None, "fake"), None).name == "fake"
    assert registry.asked == ["python", "fake"]
