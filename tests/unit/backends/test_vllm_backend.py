"""The vllm backend: its adapter driven with a stand-in engine (vLLM itself is not installed here),
and the real server explaining why a vllm model is unavailable."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import urllib.request
from types import SimpleNamespace

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import BackendRequest, BackendResponse
from naiad.backends.vllm_backend import (
    VllmAdapter,
    VllmBackend,
    VllmInstance,
    read_settings,
    sampling_values,
)
from naiad.protocol.errors import ErrorCode
from tests.support.servers import start_server


class FakeEngine:
    """Records calls the way vLLM's AsyncLLMEngine receives them; yields scripted cumulative outputs."""

    def __init__(self, texts: list[str], block: bool = False) -> None:
        self.texts = texts
        self.block = block
        self.calls: list[tuple] = []
        self.aborted: list[str] = []
        self.started = asyncio.Event()

    async def generate(self, prompt, params, request_id):
        self.calls.append((prompt, params, request_id))
        self.started.set()
        for index, text in enumerate(self.texts):
            last = index == len(self.texts) - 1 and not self.block
            choice = SimpleNamespace(text=text, token_ids=list(range(index + 1)), finish_reason="length" if last else None)
            yield SimpleNamespace(outputs=[choice], finished=last, prompt_token_ids=[1, 2, 3])
        if self.block:
            await asyncio.Event().wait()  # a long generation: only an abort ends it

    async def abort(self, request_id):
        self.aborted.append(request_id)


def _sampling_params(**kwargs):
    if "bogus" in kwargs:
        raise TypeError("SamplingParams got an unexpected keyword argument 'bogus'")
    return dict(kwargs)


def _bytes(value: str) -> np.ndarray:
    array = np.empty(1, dtype=np.object_)
    array[0] = value.encode()
    return array


def _request(prompt: str = "hi", stream: bool = True, sampling: dict | None = None, cancelled=lambda: False,
             **flags: bool) -> BackendRequest:
    inputs = {"text_input": _bytes(prompt), "stream": np.array([stream])}
    if sampling is not None:
        inputs["sampling_parameters"] = _bytes(json.dumps(sampling))
    for name, value in flags.items():
        inputs[name] = np.array([value])
    return BackendRequest(inputs=inputs, requested_outputs=[], request_id="req-1", is_cancelled=cancelled)


async def _collect(instance: VllmInstance, request: BackendRequest) -> list[BackendResponse]:
    responses: list[BackendResponse] = []
    done = asyncio.Event()

    def respond(index: int, response: BackendResponse) -> None:
        responses.append(response)
        if response.final:
            done.set()

    await instance.execute_requests([request], respond)
    await asyncio.wait_for(done.wait(), 5)
    return responses


def _texts(responses: list[BackendResponse]) -> list[str]:
    return [r.outputs["text_output"][0].decode() for r in responses if r.outputs]


def test_request_becomes_engine_call_and_outputs_become_deltas():
    async def run():
        engine = FakeEngine(["he", "hello", "hello world"])
        instance = VllmInstance("m_0", VllmAdapter(engine, _sampling_params), "m")
        sampling = {"max_tokens": "3", "temperature": 0, "ignore_eos": "true", "stop": ["x"]}
        responses = await _collect(instance, _request(sampling=sampling, return_finish_reason=True,
                                                      return_num_output_tokens=True, return_num_input_tokens=True))
        return engine, responses

    engine, responses = asyncio.run(run())
    prompt, params, request_id = engine.calls[0]
    assert prompt == {"prompt": "hi"} and request_id == "req-1"
    assert params == {"max_tokens": 3, "temperature": 0, "ignore_eos": True, "stop": ["x"]}  # strings converted
    assert _texts(responses) == ["he", "llo", " world"]
    assert [r.final for r in responses] == [False, False, True]
    last = responses[-1].outputs
    assert last["finish_reason"][0] == b"length"
    assert last["num_input_tokens"][0] == 3
    assert sum(int(r.outputs["num_output_tokens"][0]) for r in responses) == 3


