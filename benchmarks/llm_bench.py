"""LLM serving speed: Naiad's transformers backend under 16 streaming clients vs `transformers` generate, one at a time.

One run, interleaved round by round, on a random-weight Llama-layout model this script builds
(hidden 256, 4 layers by default; tokenizer trained here; nothing downloaded):

- **baseline**: prompts from the same set served one at a time in-process with `model.generate`
  (greedy, exactly `--osl` new tokens each, detokenized), pinned to the server core, one torch thread;
- **naiad c=1**: `naiad genai-perf` with one streaming client (the single-client TTFT);
- **naiad c=N**: `naiad genai-perf` with N concurrent streaming clients (default 16);
- with `--compare-src DIR`, the same two cells against a second server running the Naiad sources
  in DIR (e.g. `git archive HEAD src | tar -x -C before` -> `before/src`).

The servers run under `taskset -c <server core>` with OMP_NUM_THREADS=1, genai-perf under
`taskset -c <client core>`. Every request asks for exactly `--osl` tokens (`ignore_eos`), so
tokens/s is requests/s x osl (re-tokenizing random-weight text does not round-trip). Besides
wall-clock figures, `tok/CPU-s` divides tokens by the CPU seconds the server (or baseline)
process got, which stays meaningful when other work shares the cores.

    .venv/bin/python benchmarks/llm_bench.py                       # ~6 min
    .venv/bin/python benchmarks/llm_bench.py --rounds 3 --output benchmarks/results/llm.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODEL = "bench_llm"


def build_model(directory: Path, hidden: int, layers: int, heads: int, vocab: int) -> Path:
    """A Llama-layout causal LM with random weights and a byte-level BPE tokenizer trained on genai-perf's words."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    sys.path.insert(0, str(ROOT / "src"))
    from naiad.tools.llm.prompts import WORDS

    directory.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))]
    bpe.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                        unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    tokenizer.save_pretrained(directory)
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=bpe.get_vocab_size(), hidden_size=hidden, intermediate_size=hidden * 4,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                         max_position_embeddings=2048, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = eos
    model.save_pretrained(directory)
    return directory


def write_repository(repo: Path, hf_dir: Path, batched_tokens: int | None) -> Path:
    version = repo / MODEL / "1"
    version.mkdir(parents=True, exist_ok=True)
    (repo / MODEL / "config.pbtxt").write_text('backend: "transformers"\n')
    settings = {"model": str(hf_dir), "kv_cache_bytes": 256 << 20}
    if batched_tokens:
        settings["max_num_batched_tokens"] = batched_tokens
    (version / "model.json").write_text(json.dumps(settings))
    return repo


