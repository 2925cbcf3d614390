"""The transformers backend: continuous batching engine, sampling, stop strings, KV budget, auto-complete."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import BackendRequest
from naiad.backends.transformers_backend.backend import (
    TransformersBackend,
    read_model_json,
)
from naiad.backends.transformers_backend.engine import (
    Engine,
    EngineError,
    Sequence,
    SequenceOutput,
)
from naiad.backends.transformers_backend.sampling import SamplingError, parse_sampling
from naiad.backends.transformers_backend.text import TextStream
from naiad.config.model_config import ConfigError
from tests.support.tiny_llm import build_tiny_llm


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    return build_tiny_llm(tmp_path_factory.mktemp("llm") / "hf", positions=512)


@pytest.fixture(scope="module")
def loaded(hf_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(hf_dir).eval(), AutoTokenizer.from_pretrained(hf_dir), torch.device("cpu")


def _engine(loaded, **kw) -> Engine:
    model, tokenizer, device = loaded
    options = {"kv_cache_bytes": 64 << 20, "max_num_seqs": 16, "max_model_len": 512} | kw
    return Engine(model, tokenizer, device=device, **options)


async def _generate(engine: Engine, prompt: str, cancel_after: int | None = None, **sampling) -> tuple[str, str | None, int]:
    done = asyncio.get_running_loop().create_future()
    parts: list[str] = []
    state = {"n": 0, "cancel": False}

    def emit(out: SequenceOutput) -> None:
        parts.append(out.text)
        state["n"] += 1
        if cancel_after is not None and state["n"] >= cancel_after:
            state["cancel"] = True
        if out.finished and not done.done():
            done.set_result((out.finish_reason, out.output_tokens))

    seq = Sequence(engine.tokenize(prompt), parse_sampling(sampling, strict=True), emit, lambda: state["cancel"])
    engine.add(seq)
    if cancel_after is not None:
        while not state["cancel"]:
            await asyncio.sleep(0.001)
        for _ in range(200):
            if seq not in engine.running:
                return "".join(parts), "cancelled", len(seq.generated)
            await asyncio.sleep(0.001)
        raise AssertionError("cancelled sequence still running")
    reason, count = await asyncio.wait_for(done, 30)
    return "".join(parts), reason, count


def test_batched_decoding_matches_one_at_a_time(loaded):
    prompts = ["hello world", "the quick brown fox jumps", "a", "numbers 0 1 2 3 4 5 6 7 8 9 and more words"]

    async def run():
        engine = _engine(loaded)
        try:
            alone = [await _generate(engine, p, max_tokens=24, temperature=0, ignore_eos=True) for p in prompts]
            assert engine.stats.max_decode_batch == 1
            together = await asyncio.gather(*(_generate(engine, p, max_tokens=24, temperature=0, ignore_eos=True)
                                              for p in prompts))
            return alone, together, engine.stats
        finally:
            await engine.close()

    alone, together, stats = asyncio.run(run())
    assert together == alone
    assert all(reason == "length" and count == 24 for _, reason, count in alone)
    assert stats.max_decode_batch == len(prompts)  # all four shared decode steps
    assert stats.max_prefill_batch == len(prompts)  # and one padded prefill
    assert stats.running == 0 and stats.kv_reserved_bytes == 0 and stats.kv_used_bytes == 0


def test_prefill_token_budget_spreads_arrivals_over_steps(loaded):
    prompts = ["hello world", "the quick brown fox jumps", "numbers 0 1 2 3"]

    async def run():
        engine = _engine(loaded, max_num_batched_tokens=8)
        try:
            results = await asyncio.gather(*(_generate(engine, p, max_tokens=6, temperature=0, ignore_eos=True)
                                              for p in prompts))
            return results, engine.stats, engine.kv
        finally:
            await engine.close()

    results, stats, kv = asyncio.run(run())
    assert [r[1:] for r in results] == [("length", 6)] * 3
    assert stats.max_prefill_batch == 1 and stats.prefill_steps == 3  # each prompt is longer than half the budget
    assert stats.max_decode_batch == 3  # yet they decode together once all joined
    assert kv.rows == 0 and kv.keys == []  # an idle engine holds no KV buffers


def test_seeded_sampling_is_reproducible(loaded):
    async def run():
        engine = _engine(loaded)
        try:
            kw = {"max_tokens": 20, "temperature": 1.0, "top_p": 0.95, "top_k": 50, "ignore_eos": True}
            a = await _generate(engine, "hello", seed=7, **kw)
            b, c = await asyncio.gather(_generate(engine, "hello", seed=7, **kw), _generate(engine, "other", seed=1, **kw))
            d = await _generate(engine, "hello", seed=8, **kw)
            return a, b, d
        finally:
            await engine.close()

    a, b, d = asyncio.run(run())
    assert a == b
    assert a != d


def test_cancelled_sequence_leaves_within_one_step(loaded):
    async def run():
        engine = _engine(loaded)
        try:
            text, reason, generated = await _generate(engine, "hello", cancel_after=3, max_tokens=400,
                                                      temperature=0, ignore_eos=True)
            return reason, generated, engine.stats
        finally:
            await engine.close()

    reason, generated, stats = asyncio.run(run())
    assert reason == "cancelled"
    assert generated <= 5
    assert stats.finished.get("cancelled") == 1 and stats.running == 0


def test_kv_budget_queues_and_refuses(loaded):
    async def run():
        probe = _engine(loaded)
        per_token = probe.bytes_per_token
        await probe.close()
        engine = _engine(loaded, kv_cache_bytes=per_token * 60)
        try:
            with pytest.raises(EngineError, match="KV cache"):
                engine.add(Sequence(engine.tokenize("hello"), parse_sampling({"max_tokens": 100}, True), lambda o: None))
            first = asyncio.ensure_future(_generate(engine, "hello", max_tokens=40, temperature=0, ignore_eos=True))
            second = asyncio.ensure_future(_generate(engine, "world", max_tokens=40, temperature=0, ignore_eos=True))
            await asyncio.sleep(0)
            waited = engine.stats.waiting
            results = await asyncio.gather(first, second)
            return waited, results, engine.stats
        finally:
            await engine.close()

    waited, results, stats = asyncio.run(run())
    assert waited >= 1
    assert [r[1] for r in results] == ["length", "length"]
    assert stats.max_decode_batch == 1  # the budget never let both run at once


def test_stop_string_cuts_the_text(loaded):
    async def run():
        engine = _engine(loaded)
        try:
            full, _, _ = await _generate(engine, "hello", max_tokens=30, temperature=0, ignore_eos=True)
            stop = full[5:8]
            cut = await _generate(engine, "hello", max_tokens=30, temperature=0, ignore_eos=True, stop=[stop])
            kept = await _generate(engine, "hello", max_tokens=30, temperature=0, ignore_eos=True, stop=stop,
                                   include_stop_str_in_output=True)
            return full, stop, cut, kept
        finally:
            await engine.close()

    full, stop, cut, kept = asyncio.run(run())
    assert len(full) > 8
    index = full.find(stop)
    assert cut[0] == full[:index] and cut[1] == "stop"
    assert kept[0] == full[:index + len(stop)]


class _CharTokenizer:
    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return "".join(chr(i) for i in ids)


def test_text_stream_holds_back_a_possible_stop_prefix():
    stream = TextStream(_CharTokenizer(), ["END"], include_stop=False, skip_special_tokens=True)
    pieces = []
    for ch in "abEx E":
        stream.add(ord(ch))
        pieces.append(stream.take(False))
    assert "".join(pieces) == "abEx "  # the final "E" may start "END": held
    stream.add(ord("N"))
    assert stream.take(False) == ""
    stream.add(ord("D"))
    assert stream.stopped and stream.take(True) == ""
    assert stream.text == "abEx "


def test_text_stream_ending_inside_a_character_keeps_its_bytes_as_replacement(hf_dir):
    """A generation cut inside a multi-byte character: the held bytes end the text as U+FFFD (what decoding
    all the tokens gives) instead of vanishing while usage still counts their tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    ids = tokenizer.encode("ok \u65e5")  # "日" is three bytes, one byte-level token each in this vocabulary
    assert len(ids) >= 4
    stream = TextStream(tokenizer, [], include_stop=False, skip_special_tokens=True)
    for token in ids[:-1]:  # stop one byte short of the character
        stream.add(token)
    assert stream.take(False) == "ok "  # the two bytes are held, waiting for the third
    stream.flush()
    assert stream.take(True) == "\ufffd" == tokenizer.decode(ids[:-1])[len("ok "):]
    complete = TextStream(tokenizer, [], include_stop=False, skip_special_tokens=True)
    for token in ids:
        complete.add(token)
    complete.flush()  # nothing held: a no-op
    assert complete.take(True) == "ok \u65e5"


