"""model_warmup runs before a model is READY and a failing sample fails the load."""

import numpy as np

import naiad
from tests.support.onnx_models import add_sub_model


def _with_warmup(model_dir, sample: str) -> None:
    config = (model_dir / "config.pbtxt").read_text()
    (model_dir / "config.pbtxt").write_text(config + sample)


def test_warmup_samples_execute_before_ready(tmp_path):
    model_dir = add_sub_model(tmp_path, "warm", instances=2)
    (model_dir / "warmup").mkdir()
    (model_dir / "warmup" / "ones").write_bytes(np.ones(16, np.float32).tobytes())
    _with_warmup(model_dir, '''model_warmup [
  { name: "zeros" batch_size: 4 count: 2
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [16] zero_data: true } }
    inputs { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [16] random_data: true } } },
  { name: "file" batch_size: 1
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [16] input_data_file: "ones" } }
    inputs { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [16] input_data_file: "ones" } } }
]
''')
    with naiad.Server(model_repository=str(tmp_path)) as srv:
        stats = srv.model_statistics("warm")["model_stats"][0]
        # 2 samples: (count 2 + count 1) x 2 instances executions, rows 4*4 + 1*2
        assert stats["execution_count"] == 6 and stats["inference_count"] == 18
        assert srv.model_ready("warm")


def test_failing_warmup_fails_the_load(tmp_path):
    model_dir = add_sub_model(tmp_path, "cold")
    _with_warmup(model_dir, '''model_warmup [{ name: "bad" batch_size: 1
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [16] input_data_file: "missing" } }
    inputs { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [16] zero_data: true } } }]
''')
    with naiad.Server(model_repository=str(tmp_path)) as srv:
        entry = srv.repository_index()[0]
        assert entry["state"] == "UNAVAILABLE" and "warmup sample 'bad' failed" in entry["reason"]
