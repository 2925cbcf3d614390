"""The Server facade used in-process: validation, batching, classification, lifecycle, no sockets."""

import asyncio
import os

import numpy as np
import pytest

import naiad
from naiad.protocol.errors import ErrorCode, NaiadError
from naiad.protocol.types import InferenceRequest, InferInput, RequestedOutput
from tests.support.onnx_models import (
    add_sub_model,
    classifier_model,
    identity_model,
    write_config,
)
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    add_sub_model(root, "add_sub")
    add_sub_model(root, "add_sub_nobatch", max_batch_size=0, dims=4, scheduler="")
    identity_model(root, "identity_bytes", "BYTES", [-1])
    classifier_model(root, "classifier", labels=["a", "b", "c", "d", "e"])
    write_config(root / "broken", 'name: "broken"\nbackend: "onnxruntime"\nmax_batch_size: oops\n')
    (root / "broken" / "1").mkdir()
    broken_file = identity_model(root, "broken_file", "FP32", [-1])
    (broken_file / "1" / "model.onnx").write_bytes(b"not an onnx model")
    return root


@pytest.fixture(scope="module")
def server(repo):
    with naiad.Server(model_repository=str(repo)) as srv:
        yield srv


def _request(model, inputs, **kw):
    return InferenceRequest(model_name=model, inputs=[InferInput(n, dt, a.shape, a) for n, dt, a in inputs], **kw)


def _run(server, request):
    return asyncio.run_coroutine_threadsafe(server.infer_async(request), server._loop).result()


def test_infer_add_sub(server):
    a = np.random.rand(3, 16).astype(np.float32)
    b = np.random.rand(3, 16).astype(np.float32)
    out = server.infer("add_sub", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_allclose(out["OUTPUT0"], a + b)
    np.testing.assert_allclose(out["OUTPUT1"], a - b)


def test_strings_roundtrip_as_bytes(server):
    out = server.infer("identity_bytes", {"INPUT0": np.array([["x", "yz"]])})
    assert out["OUTPUT0"].tolist() == [[b"x", b"yz"]]


def test_failed_model_is_unavailable_and_others_serve(server):
    entries = {e["name"]: e for e in server.repository_index()}
    assert entries["broken_file"]["state"] == "UNAVAILABLE"
    assert "broken_file" in entries["broken_file"]["reason"] or "onnx" in entries["broken_file"]["reason"].lower()
    assert entries["add_sub"]["state"] == "READY"
    assert not server.is_ready()  # strict readiness: one model is not ready
    with pytest.raises(NaiadError) as err:
        server.model_metadata("broken_file")
    assert err.value.code is ErrorCode.NOT_FOUND and "has no available versions" in err.value.message


def test_unreadable_config_is_listed_by_name_only(server):
    # As Triton: a config that does not parse never reaches a version state (it is logged, not indexed).
    entries = {e["name"]: e for e in server.repository_index()}
    assert entries["broken"] == {"name": "broken"}
    with pytest.raises(NaiadError) as err:
        server.model_metadata("broken")
    assert err.value.code is ErrorCode.NOT_FOUND and "'broken' is not found" in err.value.message


@pytest.mark.parametrize(
    "inputs,message",
    [
        ([("INPUT0", "FP32", np.zeros((1, 16), np.float32))], "expected 2 inputs but got 1 inputs for model 'add_sub'"),
        ([("INPUT0", "INT32", np.zeros((1, 16), np.int32)), ("INPUT1", "FP32", np.zeros((1, 16), np.float32))],
         "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'"),
        ([("INPUT0", "FP32", np.zeros((1, 15), np.float32)), ("INPUT1", "FP32", np.zeros((1, 15), np.float32))],
         "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [-1,16], got [1,15]"),
        ([("INPUT0", "FP32", np.zeros((9, 16), np.float32)), ("INPUT1", "FP32", np.zeros((9, 16), np.float32))],
         "inference request batch-size must be <= 8 for 'add_sub'"),
        ([("INPUT0", "FP32", np.zeros((1, 16), np.float32)), ("INPUT0", "FP32", np.zeros((1, 16), np.float32))],
         "input 'INPUT0' already exists in request"),
    ],
)
def test_validation_messages(server, inputs, message):
    with pytest.raises(NaiadError) as err:
        _run(server, _request("add_sub", inputs, id="7"))
    assert err.value.code is ErrorCode.INVALID_ARG
    assert err.value.message.startswith("[request id: 7] ")
    assert message in err.value.message


def test_validation_messages_match_triton_exactly(server):
    a = np.zeros((1, 16), np.float32)
    cases = [
        ([("INPUT0", "FP32", a)],
         "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['INPUT0'], "
         "but missing required input(s) ['INPUT1']. Please provide all required input(s)."),
        ([("INPUT0", "FP32", a), ("NOPE", "FP32", a)], "unexpected inference input 'NOPE' for model 'add_sub'"),
    ]
    for inputs, message in cases:
        with pytest.raises(NaiadError) as err:
            _run(server, _request("add_sub", inputs))
        assert err.value.message == message
    with pytest.raises(NaiadError) as err:
        _run(server, _request("add_sub_nobatch", [("INPUT0", "FP32", np.zeros((1, 4), np.float32)), ("INPUT1", "FP32", np.zeros((1, 4), np.float32))]))
    assert err.value.message == "[request id: <id_unknown>] unexpected shape for input 'INPUT0' for model 'add_sub_nobatch'. Expected [4], got [1,4]. "


def test_outputs_follow_model_order(server):
    a = np.ones((1, 16), np.float32)
    response = _run(server, _request("add_sub", [("INPUT0", "FP32", a), ("INPUT1", "FP32", a)],
                                     outputs=[RequestedOutput("OUTPUT1"), RequestedOutput("OUTPUT0"), RequestedOutput("OUTPUT1")]))
    assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]