def test_max_tokens_null_means_up_to_the_context_limit(loaded):
    assert parse_sampling({"max_tokens": None}, strict=True).max_tokens is None
    assert parse_sampling({}, strict=True).max_tokens == 16

    async def run():
        engine = _engine(loaded, max_model_len=40)
        per_token = engine.bytes_per_token
        try:
            prompt = len(engine.tokenize("hello world"))
            by_context = (await _generate(engine, "hello world", temperature=0, ignore_eos=True, max_tokens=None))[1:]
        finally:
            await engine.close()
        engine = _engine(loaded, max_model_len=512, kv_cache_bytes=per_token * 30)  # the budget binds first
        try:
            by_budget = (await _generate(engine, "hello world", temperature=0, ignore_eos=True, max_tokens=None))[1:]
            with pytest.raises(EngineError, match="leave no room in the KV cache budget"):
                engine.add(Sequence(list(range(1, 31)), parse_sampling({"max_tokens": None}, True), lambda o: None))
        finally:
            await engine.close()
        return prompt, by_context, by_budget

    prompt, by_context, by_budget = asyncio.run(run())
    assert by_context == ("length", 40 - prompt)
    assert by_budget == ("length", 30 - prompt)


def test_sampling_parameters_are_checked():
    assert parse_sampling({"temperature": 0, "max_tokens": "5", "stop": "x", "ignore_eos": "true"}, True).max_tokens == 5
    with pytest.raises(SamplingError, match="unknown sampling parameter 'bogus'"):
        parse_sampling({"bogus": 1}, strict=True)
    assert parse_sampling({"bogus": 1}, strict=False).max_tokens == 16
    with pytest.raises(SamplingError, match="logprobs"):
        parse_sampling({"logprobs": 3}, strict=True)
    with pytest.raises(SamplingError, match="top_p"):
        parse_sampling({"top_p": 0}, strict=True)
    with pytest.raises(SamplingError, match="max_tokens"):
        parse_sampling({"max_tokens": 0}, strict=True)


