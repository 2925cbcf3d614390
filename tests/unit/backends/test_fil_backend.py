"""FIL backend in-process: real XGBoost / LightGBM / scikit-learn (Treelite) models against their own predict."""

from __future__ import annotations

import logging
import sys

import numpy as np
import pytest

import naiad
from naiad.backends import fil_loaders
from naiad.config.model_config import ConfigError
from tests.support import framework_models as fm

xgb = pytest.importorskip("xgboost")
lgb = pytest.importorskip("lightgbm")
pytest.importorskip("treelite")
pytest.importorskip("sklearn")

X = fm.features(37, seed=11)


@pytest.fixture(scope="module")
def models():
    return {
        "xgb_binary": fm.xgboost_booster("binary"),
        "xgb_multi": fm.xgboost_booster("multiclass"),
        "xgb_softmax": fm.xgboost_booster("softmax"),
        "xgb_reg": fm.xgboost_booster("regression"),
        "xgb_clf": fm.xgboost_classifier(),
        "lgb_binary": fm.lightgbm_booster("binary"),
        "lgb_multi": fm.lightgbm_booster("multiclass"),
        "lgb_reg": fm.lightgbm_booster("regression"),
        "rf_multi": fm.sklearn_forest("multiclass"),
        "rf_binary": fm.sklearn_forest("binary"),
        "rf_reg": fm.sklearn_forest("regression"),
    }


@pytest.fixture(scope="module")
def repo(tmp_path_factory, models):
    root = tmp_path_factory.mktemp("fil_repo")
    m = models
    # No config.pbtxt at all: backend from the file name, I/O and batching auto-completed.
    fm.save_xgboost(m["xgb_binary"], fm.version_dir(root, "xgb_json_auto") / "xgboost.json")
    fm.save_lightgbm(m["lgb_multi"], fm.version_dir(root, "lgb_auto") / "model.txt")
    fm.save_treelite_checkpoint(m["rf_reg"], fm.version_dir(root, "rf_reg_auto") / "checkpoint.tl")
    # Minimal config: backend and parameters only.
    fm.save_xgboost(m["xgb_clf"], fm.version_dir(root, "xgb_proba_auto") / "xgboost.json")
    fm.write_config(
        root / "xgb_proba_auto",
        'backend: "fil"\nparameters { key: "is_classifier" value: { string_value: "true" } }\n'
        'parameters { key: "predict_proba" value: { string_value: "true" } }\n',
    )
    # Full configs, one per format and output rule.
    cases = {
        "xgb_ubj_class": ("xgb_binary", "xgboost.ubj", "xgboost_ubj", 1, {"is_classifier": "true"}),
        "xgb_threshold": ("xgb_binary", "xgboost.ubj", "xgboost_ubj", 1, {"is_classifier": "true", "threshold": "0.75"}),
        "xgb_proba2": ("xgb_clf", "xgboost.json", "xgboost_json", 2, {"is_classifier": "true", "predict_proba": "true"}),
        "xgb_proba1": ("xgb_clf", "xgboost.json", "xgboost_json", 1, {"is_classifier": "true", "predict_proba": "true"}),
        "xgb_multi_class": ("xgb_multi", "xgboost.ubj", "xgboost_ubj", 1, {"is_classifier": "true"}),
        "xgb_multi_proba": ("xgb_multi", "xgboost.json", "xgboost_json", 3, {"is_classifier": "true", "predict_proba": "true"}),
        "xgb_softmax": ("xgb_softmax", "xgboost.json", "xgboost_json", 1, {"is_classifier": "true"}),
        "xgb_legacy_name": ("xgb_reg", "xgboost.model", "xgboost", 1, {"is_classifier": "false"}),
        "xgb_output_class": ("xgb_binary", "xgboost.json", "xgboost_json", 1, {"output_class": "true", "storage_type": "AUTO"}),
        "lgb_binary_class": ("lgb_binary", "model.txt", "lightgbm", 1, {"is_classifier": "true"}),
        "lgb_multi_proba": ("lgb_multi", "model.txt", "lightgbm", 3, {"is_classifier": "true", "predict_proba": "true"}),
        "lgb_reg": ("lgb_reg", "model.txt", "lightgbm", 1, {}),
        "rf_class": ("rf_multi", "checkpoint.tl", "treelite_checkpoint", 1, {"is_classifier": "true"}),
        "rf_proba": ("rf_multi", "checkpoint.tl", "treelite_checkpoint", 3, {"is_classifier": "true", "predict_proba": "true"}),
        "rf_binary_class": ("rf_binary", "checkpoint.tl", "treelite_checkpoint", 1, {"is_classifier": "true"}),
        # Broken on purpose: each must be UNAVAILABLE with a reason that says what to fix.
        "bad_features": ("xgb_binary", "xgboost.json", "xgboost_json", 1, {}),
        "bad_width": ("xgb_multi", "xgboost.json", "xgboost_json", 2, {"is_classifier": "true", "predict_proba": "true"}),
        "bad_type": ("xgb_binary", "xgboost.json", "catboost", 1, {}),
        "bad_threshold": ("xgb_binary", "xgboost.json", "xgboost_json", 1, {"threshold": "high"}),
    }
    for name, (key, filename, model_type, width, params) in cases.items():
        path = fm.version_dir(root, name) / filename
        saver = fm.save_lightgbm if key.startswith("lgb") else fm.save_treelite_checkpoint if key.startswith("rf") else fm.save_xgboost
        saver(m[key], path)
        n_features = 5 if name == "bad_features" else fm.FEATURES
        fm.write_config(root / name, fm.fil_config(name, n_features, width, model_type, **params))
    fm.save_xgboost(m["xgb_binary"], fm.version_dir(root, "bad_input_name") / "xgboost.json")
    fm.write_config(
        root / "bad_input_name",
        'backend: "fil"\nmax_batch_size: 8\ninput [{ name: "features" data_type: TYPE_FP32 dims: [ 8 ] }]\n'
        'output [{ name: "output__0" data_type: TYPE_FP32 dims: [ 1 ] }]\n',
    )
    fm.version_dir(root, "no_file")
    fm.write_config(root / "no_file", fm.fil_config("no_file", 8, 1, "lightgbm"))
    return root


