"""FIL `treeshap_output` over tritonclient HTTP and gRPC: the framework's own TreeSHAP, element by element."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support import framework_models as fm
from tests.support.servers import start_server

xgb = pytest.importorskip("xgboost")
lgb = pytest.importorskip("lightgbm")
pytest.importorskip("treelite")
pytest.importorskip("sklearn")

F = fm.FEATURES
X = fm.features(23, seed=5)
X[3, 2] = np.nan  # a missing value takes the default branch in both predict and TreeSHAP


def _shap_config(name: str, model_type: str, width: int, shap_dims: list[int] | None, **params: str) -> str:
    text = fm.fil_config(name, F, width, model_type, **params)
    dims = "" if shap_dims is None else f" dims: {shap_dims}"
    return text.replace(
        "dims: [ %d ] }]\ninstance_group" % width,
        f'dims: [ {width} ] }}, {{ name: "treeshap_output" data_type: TYPE_FP32{dims} }}]\ninstance_group',
    )


# name -> (framework, task, model_type, file name, output__0 width, declared treeshap dims or None to auto-complete, params)
CASES = {
    "xgb_reg": ("xgboost", "regression", "xgboost_json", "xgboost.json", 1, [F + 1], {}),
    "xgb_bin": ("xgboost", "binary", "xgboost_ubj", "xgboost.ubj", 1, None, {"is_classifier": "true"}),
    "xgb_multi": ("xgboost", "multiclass", "xgboost_json", "xgboost.json", 3, [3, F + 1],
                  {"is_classifier": "true", "predict_proba": "true"}),
    "lgb_reg": ("lightgbm", "regression", "lightgbm", "model.txt", 1, [F + 1], {}),
    "lgb_bin": ("lightgbm", "binary", "lightgbm", "model.txt", 1, [F + 1], {"is_classifier": "true", "predict_proba": "true"}),
    "lgb_multi": ("lightgbm", "multiclass", "lightgbm", "model.txt", 1, None, {"is_classifier": "true"}),
}


@pytest.fixture(scope="module")
def boosters():
    made = {}
    for name, (framework, task, *_rest) in CASES.items():
        made[name] = fm.xgboost_booster(task) if framework == "xgboost" else fm.lightgbm_booster(task)
    return made


@pytest.fixture(scope="module")
def server(tmp_path_factory, boosters):
    root = tmp_path_factory.mktemp("fil_shap_repo")
    for name, (framework, _task, model_type, filename, width, dims, params) in CASES.items():
        save = fm.save_xgboost if framework == "xgboost" else fm.save_lightgbm
        save(boosters[name], fm.version_dir(root, name) / filename)
        fm.write_config(root / name, _shap_config(name, model_type, width, dims, **params))
    # No config: auto-complete must not add treeshap_output.
    fm.save_xgboost(boosters["xgb_bin"], fm.version_dir(root, "auto_no_shap") / "xgboost.json")
    # Broken on purpose.
    fm.save_treelite_checkpoint(fm.sklearn_forest("regression"), fm.version_dir(root, "rf_shap") / "checkpoint.tl")
    fm.write_config(root / "rf_shap", _shap_config("rf_shap", "treelite_checkpoint", 1, [F + 1]))
    fm.save_xgboost(boosters["xgb_multi"], fm.version_dir(root, "bad_shap_dims") / "xgboost.json")
    fm.write_config(root / "bad_shap_dims", _shap_config("bad_shap_dims", "xgboost_json", 1, [F + 1], is_classifier="true"))
    with start_server(root) as running:
        yield running


def _expected(name: str, booster, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(contributions as FP32, margin) from the framework itself."""
    if CASES[name][0] == "xgboost":
        dm = xgb.DMatrix(x)
        return booster.predict(dm, pred_contribs=True), booster.predict(dm, output_margin=True)
    contrib = booster.predict(x, pred_contrib=True).astype(np.float32)
    margin = booster.predict(x, raw_score=True)
    if margin.ndim == 2:
        contrib = contrib.reshape(len(x), margin.shape[1], F + 1)
    return contrib, margin


def _infer(protocol: str, server, name: str, x: np.ndarray, outputs: list[str]) -> dict[str, np.ndarray]:
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    tensor = module.InferInput("input__0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer(name, [tensor], outputs=[module.InferRequestedOutput(o) for o in outputs])
    client.close()
    return {o: result.as_numpy(o) for o in outputs}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("name", list(CASES))
def test_treeshap_equals_framework_contributions(server, boosters, protocol, name):
    got = _infer(protocol, server, name, X, ["output__0", "treeshap_output"])
    contrib, margin = _expected(name, boosters[name], X)
    shap = got["treeshap_output"]
    assert shap.dtype == np.float32 and shap.shape == contrib.shape
    np.testing.assert_array_equal(shap, contrib)
    # Additivity: each row (per class) sums to the model's margin.
    np.testing.assert_allclose(shap.sum(axis=-1, dtype=np.float64), margin, rtol=1e-5, atol=1e-5)
    assert got["output__0"].shape[0] == len(X)


def test_config_shows_declared_and_auto_completed_shap_dims(server):
    client = httpclient.InferenceServerClient(server.http_url)
    dims = {n: [o["dims"] for o in client.get_model_config(n)["output"] if o["name"] == "treeshap_output"] for n in CASES}
    assert dims["xgb_bin"] == [[F + 1]]  # declared without dims: filled in
    assert dims["lgb_multi"] == [[3, F + 1]]
    auto = client.get_model_config("auto_no_shap")
    assert [o["name"] for o in auto["output"]] == ["output__0"]
    client.close()


def test_only_requested_output_is_returned(server, boosters):
    got = _infer("http", server, "lgb_multi", X[:4], ["treeshap_output"])
    np.testing.assert_array_equal(got["treeshap_output"], _expected("lgb_multi", boosters["lgb_multi"], X[:4])[0])


def test_models_without_a_shap_path_or_bad_dims_are_unavailable(server):
    client = httpclient.InferenceServerClient(server.http_url)
    index = {e["name"]: e for e in client.get_model_repository_index()}
    client.close()
    assert index["rf_shap"]["state"] == "UNAVAILABLE"
    assert "treeshap_output" in index["rf_shap"]["reason"] and "XGBoost" in index["rf_shap"]["reason"]
    assert "LightGBM" in index["rf_shap"]["reason"]
    assert index["bad_shap_dims"]["state"] == "UNAVAILABLE"
    assert "[3, 9]" in index["bad_shap_dims"]["reason"]