def start_server(repo: Path, core: str, log_path: Path, src: str | None = None) -> tuple[subprocess.Popen, int]:
    cmd = ["taskset", "-c", core, sys.executable, "-m", "naiad", "serve", "--model-repository", str(repo),
           "--http-address", "127.0.0.1", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    if src:  # another checkout's sources (e.g. `git archive` of an older commit) ahead of the installed ones
        env["PYTHONPATH"] = src
    log = log_path.open("w")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=ROOT)
    assert proc.stdout is not None
    deadline = time.monotonic() + 180
    for line in proc.stdout:
        if line.startswith("NAIAD_READY "):
            port = json.loads(line.split(" ", 1)[1])["http_port"]
            # keep draining stdout so the server never blocks on a full pipe
            threading.Thread(target=lambda: [log.write(rest) for rest in proc.stdout], daemon=True).start()
            return proc, port
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise RuntimeError(f"the server did not start; see {log_path}")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (and its reaped children) from /proc: the CPU it got, whatever else ran."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def genai_perf(port: int, core: str, concurrency: int, args: argparse.Namespace, tokenizer: Path, out: Path,
               server_pid: int) -> dict:
    requests = args.requests if concurrency > 1 else args.single_requests
    warmup = min(concurrency, 4) if concurrency > 1 else 2
    cmd = ["taskset", "-c", core, sys.executable, "-m", "naiad", "genai-perf", "profile", "-m", MODEL,
           "--endpoint-type", "generate", "--streaming", "-u", f"127.0.0.1:{port}",
           "--concurrency", str(concurrency), "--request-count", str(requests),
           "--warmup-request-count", str(warmup),
           "--synthetic-input-tokens-mean", str(args.isl), "--synthetic-input-tokens-stddev", "0",
           "--output-tokens-mean", str(args.osl), "--num-dataset-entries", str(args.requests),
           "--extra-inputs", "stream:true", "--extra-inputs", "ignore_eos:true", "--extra-inputs", "temperature:0",
           "--tokenizer", str(tokenizer), "--artifact-dir", str(out), "--random-seed", "7"]
    cpu_before = cpu_seconds(server_pid)
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
    server_cpu = cpu_seconds(server_pid) - cpu_before
    if result.returncode != 0:
        raise RuntimeError(f"genai-perf failed:\n{result.stdout}\n{result.stderr}")
    doc = json.loads((out / "profile_export_genai_perf.json").read_text())
    if doc["error_count"]["avg"]:
        raise RuntimeError(f"genai-perf saw {doc['error_count']['avg']} errors")
    # Every request yields exactly --osl tokens (ignore_eos), so count tokens from that rather than by
    # re-tokenizing random-weight text (which does not round-trip); ITL per request from its event times.
    raw = json.loads((out / "profile_export.json").read_text())["requests"]
    itls = sorted((r["end_timestamp"] - r["response_timestamps"][0]) / 1e6 / (args.osl - 1)
                  for r in raw if r["response_timestamps"] and not r["error"])
    return {
        "tokens_per_s": doc["request_throughput"]["avg"] * args.osl,
        "ttft_p50_ms": doc["time_to_first_token"]["p50"], "ttft_p99_ms": doc["time_to_first_token"]["p99"],
        "itl_p50_ms": statistics.median(itls), "itl_p99_ms": itls[min(len(itls) - 1, int(len(itls) * 0.99))],
        "genai_perf_output_token_throughput": doc["output_token_throughput"]["avg"],
        "requests": doc["request_count"]["avg"], "duration_s": doc["benchmark_duration"]["avg"],
        # all requests of the run (warm-up included) over the server's CPU seconds in it
        "tokens_per_cpu_s": (doc["request_count"]["avg"] + warmup) * args.osl / max(server_cpu, 1e-9),
    }