def test_auto_complete_fills_the_vllm_contract():
    config = mc.ModelConfig(name="m", backend="transformers")
    TransformersBackend().auto_complete_config(config, Path("."), 4)
    assert config.model_transaction_policy.decoupled
    assert config.max_batch_size == 0
    names = {t.name: (t.data_type, list(t.dims), t.optional) for t in config.input}
    assert names["text_input"] == (mc.TYPE_STRING, [1], False)
    assert names["stream"] == (mc.TYPE_BOOL, [1], True)
    assert names["sampling_parameters"][2] and names["exclude_input_in_output"][2]
    assert {t.name for t in config.output} >= {"text_output", "finish_reason"}
    assert names["prompt_token_ids"] == (mc.TYPE_INT64, [-1], True)


def test_model_json_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="model.json"):
        read_model_json(tmp_path)
    (tmp_path / "model.json").write_text('{"model": "nowhere"}')
    with pytest.raises(ConfigError, match="not a directory"):
        read_model_json(tmp_path)
    (tmp_path / "hf").mkdir()
    (tmp_path / "model.json").write_text('{"model": "hf", "gpu_memory_utilization": 0.5}')
    assert read_model_json(tmp_path)["model"] == str((tmp_path / "hf").resolve())


def test_instance_streams_and_refuses_bad_requests(loaded, hf_dir, tmp_path):
    from naiad.backends.base import ModelSource
    from naiad.backends.transformers_backend.backend import TransformersInstance

    def text(value: str) -> np.ndarray:
        array = np.empty(1, dtype=np.object_)
        array[0] = value.encode()
        return array

    async def run():
        engine = _engine(loaded)
        config = mc.ModelConfig(name="m")
        instance = TransformersInstance("m_0", engine, ModelSource(config, 1, tmp_path, tmp_path, tmp_path))
        got: dict[int, list] = {0: [], 1: [], 2: []}
        requests = [
            BackendRequest({"text_input": text("hello"), "stream": np.array([True])}, [],
                           parameters={"max_tokens": 4, "temperature": 0, "ignore_eos": True}),
            BackendRequest({"text_input": text("hello"), "return_finish_reason": np.array([True])}, [],
                           parameters={"max_tokens": 4, "temperature": 0, "ignore_eos": True}),
            BackendRequest({"text_input": text("x"), "sampling_parameters": text('{"nope": 1}')}, []),
        ]
        await instance.execute_requests(requests, lambda i, r: got[i].append(r))
        for _ in range(3000):
            if all(got[i] and got[i][-1].final for i in got):
                break
            await asyncio.sleep(0.001)
        await instance.aclose()
        return got

    got = asyncio.run(run())
    streamed = "".join(r.outputs["text_output"][0].decode() for r in got[0] if r.outputs)
    assert got[0][-1].final and len(got[1]) == 1
    whole = got[1][0].outputs["text_output"][0].decode()
    assert whole == "hello" + streamed  # not streaming: the prompt is prepended
    assert got[1][0].outputs["finish_reason"][0] == b"length"
    assert "unknown sampling parameter 'nope'" in got[2][0].error.message


