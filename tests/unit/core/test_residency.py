"""On-demand loading, idle unloading and the memory budget (measured, LRU, pinned models kept)."""

import asyncio

import numpy as np
import pytest

import naiad
from naiad.protocol.errors import NaiadError
from naiad.runtime.memory import parse_size
from tests.support.onnx_models import add_sub_model
from tests.support.waiting import wait_until


def _infer(srv, name):
    a = np.ones((1, 16), np.float32)
    return srv.infer(name, {"INPUT0": a, "INPUT1": a})["OUTPUT0"][0, 0]


def _state(srv, name):
    return {e["name"]: e for e in srv.repository_index()}[name]


def test_parse_size():
    assert parse_size("2GB") == 2 * 10**9 and parse_size("512MiB") == 512 << 20 and parse_size("1024") == 1024
    with pytest.raises(ValueError):
        parse_size("lots")


def test_on_demand_loads_once_for_concurrent_first_requests(tmp_path):
    for i in range(3):
        add_sub_model(tmp_path, f"m{i}")
    with naiad.Server(model_repository=str(tmp_path), model_control_mode="explicit", load_on_demand=True) as srv:
        assert _state(srv, "m1") == {"name": "m1"}

        async def burst():
            from naiad.protocol.types import InferenceRequest, InferInput
            a = np.ones((1, 16), np.float32)
            reqs = [InferenceRequest(model_name="m1", inputs=[InferInput("INPUT0", "FP32", (1, 16), a), InferInput("INPUT1", "FP32", (1, 16), a)]) for _ in range(8)]
            return await asyncio.gather(*(srv.infer_async(r) for r in reqs))

        responses = asyncio.run_coroutine_threadsafe(burst(), srv._loop).result()
        assert all(r.output("OUTPUT0").data[0, 0] == 2 for r in responses)
        assert srv.models.residency.loads == 1 and _state(srv, "m1")["state"] == "READY"
        with pytest.raises(NaiadError) as err:
            _infer(srv, "not_in_repository")
        assert err.value.code.name == "NOT_FOUND"


def test_idle_models_are_unloaded_and_reloaded_on_demand(tmp_path):
    add_sub_model(tmp_path, "idle")
    add_sub_model(tmp_path, "pinned")
    with naiad.Server(model_repository=str(tmp_path), model_control_mode="explicit", load_on_demand=True,
                      load_models=["pinned"], model_idle_unload_secs=0.2) as srv:
        assert _infer(srv, "idle") == 2
        wait_until(lambda: _state(srv, "idle")["state"] == "UNAVAILABLE", "the idle model to be evicted", timeout=10)
        assert _state(srv, "idle") == {"name": "idle", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded (evicted: idle)"}
        assert _state(srv, "pinned")["state"] == "READY"  # pinned by --load-model
        assert srv.is_ready()  # evicted models do not make the server unready
        assert _infer(srv, "idle") == 2  # served again after an on-demand reload
        assert srv.models.residency.evictions["idle"] >= 1
        assert "naiad_model_evictions{reason=\"idle\"}" in srv.metrics.render()


def test_memory_budget_keeps_the_most_recently_used(tmp_path):
    for i in range(4):
        add_sub_model(tmp_path, f"m{i}")
    with naiad.Server(model_repository=str(tmp_path), model_control_mode="explicit", load_on_demand=True,
                      model_memory_budget=1) as srv:
        for i in range(4):
            _infer(srv, f"m{i}")
        residents = srv.models.residency.residents
        assert list(residents) == ["m3"]  # a 1-byte budget keeps only the model just used
        assert srv.models.residency.evictions["memory_budget"] == 3
        states = {e["name"]: e.get("reason", e.get("state")) for e in srv.repository_index()}
        assert states["m0"] == "unloaded (evicted: memory budget)"
