"""The transformers backend behind the real server: generate, generate_stream and the OpenAI API (openai client)."""

from __future__ import annotations

import json
import re
import socket
import threading
import urllib.error
import urllib.request

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
openai = pytest.importorskip("openai")

from tests.support.servers import post_json, start_server  # noqa: E402
from tests.support.tiny_llm import build_tiny_llm, force_one_token, write_llm_repository  # noqa: E402
from tests.support.waiting import wait_until  # noqa: E402

MODEL = "tiny_llm"
SHORT = "tiny_short"  # the same weights with a 40-token context
SPLIT = "tiny_split"  # always generates the byte 0xE6: a character that never completes
SHORT_CONTEXT = 40


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return build_tiny_llm(tmp_path_factory.mktemp("llm_hf") / "hf")


@pytest.fixture(scope="module")
def server(tmp_path_factory, hf_dir):
    root = tmp_path_factory.mktemp("llm")
    repo = write_llm_repository(root / "repo", hf_dir)
    write_llm_repository(repo, hf_dir, name=SHORT, extra={"max_model_len": SHORT_CONTEXT})
    split = build_tiny_llm(root / "hf_split")
    force_one_token(split, "\u00e6")  # byte 0xE6 in the byte-level alphabet
    write_llm_repository(repo, split, name=SPLIT)
    with start_server(repo, "--openai-port", "0", timeout=120) as running:
        line = next(out for out in running.output if out.startswith("NAIAD_READY "))
        running.openai_port = json.loads(line.split(" ", 1)[1])["openai_port"]
        yield running


def _post(url: str, doc: dict) -> tuple[int, bytes]:
    return post_json(url, doc, timeout=60)


def _metrics(server) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as reply:
        return reply.read().decode()


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _client(server, openai_port: bool = False):
    port = server.openai_port if openai_port else server.http_port
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)


def test_generate_and_generate_stream(server):
    base = f"http://{server.http_url}/v2/models/{MODEL}"
    params = {"temperature": 0, "max_tokens": 12, "ignore_eos": True}
    status, body = _post(base + "/generate", {"text_input": "hello world", "parameters": params})
    assert status == 200, body
    doc = json.loads(body)
    assert doc["model_name"] == MODEL and doc["text_output"].startswith("hello world")
    status, body = _post(base + "/generate_stream", {"text_input": "hello world", "stream": True, "parameters": params})
    assert status == 200
    events = [json.loads(e[len("data: "):]) for e in body.decode().split("\n\n") if e.startswith("data: ")]
    assert len(events) > 1
    assert "".join(e["text_output"] for e in events) == doc["text_output"][len("hello world"):]
    status, body = _post(base + "/generate", {"text_input": "x", "parameters": {"best_of": 3}})
    assert status == 400 and b"best_of" in body


def test_openai_completions(server):
    client = _client(server)
    assert sorted(m.id for m in client.models.list().data) == sorted([MODEL, SHORT, SPLIT])
    whole = client.completions.create(model=MODEL, prompt="hello", max_tokens=10, temperature=0,
                                      extra_body={"ignore_eos": True})
    choice = whole.choices[0]
    assert choice.finish_reason == "length"
    assert whole.usage.completion_tokens == 10 and whole.usage.prompt_tokens > 0
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 10
    chunks = list(client.completions.create(model=MODEL, prompt="hello", max_tokens=10, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert chunks[-1].usage.completion_tokens == 10
    echo = client.completions.create(model=MODEL, prompt="hello", max_tokens=10, temperature=0, echo=True,
                                      extra_body={"ignore_eos": True})
    assert echo.choices[0].text == "hello" + choice.text


def test_openai_chat_on_both_ports(server):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    results = []
    for port_flag in (False, True):
        client = _client(server, openai_port=port_flag)
        whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0, n=2,
                                               extra_body={"ignore_eos": True})
        assert [c.index for c in whole.choices] == [0, 1]
        assert whole.choices[0].message.role == "assistant"
        assert whole.usage.completion_tokens == 16
        results.append(whole.choices[0].message.content)
        stream = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                                     stream=True, extra_body={"ignore_eos": True}))
        assert stream[0].choices[0].delta.role == "assistant"
        assert stream[-1].choices[0].finish_reason == "length"
        assert "".join(c.choices[0].delta.content or "" for c in stream) == whole.choices[0].message.content
    assert results[0] == results[1]


def test_raw_sse_ends_with_done(server):
    status, body = _post(f"http://{server.http_url}/v1/chat/completions",
                         {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "stream": True})
    assert status == 200
    assert body.endswith(b"data: [DONE]\n\n")


