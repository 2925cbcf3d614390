"""GenAI-Perf metrics from timestamped requests, synthetic prompts, and the SSE/endpoint parsing."""

import pytest

from naiad.tools.llm.client import RequestRecord
from naiad.tools.llm.endpoints import EndpointSpec, EventError, SseDecoder, parse_event
from naiad.tools.llm.metrics import compute_metrics
from naiad.tools.llm.prompts import Prompt, synthetic_prompts
from naiad.tools.llm.tokenizer import ApproximateTokenizer

approximate_token_count = ApproximateTokenizer().count

MS = 1_000_000


def record(index, start_ms, event_ms, end_ms, texts):
    return RequestRecord(index, start_ms * MS, end_ms * MS, [t * MS for t in event_ms], texts)


def test_ttft_itl_and_throughputs():
    prompts = [Prompt("a b c", 3, 4), Prompt("d e", 2, 4)]
    records = [
        record(0, 0, [10, 20, 30, 40], 40, ["one", " two", " three", " four"]),
        record(1, 5, [25, 30, 35, 40], 45, ["x", " y", " z", " w"]),
    ]
    m = compute_metrics(records, prompts, streaming=True, count_tokens=approximate_token_count)
    ttft = m.per_request["time_to_first_token"]
    assert (ttft["min"], ttft["max"], ttft["avg"]) == (10.0, 20.0, 15.0)
    assert m.per_request["time_to_second_token"]["avg"] == pytest.approx(7.5)
    # ITL = (latency - TTFT) / (tokens - 1): (40-10)/3 = 10 and (40-20)/3
    assert m.per_request["inter_token_latency"]["min"] == pytest.approx(20 / 3)
    assert m.per_request["inter_token_latency"]["max"] == pytest.approx(10.0)
    assert m.per_request["output_sequence_length"]["avg"] == 4
    assert m.per_request["input_sequence_length"]["avg"] == 2.5
    assert m.duration_s == pytest.approx(0.045)
    assert m.request_throughput == pytest.approx(2 / 0.045)
    assert m.output_token_throughput == pytest.approx(8 / 0.045)
    # (tokens - 1) / (end - first token): 3 / 30 ms and 3 / 20 ms
    assert m.per_request["output_token_throughput_per_user"]["min"] == pytest.approx(3 / 0.030)
    assert m.per_request["output_token_throughput_per_user"]["max"] == pytest.approx(3 / 0.020)


def test_errors_are_counted_not_measured():
    records = [record(0, 0, [1], 2, ["a"]), RequestRecord(0, 0, 5, error="HTTP 500: boom")]
    m = compute_metrics(records, [Prompt("p", 1, None)], streaming=False, count_tokens=approximate_token_count)
    assert (m.request_count, m.error_count, m.first_error) == (1, 1, "HTTP 500: boom")
    assert "time_to_first_token" not in m.per_request  # needs streaming


def test_synthetic_prompt_lengths():
    prompts = synthetic_prompts(50, 100, 0, 20, 5, seed=1)
    assert all(p.input_tokens == 100 for p in prompts)
    assert all(p.max_tokens >= 1 for p in prompts) and len({p.max_tokens for p in prompts}) > 3
    varied = synthetic_prompts(200, 100, 20, -1, 0, seed=2)
    mean = sum(p.input_tokens for p in varied) / 200
    assert 90 < mean < 110 and all(p.max_tokens is None for p in varied)


def test_sse_and_endpoint_parsing():
    decoder = SseDecoder()
    assert decoder.feed(b'data: {"text_output": "a"}\n') == []
    assert decoder.feed(b'\ndata: [DONE]\r\n\r\n') == ['{"text_output": "a"}', "[DONE]"]
    assert parse_event("[DONE]") is None
    with pytest.raises(EventError, match="bad"):
        parse_event('{"error": "bad"}')
    chat = EndpointSpec("chat", "m", streaming=True)
    assert chat.path() == "/v1/chat/completions"
    assert chat.text_of({"choices": [{"delta": {"content": "hi"}}]}) == "hi"
    assert chat.body(Prompt("p", 1, 8))["messages"] == [{"role": "user", "content": "p"}]
    completions = EndpointSpec("completions", "m", streaming=False)
    assert completions.text_of({"choices": [{"text": "yo"}]}) == "yo"
    generate = EndpointSpec("generate", "m", True, extra_inputs={"temperature": 0.1})
    assert generate.path() == "/v2/models/m/generate_stream"
    assert generate.body(Prompt("p", 1, 4)) == {"text_input": "p", "stream": True, "max_tokens": 4, "temperature": 0.1}
    assert generate.text_of({"text_output": ["a", "b"]}) == "ab"
