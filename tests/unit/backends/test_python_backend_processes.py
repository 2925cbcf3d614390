"""Worker processes: one per instance, parallel, crash -> error + automatic restart, unload/finalize, timeouts."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad import ErrorCode, NaiadError, Server
from naiad.backends.base import BackendRequest, InstanceSpec, ModelSource
from naiad.config.model_config import load_config_file
from naiad.runtime.process.instance import pipeline_depth, start_process_instance
from tests.integration.test_python_backend_support import (
    PID_CONFIG,
    PID_PY,
    pid_alive,
    write_model,
)
from tests.support.waiting import wait_until

RENDEZVOUS_PY = """
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.dir = os.path.join(args["model_repository"], "rendezvous")
        os.makedirs(self.dir, exist_ok=True)

    def execute(self, requests):
        open(os.path.join(self.dir, str(os.getpid())), "w").close()
        deadline = time.monotonic() + 30
        met = False
        while time.monotonic() < deadline and not met:
            met = any(name != str(os.getpid()) for name in os.listdir(self.dir))
            time.sleep(0.005)  # model code in its worker process: polls for the other instance's marker
        value = np.array([os.getpid() if met else -os.getpid()], dtype=np.int64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", value)]) for _ in requests]
"""


def _sleep_request(seconds: float) -> dict[str, np.ndarray]:
    return {"SLEEP": np.array([seconds], np.float32)}


def _shm_names(prefix: str) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]


@pytest.fixture
def prefix() -> str:
    return f"nt{uuid.uuid4().hex[:8]}_"


def test_two_instances_are_two_processes_running_in_parallel(tmp_path, prefix):
    write_model(tmp_path, "rendezvous", PID_CONFIG % 2, RENDEZVOUS_PY)
    with Server(model_repository=str(tmp_path), backend_config={"python": {"shm-region-prefix-name": prefix}}) as server:
        instances = server.models.lookup("rendezvous").pool.instances
        pids = {inst.pid for inst in instances}
        assert len(pids) == 2 and os.getpid() not in pids
        # Workers yield to the server on a shared core (SCHED_BATCH: no wake-up preemption).
        assert {os.sched_getscheduler(pid) for pid in pids} == {os.SCHED_BATCH}

        async def both():
            from naiad.protocol.types import InferenceRequest, InferInput

            def request():
                return InferenceRequest("rendezvous", [InferInput("SLEEP", "FP32", (1,), np.zeros(1, np.float32))])
            return await asyncio.gather(server.infer_async(request()), server.infer_async(request()))

        responses = asyncio.run_coroutine_threadsafe(both(), server._loop).result(60)
        seen = {int(r.output("PID").data[0]) for r in responses}
        assert seen == pids  # both positive: each execute saw the other one running at the same time
    assert _shm_names(prefix) == []
    assert not any(pid_alive(p) for p in pids)


def test_killed_worker_fails_its_request_and_is_replaced(tmp_path, prefix):
    model_dir = write_model(tmp_path, "victim", PID_CONFIG % 1, PID_PY)
    markers = model_dir / "markers"
    with Server(model_repository=str(tmp_path), backend_config={"python": {"shm-region-prefix-name": prefix}}) as server:
        first = int(server.infer("victim", _sleep_request(0))["PID"][0])
        for marker in markers.glob("executing-*"):
            marker.unlink()
        pending = asyncio.run_coroutine_threadsafe(_infer_async(server, "victim", _sleep_request(60)), server._loop)
        wait_until(lambda: (markers / f"executing-{first}").exists())
        os.kill(first, signal.SIGKILL)
        with pytest.raises(NaiadError) as info:
            pending.result(30)
        assert info.value.code == ErrorCode.INTERNAL
        assert info.value.message == "Stub process 'victim_0_0' is not healthy."
        wait_until(lambda: server.model_ready("victim") and server.is_ready())
        second = int(server.infer("victim", _sleep_request(0))["PID"][0])
        assert second != first and pid_alive(second) and not pid_alive(first)
        assert server.repository_index()[0]["state"] == "READY"
    assert _shm_names(prefix) == []


async def _infer_async(server: Server, model: str, inputs: dict[str, np.ndarray]):
    from naiad.protocol.datatypes import datatype_of_array
    from naiad.protocol.types import InferenceRequest, InferInput

    return await server.infer_async(
        InferenceRequest(model, [InferInput(n, datatype_of_array(a), a.shape, a) for n, a in inputs.items()]))


def test_unload_runs_finalize_and_ends_processes(tmp_path, prefix):
    model_dir = write_model(tmp_path, "pids", PID_CONFIG % 2, PID_PY)
    server = Server(model_repository=str(tmp_path), model_control_mode="explicit", load_models=["pids"],
                    backend_config={"python": {"shm-region-prefix-name": prefix}})
    with server:
        pids = [inst.pid for inst in server.models.lookup("pids").pool.instances]
        assert all(pid_alive(p) for p in pids)
        server.infer("pids", _sleep_request(0))
        assert _shm_names(prefix) == []  # segments are unlinked as soon as both sides mapped them
        asyncio.run_coroutine_threadsafe(server.unload_model("pids"), server._loop).result(60)
        assert not any(pid_alive(p) for p in pids)
        assert sorted(p.name for p in (model_dir / "markers").glob("finalized-*")) == sorted(f"finalized-{p}" for p in pids)
        assert server.repository_index() == [{"name": "pids", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]
    assert _shm_names(prefix) == []


def _source(model_dir: Path, settings: dict[str, str]) -> tuple[ModelSource, InstanceSpec]:
    config = load_config_file(model_dir / "config.pbtxt")
    config.name = model_dir.name
    source = ModelSource(config, 1, model_dir, model_dir / "1", model_dir / "1" / "model.py", settings)
    group = mc.ModelInstanceGroup(name=model_dir.name, kind=mc.ModelInstanceGroup.KIND_CPU, count=1)
    return source, InstanceSpec(f"{model_dir.name}_0", group, group.kind, 0)


def test_hung_execute_is_killed_at_close(tmp_path, prefix):
    model_dir = write_model(tmp_path, "hang", PID_CONFIG % 1, PID_PY)
    source, spec = _source(model_dir, {"stub-timeout-seconds": "1", "shm-region-prefix-name": prefix})

    async def scenario():
        instance = await start_process_instance(source, spec)
        pid = instance.pid
        responses = []
        task = asyncio.create_task(instance.execute_requests(
            [BackendRequest(_sleep_request(600), ["PID"])], lambda i, r: responses.append(r)))
        while not (model_dir / "markers" / f"executing-{pid}").exists():
            await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await instance.aclose()
        await task
        return pid, responses, loop.time() - started

    pid, responses, elapsed = asyncio.run(scenario())
    assert not pid_alive(pid)
    assert elapsed < 20
    assert len(responses) == 1 and responses[0].error is not None and responses[0].final
    assert _shm_names(prefix) == []


def test_unhealthy_while_restarting_then_healthy(tmp_path, prefix):
    model_dir = write_model(tmp_path, "restart", PID_CONFIG % 1, PID_PY)
    source, spec = _source(model_dir, {"shm-region-prefix-name": prefix})

    async def scenario():
        instance = await start_process_instance(source, spec)
        first = instance.pid
        assert instance.healthy()
        os.kill(first, signal.SIGKILL)
        while instance.healthy():
            await asyncio.sleep(0.005)
        errors = []
        await instance.execute_requests([BackendRequest(_sleep_request(0), ["PID"])], lambda i, r: errors.append(r))
        while not instance.healthy():
            await asyncio.sleep(0.01)
        second = instance.pid
        await instance.aclose()
        return first, second, errors

    first, second, errors = asyncio.run(scenario())
    assert second not in (0, first)
    assert errors and errors[0].error.message == "Stub process 'restart_0' is not healthy."
    assert not pid_alive(second)


def test_request_queued_behind_a_killed_worker_runs_on_its_replacement(tmp_path, prefix):
    """One instance, default scheduler: B waits at the worker behind A; killing the worker fails A only."""
    model_dir = write_model(tmp_path, "pids", PID_CONFIG % 1, PID_PY)
    with Server(model_repository=str(tmp_path), backend_config={"python": {"shm-region-prefix-name": prefix}}) as server:
        worker = server.models.lookup("pids").pool.instances[0].pid
        first = asyncio.run_coroutine_threadsafe(_infer_async(server, "pids", _sleep_request(30)), server._loop)
        wait_until(lambda: (model_dir / "markers" / f"executing-{worker}").exists())
        second = asyncio.run_coroutine_threadsafe(_infer_async(server, "pids", _sleep_request(0)), server._loop)
        instance = server.models.lookup("pids").pool.instances[0]
        wait_until(lambda: len(instance._serving._batches) == 2)  # B was sent to the worker, behind A
        os.kill(worker, signal.SIGKILL)
        with pytest.raises(NaiadError, match="not healthy"):
            first.result(30)
        pid = int(second.result(60).output("PID").data[0])
        assert pid != worker and pid_alive(pid)


def _run_concurrently(server: Server, model: str, seconds: float, count: int, concurrency: int) -> None:
    async def client(n: int) -> None:
        for _ in range(n):
            await _infer_async(server, model, _sleep_request(seconds))

    async def clients() -> None:
        await asyncio.gather(*(client(count // concurrency) for _ in range(concurrency)))

    asyncio.run_coroutine_threadsafe(clients(), server._loop).result(120)


def test_pipeline_depth_follows_execution_time_and_statistics_stay_the_workers(tmp_path, prefix):
    """One instance, default scheduler: short executions are handed over several at a time, long ones
    two at a time; either way the statistics time the worker's execute and count the wait as queue."""
    write_model(tmp_path, "pids", PID_CONFIG % 1, PID_PY)
    with Server(model_repository=str(tmp_path), backend_config={"python": {"shm-region-prefix-name": prefix}}) as server:
        instance = server.models.lookup("pids").pool.instances[0]
        _run_concurrently(server, "pids", 0.0, 64, 8)
        # the depth follows the worker's own measure of execute time (short on an idle machine: > 2)
        assert 0 < instance._execution_ns and instance._depth == pipeline_depth(instance._execution_ns)
        _run_concurrently(server, "pids", 0.02, 16, 8)
        assert instance._execution_ns > 1_000_000 and instance._depth == 2
        stats = server.model_statistics("pids")["model_stats"][0]
        inference = stats["inference_stats"]
        assert stats["execution_count"] == 80 and inference["success"]["count"] == 80
        # 16 executions of >= 20 ms in the worker, although the server handed them over ahead of time
        assert int(inference["compute_infer"]["ns"]) >= 16 * 20_000_000
        # 8 clients on one worker: each 20 ms request waited behind others (queue, not compute)
        assert int(inference["queue"]["ns"]) >= 16 * 20_000_000
        assert server.models.lookup("pids").scheduler.pending() == 0


def test_pipeline_depth_fits_about_a_millisecond_of_work_between_two_and_thirty_two():
    # add_sub-sized executes: as deep as a c=32 load needs, so that no request waits for the instance
    assert pipeline_depth(0) == 32 and pipeline_depth(30_000) == 32
    assert pipeline_depth(50_000) == 20 and pipeline_depth(200_000) == 5
    assert pipeline_depth(500_000) == 2 and pipeline_depth(20_000_000) == 2  # long ones: one running, one queued


IDENTITY_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

IDENTITY_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""


def test_a_batch_that_cannot_be_sent_leaves_nothing_behind(tmp_path, prefix, monkeypatch):
    """Encoding the batch message fails: the request gets the error, the batch is forgotten and its
    shared-memory block goes back to the pool; the next request runs as usual."""
    from naiad.runtime.process import session as session_module

    write_model(tmp_path, "identity", IDENTITY_CONFIG, IDENTITY_PY)
    encode = session_module.encode

    def failing_encode(message):
        if message[0] == "x":
            raise ValueError("cannot encode this batch")
        return encode(message)

    big = {"X": np.arange(8192, dtype=np.float32)}  # 32 KiB: travels in a shared-memory block, not inline
    with Server(model_repository=str(tmp_path), backend_config={"python": {"shm-region-prefix-name": prefix}}) as server:
        session = server.models.lookup("identity").pool.instances[0]._serving
        monkeypatch.setattr(session_module, "encode", failing_encode)
        with pytest.raises(NaiadError, match="cannot encode this batch"):
            asyncio.run_coroutine_threadsafe(_infer_async(server, "identity", big), server._loop).result(30)
        assert session._batches == {} and session.pool.in_use() == 0
        monkeypatch.setattr(session_module, "encode", encode)
        response = asyncio.run_coroutine_threadsafe(_infer_async(server, "identity", big), server._loop).result(30)
        assert np.array_equal(response.output("Y").data, big["X"])
        assert session._batches == {} and session.pool.in_use() == 0
    assert _shm_names(prefix) == []


def test_a_lone_worker_holds_at_most_its_pipeline_depth_and_the_rest_is_pending(tmp_path, prefix):
    """Long executions (depth 2): of three requests, the worker holds two (one running, one queued) and
    the third waits in the server, counted as pending like the queued one; all three are answered."""
    model_dir = write_model(tmp_path, "pids", PID_CONFIG % 1, PID_PY)
    with Server(model_repository=str(tmp_path), backend_config={"python": {"shm-region-prefix-name": prefix}}) as server:
        model = server.models.lookup("pids")
        instance = model.pool.instances[0]
        worker = instance.pid
        first = asyncio.run_coroutine_threadsafe(_infer_async(server, "pids", _sleep_request(1.0)), server._loop)
        wait_until(lambda: (model_dir / "markers" / f"executing-{worker}").exists())
        assert instance._depth == 2  # nothing timed yet: two batches, as for a model with long executions
        later = [asyncio.run_coroutine_threadsafe(_infer_async(server, "pids", _sleep_request(0)), server._loop)
                 for _ in range(2)]
        wait_until(lambda: model.scheduler.pending() == 2)
        assert len(instance._serving._batches) == 2  # the third request never reached the worker yet
        assert all(int(f.result(30).output("PID").data[0]) == worker for f in [first, *later])
        assert model.scheduler.pending() == 0 and len(instance._serving._batches) == 0


def test_requests_sent_to_a_worker_in_one_turn_of_the_loop_go_in_one_write(tmp_path, prefix):
    """Each write to a worker waiting on its pipe wakes it: the messages of one turn go out together, and
    every request still gets its own answer."""
    write_model(tmp_path, "identity", IDENTITY_CONFIG, IDENTITY_PY)
    with Server(model_repository=str(tmp_path), backend_config={"python": {"shm-region-prefix-name": prefix}}) as server:
        instance = server.models.lookup("identity").pool.instances[0]

        async def one_turn() -> tuple[list[int], list[np.ndarray]]:
            for i in range(20):  # the worker's execute times come back: the pipeline may grow past two
                await _infer_async(server, "identity", {"X": np.full(4, i, np.float32)})
            count = min(6, instance._depth)  # (at least two: all of them handed over in this turn)
            transport = instance._serving._transport
            writes: list[int] = []
            write = transport.write
            transport.write = lambda data: (writes.append(len(data)), write(data))[1]
            try:
                answers = await asyncio.gather(
                    *(_infer_async(server, "identity", {"X": np.full(4, i, np.float32)}) for i in range(count)))
            finally:
                del transport.write
            return writes, [answer.output("Y").data for answer in answers]

        writes, outputs = asyncio.run_coroutine_threadsafe(one_turn(), server._loop).result(30)
        assert len(outputs) >= 2 and len(writes) == 1, f"{len(outputs)} requests went in {len(writes)} writes"
        for i, output in enumerate(outputs):
            assert np.array_equal(output, np.full(4, i, np.float32))


def test_more_clients_than_the_pipeline_holds_are_all_answered_and_leave_the_instance_idle(tmp_path, prefix):
    """96 requests at once to one fast worker: the pipeline takes what fits, the rest wait for the
    instance and are handed it several at a time; each gets its own answer, nothing stays pending, and
    the instance is idle afterwards."""
    write_model(tmp_path, "identity", IDENTITY_CONFIG, IDENTITY_PY)
    with Server(model_repository=str(tmp_path), backend_config={"python": {"shm-region-prefix-name": prefix}}) as server:
        model = server.models.lookup("identity")
        instance = model.pool.instances[0]

        async def burst() -> list[np.ndarray]:
            for i in range(20):
                await _infer_async(server, "identity", {"X": np.full(2, i, np.float32)})
            answers = await asyncio.gather(
                *(_infer_async(server, "identity", {"X": np.full(2, i, np.float32)}) for i in range(96)))
            return [answer.output("Y").data for answer in answers]

        outputs = asyncio.run_coroutine_threadsafe(burst(), server._loop).result(60)
        assert all(np.array_equal(output, np.full(2, i, np.float32)) for i, output in enumerate(outputs))

        async def idle() -> bool:
            acquired = model.pool.try_acquire()
            if acquired is not None:
                model.pool.release(acquired)
            return acquired is instance

        assert model.scheduler.pending() == 0 and model.pool._shared == {}
        assert asyncio.run_coroutine_threadsafe(idle(), server._loop).result(10)
        stats = server.model_statistics("identity")["model_stats"][0]
        assert stats["inference_stats"]["success"]["count"] == 116
