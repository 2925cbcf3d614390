"""Ensembles: DAG execution through the server, dependency loading, graph validation, step errors."""

import asyncio

import numpy as np
import pytest

import naiad
from naiad.protocol.errors import NaiadError
from tests.support.onnx_models import add_sub_model, ensemble_model

FP = [("A", "FP32", [16]), ("B", "FP32", [16])]


def _two_step(repo, name="ens"):
    ensemble_model(
        repo, name,
        steps=[
            ("add_sub", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "SUM", "OUTPUT1": "DIFF"}),
            ("add_sub", {"INPUT0": "SUM", "INPUT1": "DIFF"}, {"OUTPUT0": "TWICE_A"}),
        ],
        inputs=FP, outputs=[("TWICE_A", "FP32", [16]), ("SUM", "FP32", [16])],
    )


def test_ensemble_runs_its_steps(tmp_path):
    add_sub_model(tmp_path, "add_sub")
    _two_step(tmp_path)
    with naiad.Server(model_repository=str(tmp_path)) as srv:
        a = np.random.rand(2, 16).astype(np.float32)
        b = np.random.rand(2, 16).astype(np.float32)
        out = srv.infer("ens", {"A": a, "B": b})
        np.testing.assert_allclose(out["TWICE_A"], 2 * a, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(out["SUM"], a + b, rtol=1e-6)
        assert srv.model_metadata("ens")["platform"] == "ensemble"
        stats = {s["name"]: s for s in srv.model_statistics()["model_stats"]}
        assert stats["ens"]["inference_stats"]["success"]["count"] == 1
        assert stats["add_sub"]["inference_stats"]["success"]["count"] == 2


def test_explicit_load_of_ensemble_loads_and_unloads_dependencies(tmp_path):
    add_sub_model(tmp_path, "add_sub")
    _two_step(tmp_path)
    with naiad.Server(model_repository=str(tmp_path), model_control_mode="explicit", load_models=["ens"]) as srv:
        assert srv.model_ready("add_sub") and srv.model_ready("ens")
        asyncio.run_coroutine_threadsafe(srv.unload_model("ens", unload_dependents=True), srv._loop).result()
        states = {e["name"]: e["state"] for e in srv.repository_index()}
        assert states == {"add_sub": "UNAVAILABLE", "ens": "UNAVAILABLE"}


def test_invalid_graphs_fail_the_load_with_reasons(tmp_path):
    add_sub_model(tmp_path, "add_sub")
    ensemble_model(tmp_path, "unused_input", steps=[("add_sub", {"INPUT0": "A", "INPUT1": "A"}, {"OUTPUT0": "O"})],
                   inputs=FP, outputs=[("O", "FP32", [16])])
    ensemble_model(tmp_path, "missing_model", steps=[("nope", {"X": "A"}, {"Y": "O"})],
                   inputs=FP[:1], outputs=[("O", "FP32", [16])])
    ensemble_model(tmp_path, "bad_tensor", steps=[("add_sub", {"INPUT0": "A", "WRONG": "A"}, {"OUTPUT0": "O"})],
                   inputs=FP[:1], outputs=[("O", "FP32", [16])])
    ensemble_model(tmp_path, "cycle", steps=[("add_sub", {"INPUT0": "A", "INPUT1": "Y"}, {"OUTPUT0": "X"}),
                                             ("add_sub", {"INPUT0": "X", "INPUT1": "A"}, {"OUTPUT0": "Y"})],
                   inputs=FP[:1], outputs=[("Y", "FP32", [16])])
    with naiad.Server(model_repository=str(tmp_path)) as srv:
        reasons = {e["name"]: e.get("reason", "") for e in srv.repository_index()}
        assert "input 'B' is not used" in reasons["unused_input"]
        assert "'nope'" in reasons["missing_model"]
        assert "'WRONG' is not an input of model 'add_sub'" in reasons["bad_tensor"]
        assert "cycle" in reasons["cycle"]
        assert srv.model_ready("add_sub")


def test_step_error_names_the_step(tmp_path):
    add_sub_model(tmp_path, "add_sub")
    add_sub_model(tmp_path, "small", max_batch_size=1, scheduler="")
    ensemble_model(tmp_path, "ens", steps=[("add_sub", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "S"}),
                                           ("small", {"INPUT0": "S", "INPUT1": "S"}, {"OUTPUT0": "O"})],
                   inputs=FP, outputs=[("O", "FP32", [16])])
    with naiad.Server(model_repository=str(tmp_path)) as srv:
        a = np.ones((2, 16), np.float32)
        with pytest.raises(NaiadError) as err:
            srv.infer("ens", {"A": a, "B": a})
        assert "step 1 ('small')" in err.value.message and "batch-size must be <= 1" in err.value.message