def test_outputs_named_alone_answer_as_unnamed_ones_and_others_as_they_ask(server):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.ones((1, 16), np.float32)
    inputs = [("INPUT0", "FP32", a), ("INPUT1", "FP32", b)]
    every = _run(server, _request("add_sub", inputs, id="r1"))
    named = _run(server, _request("add_sub", inputs, id="r1", outputs=[RequestedOutput("OUTPUT1"), RequestedOutput("OUTPUT0")]))
    assert [(o.name, o.datatype, o.shape, o.parameters) for o in named.outputs] == [
        (o.name, o.datatype, o.shape, o.parameters) for o in every.outputs] == [
        ("OUTPUT0", "FP32", (1, 16), {}), ("OUTPUT1", "FP32", (1, 16), {})]
    assert named.id == every.id == "r1" and named.parameters == every.parameters == {}
    np.testing.assert_array_equal(named.output("OUTPUT0").data, a + b)
    np.testing.assert_array_equal(named.output("OUTPUT1").data, a - b)
    alone = _run(server, _request("add_sub", inputs, outputs=[RequestedOutput("OUTPUT1", parameters={"binary_data": True})]))
    assert [o.name for o in alone.outputs] == ["OUTPUT1"] and alone.outputs[0].parameters == {}
    np.testing.assert_array_equal(alone.outputs[0].data, a - b)
    # one output asking for more (classification) than its data: every output as requested
    mixed = _run(server, _request("add_sub", inputs, outputs=[RequestedOutput("OUTPUT1", classification=1), RequestedOutput("OUTPUT0")]))
    assert [(o.name, o.datatype, o.shape) for o in mixed.outputs] == [("OUTPUT0", "FP32", (1, 16)), ("OUTPUT1", "BYTES", (1, 1))]
    np.testing.assert_array_equal(mixed.outputs[0].data, a + b)
    assert mixed.outputs[1].data[0, 0] == b"14.000000:15"


def test_unknown_output_and_model(server):
    a = np.zeros((1, 16), np.float32)
    with pytest.raises(NaiadError, match="unexpected inference output 'NOPE' for model 'add_sub'"):
        _run(server, _request("add_sub", [("INPUT0", "FP32", a), ("INPUT1", "FP32", a)], outputs=[RequestedOutput("NOPE")]))
    with pytest.raises(NaiadError) as err:
        _run(server, _request("nope", []))
    assert err.value.code is ErrorCode.NOT_FOUND and err.value.message == "Request for unknown model: 'nope' is not found"
    with pytest.raises(NaiadError) as err:
        _run(server, _request("add_sub", [], model_version="3"))
    assert err.value.message == "Request for unknown model: 'add_sub' version 3 is not found"