def test_non_streaming_prepends_the_prompt_unless_excluded():
    async def run(**flags):
        instance = VllmInstance("m_0", VllmAdapter(FakeEngine(["a", "ab"]), _sampling_params), "m")
        return _texts(await _collect(instance, _request("P:", stream=False, **flags)))

    assert asyncio.run(run()) == ["P:ab"]
    assert asyncio.run(run(exclude_input_in_output=True)) == ["ab"]


def test_request_parameters_are_used_without_sampling_parameters():
    async def run():
        engine = FakeEngine(["x"])
        instance = VllmInstance("m_0", VllmAdapter(engine, _sampling_params), "m")
        request = _request()
        request.parameters = {"max_tokens": 7, "ignore_eos": True, "unrelated": "kept out"}
        await _collect(instance, request)
        return engine.calls[0][1]

    assert asyncio.run(run()) == {"max_tokens": 7, "ignore_eos": True}


def test_max_tokens_null_reaches_vllm_as_none():
    """SamplingParams(max_tokens=None) is vLLM's "up to the context limit" (the OpenAI chat default); other
    nulls are left to vLLM's defaults."""
    assert sampling_values({"max_tokens": None, "temperature": None}, only_known=False) == {"max_tokens": None}
    assert sampling_values({"temperature": 0}, only_known=True) == {"temperature": 0}


def test_bad_sampling_parameters_answer_invalid_arg():
    async def run(sampling):
        engine = FakeEngine(["x"])
        instance = VllmInstance("m_0", VllmAdapter(engine, _sampling_params), "m")
        responses = await _collect(instance, _request(sampling=sampling))
        return engine, responses

    for sampling, words in (({"bogus": 1}, "bogus"), ({"n": 2}, "n and best_of"), ({"max_tokens": "many"}, "max_tokens")):
        engine, responses = asyncio.run(run(sampling))
        assert engine.calls == []
        assert responses[0].error.code is ErrorCode.INVALID_ARG and words in responses[0].error.message


def test_client_gone_aborts_the_engine_request():
    async def run():
        engine = FakeEngine(["a", "ab"], block=True)
        instance = VllmInstance("m_0", VllmAdapter(engine, _sampling_params), "m", poll_secs=0.005)
        gone = {"value": False}
        responses: list[BackendResponse] = []
        await instance.execute_requests([_request(cancelled=lambda: gone["value"])], lambda i, r: responses.append(r))
        await asyncio.wait_for(engine.started.wait(), 5)
        while len(responses) < 2:
            await asyncio.sleep(0.001)
        gone["value"] = True
        for _ in range(1000):
            if engine.aborted:
                break
            await asyncio.sleep(0.001)
        await instance.aclose()
        return engine, responses, instance

    engine, responses, instance = asyncio.run(run())
    assert engine.aborted == ["req-1"]
    assert _texts(responses) == ["a", "b"]
    assert not instance._active


def test_unload_ends_running_requests_with_an_error():
    async def run():
        engine = FakeEngine(["a"], block=True)
        instance = VllmInstance("m_0", VllmAdapter(engine, _sampling_params), "m")
        responses: list[BackendResponse] = []
        await instance.execute_requests([_request()], lambda i, r: responses.append(r))
        await asyncio.wait_for(engine.started.wait(), 5)
        await asyncio.sleep(0)
        await instance.aclose()
        return engine, responses

    engine, responses = asyncio.run(run())
    assert engine.aborted == ["req-1"]
    assert responses[-1].final and responses[-1].error.code is ErrorCode.UNAVAILABLE