@pytest.fixture(scope="module")
def server(repo):
    with naiad.Server(model_repository=str(repo), exit_on_error=False) as srv:
        yield srv


def _infer(server, name, x=X):
    return server.infer(name, {"input__0": x})["output__0"]


def _dm(x=X):
    return xgb.DMatrix(x)


def test_xgboost_json_without_config_serves_booster_predict(server, models):
    config = server.model_config_dict("xgb_json_auto")
    assert config["backend"] == "fil"
    assert config["max_batch_size"] == 32768
    assert config["input"][0]["name"] == "input__0" and config["input"][0]["dims"] == [8]
    assert config["output"][0]["name"] == "output__0" and config["output"][0]["dims"] == [1]
    assert "dynamic_batching" in config
    out = _infer(server, "xgb_json_auto")
    assert out.shape == (len(X), 1) and out.dtype == np.float32
    np.testing.assert_array_equal(out[:, 0], models["xgb_binary"].predict(_dm()))


def test_lightgbm_without_config_serves_probabilities(server, models):
    assert server.model_config_dict("lgb_auto")["output"][0]["dims"] == [3]
    np.testing.assert_array_equal(_infer(server, "lgb_auto"), models["lgb_multi"].predict(X).astype(np.float32))


def test_treelite_checkpoint_without_config_matches_sklearn_regressor(server, models):
    out = _infer(server, "rf_reg_auto")
    np.testing.assert_allclose(out[:, 0], models["rf_reg"].predict(X), rtol=1e-6, atol=1e-6)


def test_auto_complete_binary_predict_proba_gives_both_columns(server, models):
    assert server.model_config_dict("xgb_proba_auto")["output"][0]["dims"] == [2]
    np.testing.assert_array_equal(_infer(server, "xgb_proba_auto"), models["xgb_clf"].predict_proba(X))


def test_binary_classifier_returns_class_index(server, models):
    p = models["xgb_binary"].predict(_dm())
    np.testing.assert_array_equal(_infer(server, "xgb_ubj_class")[:, 0], (p > 0.5).astype(np.float32))
    np.testing.assert_array_equal(_infer(server, "xgb_threshold")[:, 0], (p > 0.75).astype(np.float32))
    assert ((p > 0.75) != (p > 0.5)).any()  # the threshold changes at least one answer


def test_binary_predict_proba_two_columns_or_one(server, models):
    clf = models["xgb_clf"]
    np.testing.assert_array_equal(_infer(server, "xgb_proba2"), clf.predict_proba(X))
    np.testing.assert_array_equal(_infer(server, "xgb_proba1")[:, 0], clf.predict_proba(X)[:, 1])


def test_xgbclassifier_class_output_matches_predict(server, models):
    out = _infer(server, "xgb_ubj_class")
    booster_classes = (models["xgb_binary"].predict(_dm()) > 0.5).astype(np.float32)
    np.testing.assert_array_equal(out[:, 0], booster_classes)


def test_multiclass_class_index_and_probabilities(server, models):
    probs = models["xgb_multi"].predict(_dm())
    np.testing.assert_array_equal(_infer(server, "xgb_multi_class")[:, 0], probs.argmax(axis=1).astype(np.float32))
    np.testing.assert_array_equal(_infer(server, "xgb_multi_proba"), probs)


def test_softmax_objective_returns_its_class(server, models):
    np.testing.assert_array_equal(_infer(server, "xgb_softmax")[:, 0], models["xgb_softmax"].predict(_dm()))


def test_legacy_model_type_reads_current_xgboost_files(server, models):
    np.testing.assert_array_equal(_infer(server, "xgb_legacy_name")[:, 0], models["xgb_reg"].predict(_dm()))


