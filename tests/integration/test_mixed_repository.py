"""One real server, one repository mixing ONNX, PyTorch, FIL (XGBoost, LightGBM, scikit-learn) and OpenVINO,
driven with tritonclient over HTTP and gRPC; outputs compared with each framework's own predictions."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support import framework_models as fm
from tests.support.servers import start_server

pytest.importorskip("torch")
xgb = pytest.importorskip("xgboost")
pytest.importorskip("lightgbm")
pytest.importorskip("sklearn")
pytest.importorskip("treelite")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _generator():
    spec = importlib.util.spec_from_file_location("generate_mixed_models", EXAMPLES / "generate_mixed_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    repo = tmp_path_factory.mktemp("mixed")
    generator = _generator()
    trained = generator.write_repository(repo)
    has_openvino = importlib.util.find_spec("openvino") is not None
    if has_openvino:
        weights = fm.save_openvino_ir(fm.version_dir(repo, "relu_openvino") / "model.xml")  # no config.pbtxt
        trained["relu_openvino"] = weights
    with start_server(repo) as server:
        yield server, trained, generator.FEATURES, repo


@pytest.fixture(scope="module")
def http(mixed):
    client = httpclient.InferenceServerClient(mixed[0].http_url, concurrency=8)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(mixed):
    client = grpcclient.InferenceServerClient(mixed[0].grpc_url)
    yield client
    client.close()


def _http_infer(client, model, inputs: dict[str, np.ndarray], binary: bool = True):
    tensors = []
    for name, array in inputs.items():
        tensor = httpclient.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array, binary_data=binary)
        tensors.append(tensor)
    return client.infer(model, tensors)


def _grpc_infer(client, model, inputs: dict[str, np.ndarray]):
    tensors = []
    for name, array in inputs.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return client.infer(model, tensors)


def test_every_model_of_every_framework_is_ready(mixed, http):
    index = {m["name"]: m for m in http.get_model_repository_index()}
    expected = {"add_sub_onnx", "add_sub_torch", "fraud_xgboost", "churn_lightgbm", "iris_forest"}
    assert expected <= set(index)
    assert all(m.get("state") == "READY" for m in index.values()), index
    backends = {name: http.get_model_config(name)["backend"] for name in expected}
    assert backends == {"add_sub_onnx": "onnxruntime", "add_sub_torch": "pytorch", "fraud_xgboost": "fil",
                        "churn_lightgbm": "fil", "iris_forest": "fil"}


def test_onnx_and_torchscript_agree_over_both_protocols(http, grpc):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.full((3, 4), 0.5, dtype=np.float32)
    onnx = _http_infer(http, "add_sub_onnx", {"INPUT0": a, "INPUT1": b})
    torch_out = _grpc_infer(grpc, "add_sub_torch", {"INPUT__0": a, "INPUT__1": b})
    np.testing.assert_array_equal(onnx.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(torch_out.as_numpy("OUTPUT__0"), a + b)
    np.testing.assert_array_equal(torch_out.as_numpy("OUTPUT__1"), a - b)


def test_xgboost_probabilities_match_booster_predict(mixed, http):
    _, trained, n_features, _ = mixed
    x = fm.features(64, seed=21, n_features=n_features)
    out = _http_infer(http, "fraud_xgboost", {"input__0": x}).as_numpy("output__0")
    p = trained["fraud_xgboost"].predict(xgb.DMatrix(x))
    np.testing.assert_array_equal(out, np.stack([1 - p, p], axis=1))


def test_lightgbm_without_config_is_auto_completed_and_matches(mixed, grpc):
    _, trained, n_features, _ = mixed
    config = grpc.get_model_config("churn_lightgbm", as_json=True)["config"]
    assert config["backend"] == "fil" and int(config["max_batch_size"]) == 32768
    assert config["input"][0]["name"] == "input__0" and [int(d) for d in config["input"][0]["dims"]] == [n_features]
    assert [int(d) for d in config["output"][0]["dims"]] == [3]
    x = fm.features(200, seed=22, n_features=n_features)
    out = _grpc_infer(grpc, "churn_lightgbm", {"input__0": x}).as_numpy("output__0")
    np.testing.assert_array_equal(out, trained["churn_lightgbm"].predict(x).astype(np.float32))


def test_sklearn_forest_classes_match_sklearn_predict(mixed, http):
    _, trained, n_features, _ = mixed
    x = fm.features(50, seed=23, n_features=n_features)
    out = _http_infer(http, "iris_forest", {"input__0": x}, binary=False).as_numpy("output__0")
    np.testing.assert_array_equal(out[:, 0], trained["iris_forest"].predict(x).astype(np.float32))


def test_concurrent_requests_are_batched_and_split_back(mixed, http):
    _, trained, n_features, _ = mixed
    rows = [fm.features(1 + i % 5, seed=100 + i, n_features=n_features) for i in range(32)]
    pending = []
    for x in rows:  # async_infer keeps up to `concurrency` (8) requests in flight at once
        tensor = httpclient.InferInput("input__0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        pending.append(http.async_infer("fraud_xgboost", [tensor]))
    results = [request.get_result().as_numpy("output__0") for request in pending]
    for x, out in zip(rows, results):
        p = trained["fraud_xgboost"].predict(xgb.DMatrix(x))
        np.testing.assert_array_equal(out[:, 1], p)


def test_openvino_ir_without_config_serves_beside_the_others(mixed, grpc):
    _, trained, _, repo = mixed
    if "relu_openvino" not in trained:
        pytest.skip("openvino is not installed")
    import openvino as ov

    x = fm.features(3, seed=24)
    out = _grpc_infer(grpc, "relu_openvino", {"X": x}).as_numpy("Y")
    core = ov.Core()  # OpenVINO's own answer with its default settings (bf16 on CPUs that have it), as the server uses
    compiled = core.compile_model(core.read_model(str(repo / "relu_openvino" / "1" / "model.xml")), "CPU")
    expected = compiled.create_infer_request().infer({"X": x})[compiled.outputs[0]]
    assert out.shape == (3, 3)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