def test_model_json_and_auto_complete(tmp_path):
    (tmp_path / "weights").mkdir()
    (tmp_path / "model.json").write_text(json.dumps({"model": "weights", "gpu_memory_utilization": 0.5}))
    settings = read_settings(tmp_path)
    assert settings == {"model": str((tmp_path / "weights").resolve()), "gpu_memory_utilization": 0.5}
    (tmp_path / "model.json").write_text(json.dumps({"model": "org/hub-name"}))
    assert read_settings(tmp_path)["model"] == "org/hub-name"  # not a local path: vLLM resolves it
    config = mc.ModelConfig(name="m", backend="vllm")
    VllmBackend().auto_complete_config(config, tmp_path, 0)
    assert config.model_transaction_policy.decoupled
    assert [t.name for t in config.input][:4] == ["text_input", "stream", "sampling_parameters", "exclude_input_in_output"]
    assert "text_output" in [t.name for t in config.output]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_server_reports_why_a_vllm_model_is_unavailable(tmp_path):
    version = tmp_path / "repo" / "llm" / "1"
    version.mkdir(parents=True)
    (tmp_path / "repo" / "llm" / "config.pbtxt").write_text('backend: "vllm"\n')
    (version / "model.json").write_text(json.dumps({"model": "facebook/opt-125m", "gpu_memory_utilization": 0.5}))
    with start_server(tmp_path / "repo") as server:
        request = urllib.request.Request(f"http://{server.http_url}/v2/repository/index", b"{}", method="POST")
        with urllib.request.urlopen(request, timeout=10) as reply:
            index = json.loads(reply.read())
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://{server.http_url}/v2/models/llm/ready", timeout=10)
    entry = next(e for e in index if e["name"] == "llm")
    assert entry["state"] == "UNAVAILABLE"
    assert "needs the 'vllm' package" in entry["reason"] and 'backend: "transformers"' in entry["reason"]


def test_a_backend_directory_vllm_model_py_takes_precedence(tmp_path):
    from naiad.backends.registry import BackendRegistry

    registry = BackendRegistry()
    assert isinstance(registry.get("vllm"), VllmBackend)
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    shared = registry.get("vllm", str(tmp_path))
    assert not isinstance(shared, VllmBackend)
    assert shared.shared_model_file == (tmp_path / "vllm" / "model.py").resolve()


class ClientError(Exception):
    """Stands in for vLLM's VLLMClientError (not a ValueError)."""


class RefusingEngine(FakeEngine):
    async def generate(self, prompt, params, request_id):
        self.calls.append((prompt, params, request_id))
        raise ClientError("prompt longer than max_model_len")
        yield  # an async generator, as vLLM's is


class RenderingEngine(FakeEngine):
    """Has vLLM 0.32's renderer: prompts reach generate() already rendered."""

    def __init__(self, texts: list[str]) -> None:
        super().__init__(texts)
        self.renderer = SimpleNamespace(render_cmpl_async=self._render)

    async def _render(self, prompts):
        return [{"type": "token", "prompt_token_ids": [7, 8], "prompt": p["prompt"]} for p in prompts]


def test_engine_client_errors_answer_invalid_arg_and_sampling_validation_too():
    def make(**kwargs):
        raise ClientError("temperature must be non-negative")

    async def run(engine, make_params):
        adapter = VllmAdapter(engine, make_params, client_errors=(TypeError, ValueError, ClientError))
        return await _collect(VllmInstance("m_0", adapter, "m"), _request())

    responses = asyncio.run(run(RefusingEngine(["x"]), _sampling_params))
    assert responses[0].error.code is ErrorCode.INVALID_ARG and "max_model_len" in responses[0].error.message
    assert responses[0].counts_as_failure is False
    responses = asyncio.run(run(FakeEngine(["x"]), make))
    assert responses[0].error.code is ErrorCode.INVALID_ARG and "non-negative" in responses[0].error.message


def test_prompts_are_rendered_by_the_engine_renderer_when_it_has_one():
    async def run():
        engine = RenderingEngine(["ok"])
        await _collect(VllmInstance("m_0", VllmAdapter(engine, _sampling_params), "m"), _request("hi"))
        return engine.calls[0][0]

    assert asyncio.run(run()) == {"type": "token", "prompt_token_ids": [7, 8], "prompt": "hi"}