def test_lightgbm_outputs_match_its_predict(server, models):
    np.testing.assert_array_equal(
        _infer(server, "lgb_binary_class")[:, 0], (models["lgb_binary"].predict(X) > 0.5).astype(np.float32)
    )
    np.testing.assert_array_equal(_infer(server, "lgb_multi_proba"), models["lgb_multi"].predict(X).astype(np.float32))
    np.testing.assert_array_equal(_infer(server, "lgb_reg")[:, 0], models["lgb_reg"].predict(X).astype(np.float32))


def test_sklearn_forest_through_treelite_matches_sklearn(server, models):
    rf = models["rf_multi"]
    np.testing.assert_array_equal(_infer(server, "rf_class")[:, 0], rf.predict(X).astype(np.float32))
    np.testing.assert_allclose(_infer(server, "rf_proba"), rf.predict_proba(X), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(_infer(server, "rf_binary_class")[:, 0], models["rf_binary"].predict(X).astype(np.float32))


def test_deprecated_output_class_still_classifies(server, models):
    p = models["xgb_binary"].predict(_dm())
    np.testing.assert_array_equal(_infer(server, "xgb_output_class")[:, 0], (p > 0.5).astype(np.float32))


def test_single_row_and_large_batch(server, models):
    one = _infer(server, "xgb_json_auto", X[:1])
    assert one.shape == (1, 1)
    big = fm.features(5000, seed=3)
    np.testing.assert_array_equal(_infer(server, "xgb_json_auto", big)[:, 0], models["xgb_binary"].predict(_dm(big)))


@pytest.mark.parametrize(
    "name, words",
    [
        ("bad_features", ["5 features", "trained on 8"]),
        ("bad_width", ["dims [2]", "gives 3 value(s) per row"]),
        ("bad_type", ["model_type 'catboost'", "xgboost_json"]),
        ("bad_threshold", ["threshold", "'high'"]),
        ("bad_input_name", ["input__0", "['features']"]),
        ("no_file", ["model.txt"]),
    ],
)
def test_bad_models_are_unavailable_with_a_reason(server, name, words):
    entry = {e["name"]: e for e in server.repository_index()}[name]
    assert entry["state"] == "UNAVAILABLE"
    for word in words:
        assert word in entry["reason"]


def test_deprecated_and_removed_parameters_warn(repo, caplog):
    caplog.set_level(logging.INFO, logger="naiad.backends.fil_backend")
    with naiad.Server(model_repository=str(repo), model_control_mode="explicit", load_models=["xgb_output_class"]) as srv:
        assert srv.model_ready("xgb_output_class")
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "'output_class' is deprecated, use 'is_classifier'" in messages
    assert "'storage_type' was removed from FIL and is ignored" in messages


def test_missing_framework_package_names_the_extra(monkeypatch, tmp_path, models):
    path = fm.save_lightgbm(models["lgb_reg"], tmp_path / "model.txt")
    monkeypatch.setitem(sys.modules, "lightgbm", None)  # import lightgbm now raises ImportError
    with pytest.raises(ConfigError) as err:
        fil_loaders.load_forest(path, "lightgbm", threads=1)
    assert "needs the 'lightgbm' package" in str(err.value)
    assert "pip install 'naiad[fil]'" in str(err.value)


def test_model_type_is_read_from_the_file_name(tmp_path):
    assert fil_loaders.model_type_for_file(tmp_path / "xgboost.ubj") == "xgboost_ubj"
    assert fil_loaders.model_type_for_file(tmp_path / "forest.tl") == "treelite_checkpoint"
    assert fil_loaders.model_type_for_file(tmp_path / "weights.bin") is None
    with pytest.raises(ConfigError, match="set parameter model_type"):
        fil_loaders.resolve_model_file(tmp_path / "weights.bin", None)


@pytest.mark.parametrize("key", ["xgb_binary", "xgb_multi", "xgb_softmax", "xgb_reg"])
def test_direct_xgboost_predict_matches_inplace_predict_on_awkward_input(tmp_path, models, key):
    path = fm.save_xgboost(models[key], tmp_path / "xgboost.json")
    forest = fil_loaders.load_forest(path, "xgboost_json", threads=1)
    booster = models[key]
    raw = np.zeros(len(X) * fm.FEATURES * 4 + 3, dtype=np.uint8)
    misaligned = np.frombuffer(raw.data, dtype=np.float32, count=len(X) * fm.FEATURES, offset=3).reshape(len(X), -1)
    assert not misaligned.flags.aligned
    x = X.copy()
    x[2, 1] = np.nan
    misaligned[...] = x  # a request tensor sliced at an odd offset of its body
    assert fil_loaders._fast_predict(booster, False, fm.FEATURES) is not None  # the direct C call is in use
    expected = booster.inplace_predict(x, validate_features=False).reshape(len(x), -1)
    np.testing.assert_array_equal(forest.predict(misaligned), expected)
    np.testing.assert_array_equal(forest.predict(x[:, :]), expected)
    if forest.predict_proba is not None:
        margins = booster.inplace_predict(x, validate_features=False, predict_type="margin")
        np.testing.assert_array_equal(forest.predict_proba(misaligned), fil_loaders._softmax(margins.reshape(len(x), -1)))