def test_classification_with_labels(server):
    x = np.random.rand(2, 4).astype(np.float32)
    probs = server.infer("classifier", {"INPUT": x})["PROBS"]
    response = _run(server, _request("classifier", [("INPUT", "FP32", x)], outputs=[RequestedOutput("PROBS", classification=2)]))
    out = response.outputs[0]
    assert out.datatype == "BYTES" and out.shape == (2, 2)
    top = int(np.argmax(probs[0]))
    value, index, label = out.data[0, 0].decode().split(":")
    assert int(index) == top and label == "abcde"[top]
    assert value == f"{probs[0, top]:f}"  # C %f, six decimals, as Triton prints it


def test_concurrent_requests_are_batched(server):
    async def many():
        a = np.ones((1, 16), np.float32)
        reqs = [_request("add_sub", [("INPUT0", "FP32", a * i), ("INPUT1", "FP32", a)]) for i in range(32)]
        return await asyncio.gather(*(server.infer_async(r) for r in reqs))

    responses = asyncio.run_coroutine_threadsafe(many(), server._loop).result()
    for i, response in enumerate(responses):
        assert response.output("OUTPUT0").data[0, 0] == i + 1
    stats = server.model_statistics("add_sub")["model_stats"][0]
    assert stats["inference_count"] >= 32
    assert stats["execution_count"] < stats["inference_stats"]["success"]["count"]  # some batches held > 1 request


def test_explicit_mode_load_reload_unload(repo, tmp_path):
    add_sub_model(tmp_path, "m")
    with naiad.Server(model_repository=str(tmp_path), model_control_mode="explicit") as srv:
        assert srv.repository_index() == [{"name": "m"}]
        run = lambda coro: asyncio.run_coroutine_threadsafe(coro, srv._loop).result()  # noqa: E731
        run(srv.load_model("m"))
        assert srv.model_ready("m")
        # a config override stays in force until unload
        run(srv.load_model("m", config_json='{"max_batch_size": 2, "backend": "onnxruntime"}'))
        assert srv.model_config("m").max_batch_size == 2
        os.makedirs(tmp_path / "m" / "2")
        (tmp_path / "m" / "2" / "model.onnx").write_bytes((tmp_path / "m" / "1" / "model.onnx").read_bytes())
        run(srv.load_model("m"))
        assert srv.model_metadata("m")["versions"] == ["2"]
        assert srv.model_config("m").max_batch_size == 2
        run(srv.unload_model("m"))
        assert {e["state"] for e in srv.repository_index()} == {"UNAVAILABLE"}
        assert all(e.get("reason") == "unloaded" for e in srv.repository_index())
        with pytest.raises(NaiadError) as err:
            run(srv.load_model("missing"))
        assert err.value.code is ErrorCode.INTERNAL
        assert "failed to poll from model repository" in err.value.message


def test_load_refused_outside_explicit_mode(server):
    with pytest.raises(NaiadError) as err:
        asyncio.run_coroutine_threadsafe(server.load_model("add_sub"), server._loop).result()
    assert err.value.code is ErrorCode.UNAVAILABLE


def test_failed_reload_keeps_old_version(tmp_path):
    model_dir = add_sub_model(tmp_path, "m")
    with naiad.Server(model_repository=str(tmp_path), model_control_mode="explicit", load_models=["m"]) as srv:
        run = lambda coro: asyncio.run_coroutine_threadsafe(coro, srv._loop).result()  # noqa: E731
        write_config(model_dir, 'name: "m"\nmax_batch_size: [\n')
        with pytest.raises(NaiadError) as err:
            run(srv.load_model("m"))
        assert err.value.code is ErrorCode.INTERNAL
        assert err.value.message.startswith("failed to load 'm', failed to poll from model repository: ")
        assert "config.pbtxt:2" in err.value.message
        assert srv.is_ready()
        a = np.ones((1, 16), np.float32)
        assert srv.infer("m", {"INPUT0": a, "INPUT1": a})["OUTPUT0"][0, 0] == 2


def test_file_override_refuses_path_traversal(tmp_path):
    with naiad.Server(model_repository=str(tmp_path), model_control_mode="explicit") as srv:
        coro = srv.load_model("x", config_json='{"backend":"onnxruntime"}', files={"file:../../etc/evil": b"x"})
        with pytest.raises(NaiadError) as err:
            asyncio.run_coroutine_threadsafe(coro, srv._loop).result()
        assert err.value.code is ErrorCode.INVALID_ARG