def test_an_engine_bug_fails_waiting_requests_instead_of_hanging(loaded):
    async def run():
        engine = _engine(loaded)

        def broken() -> list:
            raise RuntimeError("planner bug")

        engine._admit = broken
        outputs: list[SequenceOutput] = []
        engine.add(Sequence(engine.tokenize("hello"), parse_sampling({"max_tokens": 4}, True), outputs.append))
        await asyncio.wait_for(asyncio.shield(engine._task), 10)
        healthy = engine.healthy()
        with pytest.raises(EngineError, match="planner bug"):
            engine.add(Sequence(engine.tokenize("hello"), parse_sampling({}, True), outputs.append))
        await engine.close()
        return outputs, healthy

    outputs, healthy = asyncio.run(run())
    assert not healthy
    assert len(outputs) == 1 and outputs[0].finished and "planner bug" in outputs[0].error


def test_models_loaded_in_parallel_threads_all_get_their_weights(hf_dir):
    """Instances load on executor threads; transformers patches process-wide attributes while it builds a
    model, so overlapping loads used to leave tied weights (lm_head) on the meta device."""
    import threading

    from transformers.modeling_utils import PreTrainedModel

    from naiad.backends.base import InstanceSpec
    from naiad.backends.transformers_backend.backend import load_model

    tie_weights = PreTrainedModel.tie_weights
    spec = InstanceSpec("m_0", mc.ModelInstanceGroup(), mc.ModelInstanceGroup.KIND_CPU, 0)
    for _ in range(3):  # the race does not show every time: a few rounds of four
        results: list[object] = []

        def load(results: list[object] = results) -> None:
            try:
                model = load_model({"model": str(hf_dir)}, spec)[0]
                results.append([name for name, p in model.named_parameters() if p.is_meta]
                               or model.lm_head.weight is model.transformer.wte.weight)
            except Exception as exc:  # reported by the assertion below
                results.append(exc)

        threads = [threading.Thread(target=load) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert results == [True] * 4
    assert PreTrainedModel.tie_weights is tie_weights  # no load left its no-op behind