def test_stop_strings_and_seeds(server):
    client = _client(server)
    kw = {"model": MODEL, "prompt": "the quick", "max_tokens": 30, "temperature": 0, "extra_body": {"ignore_eos": True}}
    full = client.completions.create(**kw).choices[0].text
    assert len(full) > 10
    stop = full[6:9]
    cut = client.completions.create(stop=[stop], **kw).choices[0]
    assert cut.text == full[:full.find(stop)] and cut.finish_reason == "stop"
    streamed = client.completions.create(stop=stop, stream=True, **kw)
    assert "".join(c.choices[0].text for c in streamed) == cut.text
    sampled = {"model": MODEL, "prompt": "the quick", "max_tokens": 20, "temperature": 1.0, "top_p": 0.9,
               "extra_body": {"ignore_eos": True}}
    first = client.completions.create(seed=11, **sampled).choices[0].text
    assert client.completions.create(seed=11, **sampled).choices[0].text == first
    assert client.completions.create(seed=12, **sampled).choices[0].text != first


def test_openai_errors(server):
    client = _client(server)
    with pytest.raises(openai.BadRequestError, match="suffix"):
        client.completions.create(model=MODEL, prompt="x", suffix="y")
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       tools=[{"type": "function", "function": {"name": "f"}}])
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def _metrics_once_cancelled(server, before: float) -> str:
    """The metrics text once the server has counted one more cancelled request than `before`."""

    def counted() -> str | None:
        text = _metrics(server)
        return text if _metric(text, "naiad_llm_requests_finished_total", reason="cancelled") > before else None

    return wait_until(counted, "the cancelled request to be counted", timeout=10)


def test_disconnect_frees_the_slot(server):
    before = _metric(_metrics(server), "naiad_llm_requests_finished_total", reason="cancelled")
    body = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 1800, "stream": True, "temperature": 0,
                       "ignore_eos": True}).encode()
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    received = b""
    while b'"text"' not in received:
        received += sock.recv(65536)
    sock.close()
    text = _metrics_once_cancelled(server, before)
    assert _metric(text, "naiad_llm_requests_finished_total", reason="cancelled") == before + 1
    assert _metric(text, "naiad_llm_num_requests_running") == 0