def test_poll_mode_picks_up_new_changed_and_removed_models(tmp_path):
    import shutil

    add_sub_model(tmp_path, "a")
    with naiad.Server(model_repository=str(tmp_path), model_control_mode="poll", repository_poll_secs=0.05) as srv:
        add_sub_model(tmp_path, "b")

        wait_until(lambda: any(e.get("state") == "READY" for e in srv.repository_index() if e["name"] == "b"),
                   "the new model b to be served", timeout=20)
        shutil.copytree(tmp_path / "a" / "1", tmp_path / "a" / "2")
        wait_until(lambda: srv.model_metadata("a")["versions"] == ["2"], "version 2 of a to be served", timeout=20)
        shutil.rmtree(tmp_path / "b")
        wait_until(lambda: all(e.get("state") != "READY" for e in srv.repository_index() if e["name"] == "b"),
                   "the removed model b to be unloaded", timeout=20)
        with pytest.raises(NaiadError):
            asyncio.run_coroutine_threadsafe(srv.load_model("a"), srv._loop).result()


def test_reshape_is_applied_both_ways(tmp_path):
    from tests.support.onnx_models import reshape_model

    reshape_model(tmp_path)
    with naiad.Server(model_repository=str(tmp_path)) as srv:
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        y = srv.infer("reshape", {"X": x})["Y"]
        assert y.shape == (2, 4)
        np.testing.assert_array_equal(y, x.reshape(2, 2, 2).transpose(0, 2, 1).reshape(2, 4))
        assert srv.model_metadata("reshape")["inputs"][0]["shape"] == [-1, 4]


def test_response_cache_hits_skip_the_model(tmp_path):
    model_dir = add_sub_model(tmp_path, "cached")
    (model_dir / "config.pbtxt").write_text((model_dir / "config.pbtxt").read_text() + "response_cache { enable: true }\n")
    add_sub_model(tmp_path, "uncached")
    with naiad.Server(model_repository=str(tmp_path), response_cache_bytes=1 << 20) as srv:
        a = np.ones((1, 16), np.float32)
        for _ in range(3):
            assert srv.infer("cached", {"INPUT0": a, "INPUT1": a})["OUTPUT0"][0, 0] == 2
            srv.infer("uncached", {"INPUT0": a, "INPUT1": a})
        assert srv.infer("cached", {"INPUT0": a * 2, "INPUT1": a})["OUTPUT0"][0, 0] == 3
        stats = {s["name"]: s for s in srv.model_statistics()["model_stats"]}
        cached = stats["cached"]
        assert cached["inference_stats"]["cache_hit"]["count"] == 2
        assert cached["inference_stats"]["cache_miss"]["count"] == 2
        assert cached["execution_count"] == 2 and cached["inference_stats"]["success"]["count"] == 4
        assert stats["uncached"]["inference_stats"]["cache_hit"]["count"] == 0
        assert stats["uncached"]["execution_count"] == 3


def test_response_cache_is_bounded_lru():
    from naiad.core.response_cache import ResponseCache

    cache = ResponseCache(capacity_bytes=100)
    cache.put("a", {"x": np.zeros(10, np.float32)}, {})  # 40 bytes
    cache.put("b", {"x": np.zeros(10, np.float32)}, {})
    assert cache.get("a") is not None  # a is now most recent
    cache.put("c", {"x": np.zeros(10, np.float32)}, {})  # evicts b
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    cache.put("huge", {"x": np.zeros(100, np.float32)}, {})
    assert cache.get("huge") is None and cache.usage() == (2, 80)


def test_unsafe_model_names_refused_in_process(tmp_path):
    with naiad.Server(model_repository=str(tmp_path), model_control_mode="explicit") as srv:
        for name in ("../x", "a/b", "..", "x\x00y"):
            coro = srv.load_model(name, config_json='{"backend":"onnxruntime"}', files={"file:1/model.onnx": b"x"})
            with pytest.raises(NaiadError) as err:
                asyncio.run_coroutine_threadsafe(coro, srv._loop).result()
            assert err.value.code is ErrorCode.INVALID_ARG and "invalid model name" in err.value.message
        assert not (tmp_path.parent / "x").exists()
