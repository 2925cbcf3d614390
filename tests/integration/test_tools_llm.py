"""`naiad genai-perf` / `naiad perf --llm`: against a streaming stand-in for an LLM server (generate_stream and
OpenAI endpoints, tokens 5 ms apart) and against the real Naiad generate_stream."""

import asyncio
import csv
import json
import subprocess
import sys
import threading
import time

import pytest

from naiad.tools.llm import client as client_module
from naiad.tools.llm.options import LlmOptions
from naiad.tools.llm.profile import run_profile
from tests.support.onnx_models import identity_model
from tests.support.servers import start_server

TOKENS = ["alpha", " beta", " gamma", " delta", " epsilon", " zeta"]
TOKEN_GAP_S = 0.005
FIRST_TOKEN_S = 0.02


def _event(path: str, token: str) -> dict:
    if path.endswith("generate_stream"):
        return {"model_name": "llm", "model_version": "1", "text_output": token}
    if path == "/v1/completions":
        return {"object": "text_completion", "choices": [{"index": 0, "text": token}]}
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": token}}]}


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """HTTP/1.1 keep-alive; each POST answers with chunked Server-Sent Events, one token per event."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            path = lines[0].split(" ")[1]
            length = next(int(ln.split(":")[1]) for ln in lines if ln.lower().startswith("content-length"))
            body = json.loads(await reader.readexactly(length))
            count = min(int(body.get("max_tokens", len(TOKENS))), len(TOKENS))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            await asyncio.sleep(FIRST_TOKEN_S)
            for i in range(count):
                if i:
                    await asyncio.sleep(TOKEN_GAP_S)
                data = f"data: {json.dumps(_event(path, TOKENS[i]))}\n\n".encode()
                writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                await writer.drain()
            if path.startswith("/v1/"):
                done = b"data: [DONE]\n\n"
                writer.write(f"{len(done):x}\r\n".encode() + done + b"\r\n")
            writer.write(b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


@pytest.fixture(scope="module")
def fake_llm():
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder = {}

    def serve() -> None:
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(asyncio.start_server(_handle, "127.0.0.1", 0))
        holder["port"] = server.sockets[0].getsockname()[1]
        started.set()
        loop.run_forever()
        server.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10)
    yield f"127.0.0.1:{holder['port']}"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.mark.parametrize("endpoint", ["generate", "completions", "chat"])
def test_streaming_metrics_against_each_endpoint(fake_llm, endpoint, tmp_path):
    options = LlmOptions(model="llm", endpoint_type=endpoint, url=fake_llm, streaming=True, concurrency=2,
                         request_count=8, input_tokens_mean=30, output_tokens_mean=5, artifact_dir=str(tmp_path))
    metrics = run_profile(options, out=open(tmp_path / "log.txt", "w"))
    assert metrics.request_count == 8 and metrics.error_count == 0
    ttft = metrics.per_request["time_to_first_token"]
    assert ttft["min"] >= FIRST_TOKEN_S * 1000 * 0.9
    itl = metrics.per_request["inter_token_latency"]
    assert TOKEN_GAP_S * 1000 * 0.8 <= itl["avg"] <= 50  # about 5 ms apart, bounded above for a busy machine
    assert metrics.per_request["output_sequence_length"]["avg"] == 5  # "alpha beta gamma delta epsilon"
    assert metrics.per_request["input_sequence_length"]["avg"] == 30
    assert metrics.output_token_throughput == pytest.approx(metrics.request_throughput * 5)
    doc = json.loads((tmp_path / "profile_export_genai_perf.json").read_text())
    assert doc["time_to_first_token"]["unit"] == "ms" and doc["request_count"]["avg"] == 8
    rows = list(csv.reader((tmp_path / "profile_export_genai_perf.csv").open()))
    assert rows[0] == ["Metric", "avg", "min", "max", "p99", "p95", "p90", "p75", "p50", "p25"]
    assert rows[1][0] == "Time To First Token (ms)"
    assert ["Request Throughput (per sec)"] == [r[0] for r in rows if r and r[0].startswith("Request Throughput")]
    raw = json.loads((tmp_path / "profile_export.json").read_text())["requests"]
    assert len(raw) == 8 and all(len(r["response_timestamps"]) == 5 for r in raw)


def test_event_timestamps_do_not_wait_for_the_clients_own_decoding(fake_llm, tmp_path, monkeypatch):
    """Events are timed when their bytes arrive, whatever the client spends decoding them: here 10 ms per
    event, at concurrency 4, against tokens 5 ms apart. Decoding while the streams run timed each event
    after the decoding of every event queued before it (inter-token latency ~40 ms, first tokens late)."""
    real_parse = client_module.parse_event

    def slow_parse(data: str):
        time.sleep(0.01)  # the client's decoding cost this test simulates
        return real_parse(data)

    monkeypatch.setattr(client_module, "parse_event", slow_parse)
    options = LlmOptions(model="llm", endpoint_type="generate", url=fake_llm, streaming=True, concurrency=4,
                         request_count=8, input_tokens_mean=30, output_tokens_mean=6, artifact_dir=str(tmp_path))
    metrics = run_profile(options, out=open(tmp_path / "log.txt", "w"))
    assert metrics.request_count == 8 and metrics.error_count == 0
    assert metrics.per_request["output_sequence_length"]["avg"] == 6
    # generous bounds for a busy machine, yet well below what decoding in the loop gave
    assert TOKEN_GAP_S * 1000 * 0.8 <= metrics.per_request["inter_token_latency"]["avg"] <= 15
    ttft = metrics.per_request["time_to_first_token"]
    assert FIRST_TOKEN_S * 1000 * 0.9 <= ttft["min"] and ttft["avg"] <= FIRST_TOKEN_S * 1000 + 15


def test_cli_perf_llm_against_naiad_generate(tmp_path):
    repo = tmp_path / "repo"
    identity_model(repo, "text", "BYTES", [1], max_batch_size=0)
    with start_server(repo) as running:
        done = subprocess.run(
            [sys.executable, "-m", "naiad", "perf", "--llm", "-m", "text", "-u", running.http_url,
             "--input-name", "INPUT0", "--output-name", "OUTPUT0", "--request-count", "10", "--concurrency", "2",
             "--synthetic-input-tokens-mean", "12", "--artifact-dir", str(tmp_path / "art")],
            capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "Request Latency (ms)" in done.stdout and "Request Throughput (per sec)" in done.stdout
    assert "Time To First Token (ms)" not in done.stdout  # one answer per request: nothing streamed to time
    doc = json.loads((tmp_path / "art" / "profile_export_genai_perf.json").read_text())
    assert doc["request_count"]["avg"] == 10
    # the identity model echoes the prompt: output length == input length
    assert doc["output_sequence_length"]["avg"] == doc["input_sequence_length"]["avg"] == 12


def test_unreachable_server_fails_cleanly(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "naiad", "genai-perf", "profile", "-m", "x", "-u", "127.0.0.1:9", "--request-count", "2",
         "--artifact-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].startswith("naiad genai-perf: error: all 2 requests failed")
    assert "cannot connect to 127.0.0.1:9" in done.stderr


def test_bad_inputs_are_one_error_line(tmp_path):
    bad_json = tmp_path / "prompts.jsonl"
    bad_json.write_text('{"text": "fine"}\nnot json\n')
    cases = [
        (["--tokenizer", str(tmp_path / "absent")], "--tokenizer " + str(tmp_path / "absent") + ": no such directory"),
        (["--input-file", str(tmp_path / "absent.jsonl")], "No such file or directory"),
        (["--input-file", str(bad_json)], "prompts.jsonl:2: not a JSON object"),
    ]
    for args, message in cases:
        done = subprocess.run([sys.executable, "-m", "naiad", "genai-perf", "-m", "x", "-u", "127.0.0.1:9", *args,
                               "--request-count", "1", "--artifact-dir", str(tmp_path / "art")],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (args, done.stderr)
        errors = [line for line in done.stderr.splitlines() if ": error: " in line]
        assert len(errors) == 1 and errors[0].startswith("naiad genai-perf: error: ") and message in errors[0], errors
