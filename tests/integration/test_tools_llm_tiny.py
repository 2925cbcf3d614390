"""`naiad genai-perf` against the real server serving a tiny transformers LLM: streamed generate, prompts
sized in the tokenizer's tokens, and runs that cannot measure what was asked."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.support.onnx_models import identity_model
from tests.support.servers import start_server
from tests.support.tiny_llm import build_tiny_llm, write_llm_repository

MODEL = "tiny_llm"


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    root = tmp_path_factory.mktemp("llm")
    hf = build_tiny_llm(root / "hf")
    repo = write_llm_repository(root / "repo", hf)
    identity_model(repo, "echo", "BYTES", [1], max_batch_size=0)
    with start_server(repo, timeout=120) as running:
        running.tokenizer = str(hf)
        yield running


def _genai_perf(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "naiad", "genai-perf", *args], capture_output=True, text=True,
                          timeout=240)


def test_generate_streaming_streams_tokens(llm, tmp_path):
    done = _genai_perf("-m", MODEL, "-u", llm.http_url, "--endpoint-type", "generate", "--streaming",
                       "--tokenizer", llm.tokenizer, "--synthetic-input-tokens-mean", "16", "--output-tokens-mean", "8",
                       "--extra-inputs", "ignore_eos:true", "--request-count", "4", "--artifact-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    raw = json.loads((tmp_path / "profile_export.json").read_text())["requests"]
    assert len(raw) == 4 and all(not r["error"] for r in raw)
    assert all(len(r["response_timestamps"]) > 1 for r in raw)  # one event per token, not one answer
    doc = json.loads((tmp_path / "profile_export_genai_perf.json").read_text())
    assert doc["time_to_first_token"]["avg"] < doc["request_latency"]["avg"]
    assert doc["inter_token_latency"]["avg"] > 0
    # The 16-token prompt is not echoed: no answer's text contains its request's prompt.
    prompts = [entry["text"] for entry in json.loads((tmp_path / "inputs.json").read_text())["data"]]
    for request in raw:
        answer = "".join(str(text) for text in request["response_outputs"])
        assert prompts[request["prompt_index"]] not in answer
    # 8 tokens generated; re-tokenizing the random model's text splits some (a partial UTF-8 byte
    # becomes U+FFFD, several tokens long), so the count measured back is 8 to about twice that.
    assert 4 <= doc["output_sequence_length"]["avg"] <= 24


def test_prompts_are_sized_in_tokenizer_tokens(llm, tmp_path):
    from transformers import AutoTokenizer

    done = _genai_perf("-m", MODEL, "-u", llm.http_url, "--tokenizer", llm.tokenizer,
                       "--synthetic-input-tokens-mean", "64", "--output-tokens-mean", "2", "--request-count", "3",
                       "--num-dataset-entries", "5", "--artifact-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    tokenizer = AutoTokenizer.from_pretrained(llm.tokenizer)
    prompts = json.loads((tmp_path / "inputs.json").read_text())["data"]
    assert [len(tokenizer.encode(p["text"], add_special_tokens=False)) for p in prompts] == [64] * 5
    assert json.loads((tmp_path / "profile_export_genai_perf.json").read_text())["input_sequence_length"]["avg"] == 64


def test_streaming_a_model_with_one_response_is_refused(llm, tmp_path):
    done = _genai_perf("-m", "echo", "-u", llm.http_url, "--streaming", "--input-name", "INPUT0",
                       "--output-name", "OUTPUT0", "--request-count", "2", "--artifact-dir", str(tmp_path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if ": error: " in line]
    assert errors and errors[0].startswith("naiad genai-perf: error: --streaming: model 'echo' is not decoupled")
    assert len(errors) == 1 and done.stderr.splitlines()[-1] == errors[0]


def test_a_run_whose_requests_all_fail_exits_non_zero(llm, tmp_path):
    # 3000 tokens do not fit the model's context: the server refuses every request
    done = _genai_perf("-m", MODEL, "-u", llm.http_url, "--tokenizer", llm.tokenizer,
                       "--synthetic-input-tokens-mean", "3000", "--request-count", "2", "--artifact-dir", str(tmp_path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "naiad genai-perf: error: all 2 requests failed" in done.stderr
    assert "Time To First Token" not in done.stdout and "Request Latency" not in done.stdout
