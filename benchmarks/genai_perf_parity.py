"""`naiad genai-perf` against NVIDIA's GenAI-Perf (PyPI `genai-perf`) on the same server: TTFT and ITL.

Both tools stream the same kind of request (`POST /v2/models/<m>/generate_stream` with
`"stream": true`, prompts of exactly --isl tokens of the model's tokenizer, --osl tokens asked with
`ignore_eos`), turn by turn, round after round, at each concurrency. The table gives each metric's
median over the rounds and naiad / genai-perf; the bar is within 15%.

GenAI-Perf drives perf_analyzer, so both must be installed; for instance, in a venv of their own:

    python -m venv gp-venv && gp-venv/bin/pip install genai-perf==0.0.16
    naiad serve --model-repository llm_repo &          # a decoupled LLM model, e.g. transformers
    PATH=<dir of perf_analyzer>:$PATH python benchmarks/genai_perf_parity.py \\
        --genai-perf gp-venv/bin/genai-perf --model tiny_llm --tokenizer hf_dir --rounds 6 \\
        --metrics-url http://127.0.0.1:8002/metrics

GenAI-Perf 0.0.16's `--endpoint-type generate` posts to `/generate` even with `--streaming`,
which a decoupled model answers with an error; `--endpoint v2/models/<m>/generate_stream` is
passed to make it stream.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

METRICS = [("time_to_first_token", "TTFT"), ("inter_token_latency", "ITL")]
STATS = ["avg", "p50"]
# the server's own histograms (Naiad's LLM backends), read before and after each run
SERVER_METRICS = {"time_to_first_token": "naiad_llm_time_to_first_token_seconds",
                  "inter_token_latency": "naiad_llm_inter_token_latency_seconds"}


def server_sums(metrics_url: str) -> dict[str, tuple[float, float]]:
    """metric -> (sum in seconds, count) over every model, from the Prometheus text."""
    with urllib.request.urlopen(metrics_url, timeout=10) as reply:
        text = reply.read().decode()
    sums = {}
    for key, name in SERVER_METRICS.items():
        values = {}
        for suffix in ("_sum", "_count"):
            values[suffix] = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                                 if line.startswith(name + suffix + "{") or line.startswith(name + suffix + " "))
        sums[key] = (values["_sum"], values["_count"])
    return sums


def server_avg_ms(before: dict, after: dict, key: str) -> float:
    seconds, count = (after[key][0] - before[key][0]), (after[key][1] - before[key][1])
    return 1000.0 * seconds / count if count else float("nan")


def _common(args: argparse.Namespace, concurrency: int) -> list[str]:
    return ["-m", args.model, "--endpoint-type", "generate", "--streaming", "-u", args.url,
            "--tokenizer", args.tokenizer, "--synthetic-input-tokens-mean", str(args.isl),
            "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", str(args.osl),
            "--extra-inputs", "ignore_eos:true", "--concurrency", str(concurrency),
            "--request-count", str(args.request_count), "--warmup-request-count", str(args.warmup)]


def run_naiad(args: argparse.Namespace, concurrency: int, workdir: Path) -> dict:
    out = workdir / "naiad"
    subprocess.run([sys.executable, "-m", "naiad", "genai-perf", "profile", *_common(args, concurrency),
                    "--artifact-dir", str(out)], check=True, capture_output=True, text=True)
    return json.loads((out / "profile_export_genai_perf.json").read_text())


def run_genai_perf(args: argparse.Namespace, concurrency: int, workdir: Path) -> dict:
    out = workdir / "genai-perf"
    subprocess.run([args.genai_perf, "profile", *_common(args, concurrency), "--endpoint",
                    f"v2/models/{args.model}/generate_stream", "--artifact-dir", str(out)],
                   check=True, capture_output=True, text=True)
    return json.loads(next(out.rglob("profile_export_genai_perf.json")).read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--genai-perf", required=True, help="the genai-perf executable")
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokenizer", required=True, help="the model's Hugging Face tokenizer directory")
    parser.add_argument("--url", default="127.0.0.1:8000")
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--request-count", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--isl", type=int, default=128)
    parser.add_argument("--osl", type=int, default=64)
    parser.add_argument("--metrics-url", default="", help="the server's /metrics: its own TTFT/ITL per run too")
    parser.add_argument("--output", type=Path, default=None, help="write every run's numbers as JSON")
    args = parser.parse_args()

    runs: dict[str, dict[str, list[dict]]] = {}
    for concurrency in [int(c) for c in args.concurrency.split(",")]:
        cell = runs.setdefault(str(concurrency), {"naiad": [], "genai-perf": []})
        for round_index in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                # alternate which tool goes first, so drifting machine load falls on both alike
                order = [run_naiad, run_genai_perf] if round_index % 2 == 0 else [run_genai_perf, run_naiad]
                for tool in order:
                    before = server_sums(args.metrics_url) if args.metrics_url else None
                    doc = tool(args, concurrency, Path(tmp))
                    after = server_sums(args.metrics_url) if args.metrics_url else None
                    name = "naiad" if tool is run_naiad else "genai-perf"
                    row = {key: {s: doc[key][s] for s in STATS} for key, _ in METRICS}
                    if before is not None:  # the warm-up requests are in the server's window too
                        for key, _ in METRICS:
                            row[key]["server_avg"] = server_avg_ms(before, after, key)
                    cell[name].append(row)
                    print(f"c={concurrency} round {round_index + 1} {name}: "
                          + ", ".join(f"{label} avg {row[key]['avg']:.2f} ms"
                                      + (f" (server {row[key]['server_avg']:.2f})" if before is not None else "")
                                      for key, label in METRICS), flush=True)

    print("\n| concurrency | metric | naiad genai-perf (ms) | GenAI-Perf (ms) | naiad / GenAI-Perf |")
    print("|---|---|---|---|---|")
    stats = STATS + (["server_avg"] if args.metrics_url else [])
    for concurrency, cell in runs.items():
        for key, label in METRICS:
            for stat in stats:
                ours = statistics.median(r[key][stat] for r in cell["naiad"])
                theirs = statistics.median(r[key][stat] for r in cell["genai-perf"])
                print(f"| {concurrency} | {label} {stat} | {ours:.2f} | {theirs:.2f} | {ours / theirs:.2f} |")
    if args.output:
        args.output.write_text(json.dumps({"settings": {k: str(v) for k, v in vars(args).items()}, "runs": runs},
                                          indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