def run_baseline(hf_dir: Path, inputs: Path, osl: int, core: str, count: int) -> dict:
    cmd = ["taskset", "-c", core, sys.executable, str(Path(__file__).resolve()), "--_baseline", str(hf_dir),
           str(inputs), str(osl), str(count)]
    result = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"baseline failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def baseline_main(hf_dir: str, inputs: str, osl: int, count: int) -> None:
    """One request at a time: tokenize, model.generate (greedy, exactly `osl` tokens), detokenize."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, local_files_only=True, dtype=torch.float32).eval()
    prompts = [entry["text"] for entry in json.loads(Path(inputs).read_text())["data"]][:count]
    kwargs = dict(max_new_tokens=osl, min_new_tokens=osl, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    with torch.inference_mode():  # warm-up
        model.generate(**tokenizer(prompts[0], return_tensors="pt"), **kwargs)
    ttfts, tokens = [], 0
    start = time.perf_counter()
    with torch.inference_mode():
        for prompt in prompts:
            begin = time.perf_counter()
            encoded = tokenizer(prompt, return_tensors="pt")
            model.generate(**encoded, max_new_tokens=1, do_sample=False, pad_token_id=tokenizer.eos_token_id)
            ttfts.append(time.perf_counter() - begin)
    ttft_time = time.perf_counter() - start
    start, cpu_start = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for prompt in prompts:
            encoded = tokenizer(prompt, return_tensors="pt")
            out = model.generate(**encoded, **kwargs)
            tokenizer.decode(out[0, encoded["input_ids"].shape[1]:], skip_special_tokens=True)
            tokens += out.shape[1] - encoded["input_ids"].shape[1]
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    print(json.dumps({"tokens_per_s": tokens / elapsed, "tokens_per_cpu_s": tokens / cpu, "requests": len(prompts),
                      "tokens": tokens,
                      "seconds": elapsed, "ttft_p50_ms": statistics.median(ttfts) * 1000,
                      "ttft_pass_seconds": ttft_time}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--isl", type=int, default=128, help="prompt tokens")
    parser.add_argument("--osl", type=int, default=64, help="output tokens per request")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=96,
                        help="requests at c=N (the first N start together; more requests weigh steady state more)")
    parser.add_argument("--single-requests", type=int, default=12, help="requests at c=1")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-num-batched-tokens", type=int, help="model.json setting (default: the backend's)")
    parser.add_argument("--server-core", default="0")
    parser.add_argument("--client-core", default="1")
    parser.add_argument("--output", help="write every round as JSON")
    parser.add_argument("--keep-workdir", action="store_true")
    parser.add_argument("--compare-src", help="also serve with Naiad sources from this src/ directory, same rounds")
    parser.add_argument("--baseline-prompts", type=int, default=32, help="prompts the baseline serves (a rate)")
    parser.add_argument("--_baseline", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._baseline:
        baseline_main(args._baseline[0], args._baseline[1], int(args._baseline[2]), int(args._baseline[3]))
        return
    if shutil.which("taskset") is None:
        parser.error("taskset (util-linux) is needed to pin the server and the load generator")
    work = Path(tempfile.mkdtemp(prefix="naiad-llm-bench-"))
    hf_dir = build_model(work / "hf", args.hidden, args.layers, args.heads, args.vocab)
    repo = write_repository(work / "repo", hf_dir, args.max_num_batched_tokens)
    servers = {"naiad": start_server(repo, args.server_core, work / "server.log")}
    if args.compare_src:
        servers["compare"] = start_server(repo, args.server_core, work / "compare.log", args.compare_src)
    rounds = []
    try:
        for index in range(args.rounds):
            row: dict[str, dict] = {}
            for label, (server, port) in servers.items():
                out = work / f"{label}-{index}"
                row[f"{label}_c1"] = genai_perf(port, args.client_core, 1, args, hf_dir, out / "c1", server.pid)
                row[f"{label}_c{args.clients}"] = genai_perf(port, args.client_core, args.clients, args, hf_dir,
                                                             out / "cN", server.pid)
            row["baseline"] = run_baseline(hf_dir, work / f"naiad-{index}" / "cN" / "inputs.json", args.osl,
                                           args.server_core, args.baseline_prompts)
            rounds.append(row)
            print(f"round {index + 1}: " + json.dumps(row), flush=True)
    finally:
        for server, _ in servers.values():
            server.terminate()
            server.wait(30)
        if not args.keep_workdir:
            shutil.rmtree(work, ignore_errors=True)
    report(rounds, args)


def report(rounds: list[dict], args: argparse.Namespace) -> None:
    def med(kind: str, key: str) -> float:
        return statistics.median(r[kind][key] for r in rounds)

    print(f"\nmodel: llama hidden={args.hidden} layers={args.layers} heads={args.heads}; isl={args.isl} osl={args.osl}; "
          f"{args.rounds} rounds, medians; tok/CPU-s = tokens per CPU second the server (or baseline) process used")
    print(f"{'':16}{'tokens/s':>10}{'tok/CPU-s':>10}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>10}{'ITL p99':>10}")
    for kind in rounds[0]:
        cells = [med(kind, "tokens_per_s"), med(kind, "tokens_per_cpu_s")]
        cells += [med(kind, k) if k in rounds[0][kind] else float("nan")
                  for k in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")]
        print(f"{kind:16}" + "".join(f"{c:10.1f}" for c in cells))
    for label in ("naiad", "compare") if args.compare_src else ("naiad",):
        many, one = f"{label}_c{args.clients}", f"{label}_c1"
        print(f"{label}: c={args.clients} / baseline tokens/s {med(many, 'tokens_per_s') / med('baseline', 'tokens_per_s'):.2f}x"
              f" (goal >= 4), per CPU second {med(many, 'tokens_per_cpu_s') / med('baseline', 'tokens_per_cpu_s'):.2f}x;"
              f" TTFT p50 c={args.clients} / c=1 {med(many, 'ttft_p50_ms') / med(one, 'ttft_p50_ms'):.2f}x (goal <= 3)")
    if args.output:
        Path(args.output).write_text(json.dumps({"settings": vars(args), "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