def test_concurrent_streams_share_decode_steps(server):
    def occupancy() -> tuple[float, float]:
        text = _metrics(server)
        return (_metric(text, "naiad_llm_decode_batch_size_count"),
                _metric(text, "naiad_llm_decode_batch_size_bucket", le="1"))

    steps_before, single_before = occupancy()
    client = _client(server)
    outputs: dict[int, str] = {}

    def run(i: int) -> None:
        chunks = client.completions.create(model=MODEL, prompt=f"stream {i}", max_tokens=60, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        outputs[i] = "".join(c.choices[0].text for c in chunks)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(outputs) == 8
    steps_after, single_after = occupancy()
    assert steps_after - steps_before > single_after - single_before  # some decode steps ran > 1 sequence
    text = _metrics(server)
    assert _metric(text, "naiad_llm_time_to_first_token_seconds_count") > 0
    assert _metric(text, "naiad_llm_kv_cache_budget_bytes") > 0
    assert re.search(r'naiad_llm_generation_tokens_total\{model="tiny_llm",version="1"\} \d+', text)


def test_generate_stream_disconnect_cancels_the_request(server):
    before = _metric(_metrics(server), "naiad_llm_requests_finished_total", reason="cancelled")
    body = json.dumps({"text_input": "hello", "stream": True,
                       "sampling_parameters": json.dumps({"max_tokens": 1800, "ignore_eos": True, "temperature": 0})}).encode()
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    sock.sendall(f"POST /v2/models/{MODEL}/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    received = b""
    while b"text_output" not in received:
        received += sock.recv(65536)
    sock.close()
    text = _metrics_once_cancelled(server, before)
    assert _metric(text, "naiad_llm_requests_finished_total", reason="cancelled") == before + 1


def test_several_llms_load_together_and_answer_concurrently(tmp_path):
    """Four LLM models in one repository (loaded in parallel at start-up) all become READY and serve
    generate and chat requests at the same time; those that share weights answer alike."""
    first, second = build_tiny_llm(tmp_path / "hf_a", seed=0), build_tiny_llm(tmp_path / "hf_b", seed=1)
    repo = tmp_path / "repo"
    names = ("llm_a", "llm_b", "llm_c", "llm_d")
    for name, hf in zip(names, (first, second, first, second)):
        write_llm_repository(repo, hf, name=name)
    with start_server(repo, "--openai-port", "0", timeout=180) as running:
        assert not [out for out in running.output if "failed to load" in out]
        for name in names:
            with urllib.request.urlopen(f"http://{running.http_url}/v2/models/{name}/ready", timeout=10) as reply:
                assert reply.status == 200
        client = _client(running)
        assert sorted(m.id for m in client.models.list().data) == list(names)
        answers: dict[tuple[str, str], str] = {}
        errors: list[BaseException] = []

        def generate(name: str) -> None:
            status, body = _post(f"http://{running.http_url}/v2/models/{name}/generate",
                                 {"text_input": "hello world", "parameters": {"temperature": 0, "max_tokens": 20,
                                                                              "ignore_eos": True}})
            assert status == 200, body
            answers[(name, "generate")] = json.loads(body)["text_output"]

        def chat(name: str) -> None:
            reply = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hello world"}],
                                                   max_tokens=20, temperature=0, extra_body={"ignore_eos": True})
            assert reply.model == name and reply.usage.completion_tokens == 20
            answers[(name, "chat")] = reply.choices[0].message.content

        def chat_stream(name: str) -> None:
            chunks = list(client.chat.completions.create(
                model=name, messages=[{"role": "user", "content": "hello world"}], max_tokens=20, temperature=0,
                stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
            assert chunks[-1].usage.completion_tokens == 20 and not chunks[-1].choices
            answers[(name, "chat_stream")] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

        def guarded(work, name: str) -> None:
            try:
                work(name)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=guarded, args=(work, name))
                   for name in names for work in (generate, chat, chat_stream) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not errors, errors
        assert len(answers) == 12
        assert all(answers[(name, "chat_stream")] == answers[(name, "chat")] for name in names)
        assert answers[("llm_a", "generate")] == answers[("llm_c", "generate")]
        assert answers[("llm_a", "chat")] == answers[("llm_c", "chat")]
        assert answers[("llm_b", "chat")] == answers[("llm_d", "chat")]
        assert answers[("llm_a", "generate")] != answers[("llm_b", "generate")]
        assert running.process.poll() is None


def test_chat_without_max_tokens_generates_to_the_context_limit(server):
    """OpenAI's chat has no max_tokens default: generation runs to EOS or the context (here 40 tokens)."""
    client = _client(server)
    reply = client.chat.completions.create(model=SHORT, messages=[{"role": "user", "content": "hi"}], temperature=0,
                                           extra_body={"ignore_eos": True})
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == SHORT_CONTEXT - reply.usage.prompt_tokens > 16
    streamed = list(client.chat.completions.create(model=SHORT, messages=[{"role": "user", "content": "hi"}],
                                                   temperature=0, stream=True, stream_options={"include_usage": True},
                                                   extra_body={"ignore_eos": True}))
    assert streamed[-1].usage.completion_tokens == reply.usage.completion_tokens
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == reply.choices[0].message.content
    # legacy completions keep OpenAI's and vLLM's default of 16; an explicit null lifts it
    assert client.completions.create(model=SHORT, prompt="hi", temperature=0,
                                     extra_body={"ignore_eos": True}).usage.completion_tokens == 16
    unlimited = client.completions.create(model=SHORT, prompt="hi", temperature=0, max_tokens=None,
                                          extra_body={"ignore_eos": True, "max_tokens": None})
    assert unlimited.usage.completion_tokens == SHORT_CONTEXT - unlimited.usage.prompt_tokens


def test_completions_take_lists_of_prompts_and_token_ids(server, hf_dir):
    from transformers import AutoTokenizer

    client = _client(server)
    kw = {"model": MODEL, "max_tokens": 6, "temperature": 0, "extra_body": {"ignore_eos": True}}
    single = {p: client.completions.create(prompt=p, **kw) for p in ("hello world", "the quick")}
    both = client.completions.create(prompt=["hello world", "the quick"], n=2, **kw)
    assert [c.index for c in both.choices] == [0, 1, 2, 3]  # choice p * n + i
    assert [c.text for c in both.choices] == [single["hello world"].choices[0].text] * 2 + \
        [single["the quick"].choices[0].text] * 2
    assert both.usage.prompt_tokens == sum(r.usage.prompt_tokens for r in single.values())
    assert both.usage.completion_tokens == 4 * 6
    streamed: dict[int, str] = {}
    for chunk in client.completions.create(prompt=["hello world", "the quick"], stream=True, **kw):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    assert streamed == {0: both.choices[0].text, 1: both.choices[2].text}
    ids = AutoTokenizer.from_pretrained(hf_dir).encode("hello world")
    by_ids = client.completions.create(prompt=ids, **kw)
    assert by_ids.choices[0].text == single["hello world"].choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)
    many = client.completions.create(prompt=[ids, ids[:1]], **kw)
    assert [c.index for c in many.choices] == [0, 1] and many.choices[0].text == by_ids.choices[0].text
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        client.completions.create(prompt=[10 ** 6], **kw)
    with pytest.raises(openai.BadRequestError, match="'prompt' must be"):
        client.completions.create(prompt=["a", 1], **kw)
    again = client.completions.create(prompt="hello world", **kw)  # the server still serves
    assert again.choices[0].text == single["hello world"].choices[0].text


def test_unknown_model_is_404_with_openai_error_object(server):
    client = _client(server)
    for call in (lambda: client.completions.create(model="nope", prompt="x"),
                 lambda: client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}]),
                 lambda: client.models.retrieve("nope")):
        with pytest.raises(openai.NotFoundError) as caught:
            call()
        assert caught.value.status_code == 404 and caught.value.code == "model_not_found"
        assert caught.value.param == "model" and "`nope` does not exist" in caught.value.message
    status, body = _post(f"http://{server.http_url}/v1/completions", {"model": "nope", "prompt": "x"})
    error = json.loads(body)["error"]
    assert status == 404 and error["type"] == "invalid_request_error" and error["code"] == "model_not_found"
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=2).usage.completion_tokens == 2