def test_an_error_finish_reason_fails_the_request():
    class FailingEngine(FakeEngine):
        async def generate(self, prompt, params, request_id):
            choice = SimpleNamespace(text="par", token_ids=[1], finish_reason="error")
            yield SimpleNamespace(outputs=[choice], finished=True, prompt_token_ids=[1])

    async def run():
        return await _collect(VllmInstance("m_0", VllmAdapter(FailingEngine([]), _sampling_params), "m"), _request())

    responses = asyncio.run(run())
    assert responses[-1].final and responses[-1].error.code is ErrorCode.INTERNAL


def test_vllm_stats_become_triton_vllm_metric_families():
    from naiad.backends.vllm_metrics import VllmStats, families, token_buckets

    assert token_buckets(300) == (1, 2, 5, 10, 20, 50, 100, 200)
    stats = VllmStats(max_model_len=100)
    finished = SimpleNamespace(finish_reason="length", e2e_latency=0.5, num_prompt_tokens=3, num_generation_tokens=8)
    iteration = SimpleNamespace(num_prompt_tokens=3, num_generation_tokens=8, num_preempted_reqs=0,
                                time_to_first_tokens_iter=[0.02], inter_token_latencies_iter=[0.01] * 7,
                                n_params_iter=[1], finished_requests=[finished])
    stats.record(SimpleNamespace(num_running_reqs=2, num_waiting_reqs=1, kv_cache_usage=0.25), iteration)
    stats.record(SimpleNamespace(num_running_reqs=0, num_waiting_reqs=0, kv_cache_usage=0.0), None)
    by_name = {f.name: f for f in families({"model": "m", "version": "1"}, stats)}
    labels = {"model": "m", "version": "1"}

    def value(name, suffix="", **extra):
        return next(v for s, labs, v in by_name[name].samples if s == suffix and labs == {**labels, **extra})

    assert value("vllm:prompt_tokens_total") == 3 and value("vllm:generation_tokens_total") == 8
    assert value("vllm:request_success_total", finished_reason="length") == 1
    assert value("vllm:num_requests_running") == 0 and value("vllm:kv_cache_usage_perc") == 0.0
    assert value("vllm:time_per_output_token_seconds", "_count") == 7
    assert value("vllm:request_generation_tokens", "_bucket", le="10") == 1
    assert value("vllm:request_generation_tokens", "_bucket", le="5") == 0
    assert value("vllm:e2e_request_latency_seconds", "_sum") == 0.5


def test_instance_publishes_vllm_metrics_while_loaded():
    from naiad.backends.vllm_metrics import VllmStats

    async def run():
        metrics = SimpleNamespace(extra_families=[])
        adapter = VllmAdapter(FakeEngine(["x"]), _sampling_params, stats=VllmStats())
        instance = VllmInstance("m_0", adapter, "m", labels={"model": "m", "version": "3"}, metrics=metrics)
        names = [f.name for provider in metrics.extra_families for f in provider()]
        await instance.aclose()
        return names, metrics.extra_families

    names, left = asyncio.run(run())
    assert "vllm:num_requests_running" in names and left == []


def test_close_stops_the_output_task_before_shutting_the_engine_down():
    class EngineWithOutputTask(FakeEngine):
        def __init__(self) -> None:
            super().__init__([])
            self.output_handler = asyncio.get_running_loop().create_task(asyncio.Event().wait())
            self.shut_with_handler_done: bool | None = None

        def shutdown(self) -> None:
            self.shut_with_handler_done = self.output_handler.done()

    async def run():
        engine = EngineWithOutputTask()
        adapter = VllmAdapter(engine, _sampling_params)
        await VllmInstance("m_0", adapter, "m").aclose()
        return engine, adapter

    engine, adapter = asyncio.run(run())
    assert engine.output_handler.cancelled() and engine.shut_with_handler_done is True
    assert adapter.engine is None  # dropped, so vLLM's __del__ does not run at interpreter exit
