"""Hosts one instance of a tensor backend (ONNX Runtime, PyTorch, ...) in a worker process.

The worker imports the framework and loads the model itself (the server does neither), executes the
batches the server sends through shared memory, and answers with the outputs in its own shared memory.
Requests of one batch are concatenated along dim 0 for a batching model, as a thread instance would get
them. A throw-away worker runs the backend's auto_complete_config for the server (`auto_complete`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import ExecutionBatch, InstanceSpec, ModelInstance, ModelSource, TensorBackend
from naiad.backends.registry import BackendRegistry
from naiad.config.model_config import ConfigError
from naiad.protocol.errors import NaiadError
from naiad.runtime.process.framing import BlockingChannel
from naiad.runtime.process.host import WorkerHost
from naiad.runtime.process.tensors import datatype_of, pack, unpack_one
from naiad.runtime.process.worker_runtime import exit_worker

Outputs = dict[str, np.ndarray]


def tensor_backend(registry: BackendRegistry, name: str) -> TensorBackend:
    """The backend called `name`, which must take tensors: only those run their instances in worker processes."""
    backend = registry.get(name)
    if backend.kind != "tensor":
        raise ConfigError(f"backend '{name}' cannot run its instances in worker processes (INSTANCE_PROCESS)")
    return backend


def auto_complete(channel: BlockingChannel, message: tuple[Any, ...]) -> None:
    """Answer the server's "auto_backend" with the config the backend completed (serialized), or the error."""
    _, name, config_bytes, model_file, default_max_batch_size = message
    try:
        config = mc.ModelConfig()
        config.ParseFromString(config_bytes)
        tensor_backend(BackendRegistry(), name).auto_complete_config(config, Path(model_file), default_max_batch_size)
        channel.send(("auto_ok", config.SerializeToString()))
    except BaseException as exc:  # reported as the load error, in the backend's words
        channel.send(("auto_error", str(exc) or type(exc).__name__))


def load_instance(init: dict[str, Any]) -> tuple[ModelInstance, bool]:
    """The backend's instance built from what the server sent, and whether the model batches."""
    backend = tensor_backend(BackendRegistry(), init["backend"])
    config = mc.ModelConfig()
    config.ParseFromString(init["config"])
    version, model_dir, version_dir, settings = init["source"]
    name, group_bytes, kind, device_id = init["spec"]
    group = mc.ModelInstanceGroup()
    group.ParseFromString(group_bytes)
    source = ModelSource(config, version, Path(model_dir), Path(version_dir), Path(init["model_file"]), settings)
    return backend.create_instance(source, InstanceSpec(name, group, kind, device_id)), config.max_batch_size > 0


def _rows(inputs: Outputs, batching: bool) -> int:
    """A request's batch size: dim 0 of its inputs for a batching model, else 1."""
    if not batching or not inputs:
        return 1
    return int(next(iter(inputs.values())).shape[0])


def _checked(outputs: Outputs, names: list[str], instance: ModelInstance) -> Outputs:
    missing = [n for n in names if n not in outputs]
    if missing:
        raise ValueError(f"model instance '{instance.name}' did not produce outputs {missing}")
    return outputs


def execute_batch(instance: ModelInstance, inputs: list[Outputs], requested: list[list[str]], batching: bool) -> list[Outputs]:
    """Outputs of each request: one execution of all of them concatenated (a batching model), else one each."""
    if len(inputs) == 1 or not batching:
        return [_checked(instance.execute(ExecutionBatch(i, names, _rows(i, batching))), names, instance)
                for i, names in zip(inputs, requested)]
    sizes = [_rows(i, batching) for i in inputs]
    total = sum(sizes)
    names = list(dict.fromkeys(n for r in requested for n in r))
    joined = {name: np.concatenate([i[name] for i in inputs]) for name in inputs[0]}
    outputs = _checked(instance.execute(ExecutionBatch(joined, names, total)), names, instance)
    for name in names:
        if outputs[name].shape[:1] != (total,):
            raise ValueError(f"output '{name}' of a batch of {total} has shape {list(outputs[name].shape)}")
    results, offset = [], 0
    for size, wanted in zip(sizes, requested):
        results.append({n: outputs[n][offset:offset + size] for n in wanted})
        offset += size
    return results


def _error(exc: BaseException) -> tuple[str, str]:
    if isinstance(exc, NaiadError):
        return exc.message, exc.code.name
    return str(exc) or type(exc).__name__, "INTERNAL"


class BackendHost(WorkerHost):
    """A tensor backend's ModelInstance, built in the worker from what the server sent."""

    instance: ModelInstance | None = None
    batching = False

    def start(self) -> bool:
        try:
            self.instance, self.batching = load_instance(self.init)
        except BaseException as exc:  # the load error of the model, as a thread instance would report it
            self.channel.send(("init_error", _error(exc)[0]))
            return False
        self.announce_ready({"async_execute": False, "has_is_ready": False})
        return True

    def _run_batch(self, message: tuple[Any, ...]) -> None:
        _, batch_id, block, described, _ = message
        start = time.perf_counter_ns()
        try:
            view = self.runtime.peers.view(block) if block else None
            inputs = [{meta[0]: unpack_one(view, meta, copy=False) for meta in d[6]} for d in described]
            requested = [list(d[5]) for d in described]
            assert self.instance is not None
            results = execute_batch(self.instance, inputs, requested, self.batching)
            groups = [[(n, datatype_of(a), a) for n, a in out.items() if n in names] for out, names in zip(results, requested)]
            out_block, metas = pack(self.runtime.pool, groups)
            responses = [(meta, None, None) for meta in metas]
            self.channel.send(("d", batch_id, out_block, responses, None, (), (start, time.perf_counter_ns())))
        except BaseException as exc:  # the whole batch fails with the error, as on a thread
            self.channel.send(("d", batch_id, None, None, _error(exc), (), (start, time.perf_counter_ns())))

    def _finalize(self) -> None:
        try:
            if self.instance is not None:
                self.instance.close()
        except BaseException as exc:  # close errors are reported, the worker still ends
            print(f"closing model instance '{self.instance_name}' failed: {exc}", flush=True)
        self.channel.send(("F",))
        exit_worker(self.runtime, 0)