def test_openai_route_table_methods_and_unknown_paths(server):
    def status_of(method: str, path: str) -> tuple[int, dict]:
        request = urllib.request.Request(f"http://127.0.0.1:{server.openai_port}{path}", method=method,
                                         data=b"{}" if method == "POST" else None)
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    for method, path in (("POST", "/v1/models"), ("POST", f"/v1/models/{MODEL}"), ("GET", "/v1/completions"),
                         ("GET", "/v1/chat/completions/")):
        status, body = status_of(method, path)
        assert status == 405 and body["error"]["message"] == "Method Not Allowed", (method, path)
    assert status_of("GET", "/v1/nothing")[0] == 404
    assert status_of("GET", "/v1/health/ready") == (200, {}) == status_of("POST", "/health/ready/")
    status, body = status_of("GET", f"/v1/models/{MODEL}/")
    assert status == 200 and body["id"] == MODEL

def test_text_accounts_for_every_counted_token(server):
    """A model that only ever emits the byte 0xE6 (a character's first byte, never completed): each byte is
    text (U+FFFD, as decoding gives), where it used to be held back and dropped while usage counted it."""
    client = _client(server)
    whole = client.completions.create(model=SPLIT, prompt="hello", max_tokens=5, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert whole.usage.completion_tokens == 5
    assert whole.choices[0].text == "\ufffd" * 5
    chunks = list(client.completions.create(model=SPLIT, prompt="hello", max_tokens=5, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    chat = client.chat.completions.create(model=SPLIT, messages=[{"role": "user", "content": "x"}], max_tokens=3,
                                          temperature=0, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.content == "\ufffd" * 3 and chat.usage.completion_tokens == 3


def test_llms_loaded_at_once_through_the_repository_api_while_another_streams(tmp_path):
    """Explicit mode: two LLMs loaded by concurrent load calls both become READY while a third, already
    loaded, keeps streaming without a gap in its answer."""
    hf = build_tiny_llm(tmp_path / "hf")
    repo = tmp_path / "repo"
    for name in ("llm_a", "llm_b", "llm_c"):
        write_llm_repository(repo, hf, name=name)
    with start_server(repo, "--model-control-mode=explicit", "--load-model=llm_a", timeout=180) as running:
        client = _client(running)
        streamed: list[str] = []
        loads: dict[str, int] = {}

        def stream() -> None:
            for chunk in client.completions.create(model="llm_a", prompt="hello", max_tokens=300, temperature=0,
                                                   stream=True, extra_body={"ignore_eos": True}):
                streamed.append(chunk.choices[0].text)

        def load(name: str) -> None:
            loads[name] = _post(f"http://{running.http_url}/v2/repository/models/{name}/load", {})[0]

        streaming = threading.Thread(target=stream)
        streaming.start()
        loaders = [threading.Thread(target=load, args=(name,)) for name in ("llm_b", "llm_c")]
        for thread in loaders:
            thread.start()
        for thread in loaders + [streaming]:
            thread.join(120)
        assert loads == {"llm_b": 200, "llm_c": 200}
        whole = client.completions.create(model="llm_a", prompt="hello", max_tokens=300, temperature=0,
                                          extra_body={"ignore_eos": True})
        assert "".join(streamed) == whole.choices[0].text and whole.usage.completion_tokens == 300
        answers = {name: client.completions.create(model=name, prompt="hello", max_tokens=8, temperature=0,
                                                   extra_body={"ignore_eos": True}).choices[0].text
                   for name in ("llm_a", "llm_b", "llm_c")}
        assert len(set(answers.values())) == 1  # the same weights loaded three times answer alike
