"""Trace settings rules and Triton-mode trace files."""

import json

import numpy as np
import pytest

import naiad
from naiad.observability.tracing import TraceConfig, Tracer, apply_settings, parse_trace_config
from naiad.protocol.errors import ErrorCode, NaiadError
from tests.support.onnx_models import add_sub_model


def test_settings_rules():
    config = TraceConfig()
    assert config.as_dict() == {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
                                "log_frequency": "0", "trace_file": "", "trace_mode": "triton"}
    updated = apply_settings(config, {"trace_level": ["TIMESTAMPS"], "trace_rate": "2"})
    assert updated.level == ("TIMESTAMPS",) and updated.rate == 2 and config.rate == 1000
    for body, code, text in [
        ({"trace_file": "x"}, ErrorCode.UNSUPPORTED, "trace file location can not be updated through network protocol"),
        ({"trace_rate": "abc"}, ErrorCode.INVALID_ARG, "Unable to parse 'trace_rate', got: abc"),
        ({"trace_rate": 5}, ErrorCode.INVALID_ARG, "trace_rate"),
        ({"trace_level": ["LOUD"]}, ErrorCode.INVALID_ARG, "trace_level"),
    ]:
        with pytest.raises(NaiadError) as err:
            apply_settings(config, body)
        assert err.value.code is code and text in err.value.message


def test_parse_trace_config_flags():
    config = parse_trace_config(["rate=1", "level=TIMESTAMPS", "level=TENSORS", "triton,file=/tmp/t.json", "count=5"])
    assert config.level == ("TIMESTAMPS", "TENSORS") and config.rate == 1 and config.file == "/tmp/t.json" and config.count == 5
    for bad in (["jaeger,url=http://x"], ["mode=jaeger"], ["rate=-1"], ["level=LOUD"]):
        with pytest.raises(ValueError):
            parse_trace_config(bad)


def test_trace_file_written_at_shutdown(tmp_path):
    add_sub_model(tmp_path / "repo", "m")
    trace_file = tmp_path / "trace.json"
    server = naiad.Server(model_repository=str(tmp_path / "repo"),
                          trace_config=["rate=2", "level=TIMESTAMPS", "level=TENSORS", f"triton,file={trace_file}"])
    with server as srv:
        a = np.ones((1, 16), np.float32)
        for _ in range(4):
            srv.infer("m", {"INPUT0": a, "INPUT1": a})
        assert srv.get_trace_settings("m")["trace_rate"] == "2"
        with pytest.raises(NaiadError, match="Request for unknown model : nope"):
            srv.get_trace_settings("nope")
    records = json.loads(trace_file.read_text())
    heads = [r for r in records if "model_name" in r]
    assert len(heads) == 2 and heads[0]["model_name"] == "m" and heads[0]["model_version"] == 1
    names = [t["name"] for r in records if r["id"] == heads[0]["id"] for t in r.get("timestamps", [])]
    assert names[0] == "REQUEST_START" and names[-1] == "REQUEST_END" and "COMPUTE_START" in names
    tensors = [r for r in records if r.get("activity") == "TENSOR_QUEUE_INPUT" and r["id"] == heads[0]["id"]]
    assert tensors[0]["tensor"] == {"name": "INPUT0", "data": ",".join(["1.0"] * 16), "shape": "1,16", "dtype": "FP32"}


def test_ensemble_steps_get_their_own_trace_with_the_ensemble_as_parent(tmp_path):
    from tests.support.onnx_models import ensemble_model

    add_sub_model(tmp_path / "repo", "m")
    ensemble_model(tmp_path / "repo", "ens", [("m", {"INPUT0": "IN0", "INPUT1": "IN1"}, {"OUTPUT0": "OUT0"})],
                   inputs=[("IN0", "FP32", [16]), ("IN1", "FP32", [16])], outputs=[("OUT0", "FP32", [16])])
    trace_file = tmp_path / "trace.json"
    server = naiad.Server(model_repository=str(tmp_path / "repo"),
                          trace_config=["rate=2", "level=TIMESTAMPS", f"triton,file={trace_file}"])
    with server as srv:
        a = np.ones((1, 16), np.float32)
        for _ in range(4):
            srv.infer("ens", {"IN0": a, "IN1": a})
    heads = [r for r in json.loads(trace_file.read_text()) if "model_name" in r]
    ensembles = [h for h in heads if h["model_name"] == "ens"]
    steps = [h for h in heads if h["model_name"] == "m"]
    # 1 in 2 ensemble requests traced; their steps follow them (and only them), whatever the step's own rate count
    assert len(ensembles) == 2 and all(e["parent_id"] == 0 for e in ensembles)
    assert sorted(s["parent_id"] for s in steps) == sorted(e["id"] for e in ensembles)
    assert not {s["id"] for s in steps} & {e["id"] for e in ensembles}


def test_tracer_active_follows_settings_and_count():
    tracer = Tracer(TraceConfig())
    assert not tracer.active  # level OFF: nothing can be traced
    tracer.update("m", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "2"})
    assert tracer.active
    assert tracer.decide("m") is not None and tracer.decide("m") is not None
    assert tracer.decide("m") is None and not tracer.active  # the count ran out
    with pytest.raises(NaiadError):
        tracer.update("", {"trace_rate": "abc"})
    assert not tracer.active
    tracer.update("", {"trace_level": ["TIMESTAMPS"]})
    assert tracer.active and tracer.decide("other") is None  # global rate 1000: the first request is not sampled


def test_tracing_switched_on_while_serving_traces_requests(tmp_path):
    add_sub_model(tmp_path / "repo", "m")
    trace_file = tmp_path / "trace.json"
    server = naiad.Server(model_repository=str(tmp_path / "repo"), trace_config=[f"triton,file={trace_file}"])
    a = np.ones((1, 16), np.float32)
    with server as srv:
        for _ in range(3):
            srv.infer("m", {"INPUT0": a, "INPUT1": a})  # tracing off
        srv.update_trace_settings("m", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "2"})
        for _ in range(4):
            out = srv.infer("m", {"INPUT0": a, "INPUT1": a})
        assert np.array_equal(out["OUTPUT0"], a + a)
    heads = [r for r in json.loads(trace_file.read_text()) if "model_name" in r]
    assert len(heads) == 2 and {h["model_name"] for h in heads} == {"m"}
