"""TensorFlow backend in-process: SavedModel auto-complete with strings, frozen GraphDef, the missing-package message."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import naiad
from naiad.backends.registry import BackendRegistry, BackendUnavailable
from tests.support import framework_models as fm


def test_missing_tensorflow_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # `import tensorflow` now raises ImportError
    monkeypatch.delitem(sys.modules, "naiad.backends.tensorflow_backend", raising=False)
    with pytest.raises(BackendUnavailable) as err:
        BackendRegistry().get("tensorflow")
    message = str(err.value)
    assert "the TensorFlow backend needs the 'tensorflow' package" in message
    assert "pip install 'naiad[tensorflow]'" in message


pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("tf_repo")
    fm.save_tf_savedmodel(fm.version_dir(root, "savedmodel_auto") / "model.savedmodel")
    node_in, node_out = fm.save_tf_graphdef(fm.version_dir(root, "graphdef") / "model.graphdef")
    fm.write_config(
        root / "graphdef",
        f'platform: "tensorflow_graphdef"\nmax_batch_size: 8\n'
        f'input [{{ name: "{node_in}" data_type: TYPE_FP32 dims: [ 4 ] }}]\n'
        f'output [{{ name: "{node_out}" data_type: TYPE_FP32 dims: [ 4 ] }}]\n',
    )
    fm.save_tf_graphdef(fm.version_dir(root, "graphdef_no_config") / "model.graphdef")
    fm.write_config(root / "graphdef_no_config", 'platform: "tensorflow_graphdef"\n')
    with naiad.Server(model_repository=str(root), exit_on_error=False) as srv:
        yield srv, node_in, node_out


def test_savedmodel_without_config_is_auto_completed_from_its_signature(server):
    srv = server[0]
    config = srv.model_config_dict("savedmodel_auto")
    assert config["platform"] == "tensorflow_savedmodel"
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    inputs = {t["name"]: (t["data_type"], t["dims"]) for t in config["input"]}
    assert inputs == {"x": ("TYPE_FP32", [4]), "tag": ("TYPE_STRING", [1])}
    outputs = {t["name"]: t["data_type"] for t in config["output"]}
    assert outputs == {"scaled": "TYPE_FP32", "echo": "TYPE_STRING"}
    assert config["instance_group"][0]["count"] == 2  # KIND_CPU default count for tensorflow


def test_savedmodel_numbers_and_strings(server):
    x = fm.features(3, seed=1, n_features=4)
    tags = np.array([[b"a"], [b"bc"], [b"d"]], dtype=object)
    out = server[0].infer("savedmodel_auto", {"x": x, "tag": tags})
    np.testing.assert_allclose(out["scaled"], x * 3.0 + 1.0, rtol=1e-6)
    assert out["echo"].reshape(-1).tolist() == [b"a!", b"bc!", b"d!"]


def test_graphdef_with_config(server):
    srv, node_in, node_out = server
    x = fm.features(2, seed=2, n_features=4)
    np.testing.assert_allclose(srv.infer("graphdef", {node_in: x})[node_out], x * 2.0 - 1.0, rtol=1e-6)


def test_graphdef_without_io_in_config_is_a_load_error(server):
    entry = {e["name"]: e for e in server[0].repository_index()}["graphdef_no_config"]
    assert entry["state"] == "UNAVAILABLE"
    assert "GraphDef models must list inputs and outputs in config.pbtxt" in entry["reason"]
