"""`naiad analyze` on the command line (Model Analyzer's flag names where they exist)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "analyze", help="find the model config that meets a latency budget (Model Analyzer)",
        description="Starts `naiad serve` on free loopback ports for each config variant of one model (or, with "
                    "--triton-launch-mode remote, loads each variant into a server already running in EXPLICIT "
                    "model control mode), measures it over client concurrencies, and writes the best configs, "
                    "Model Analyzer's results/metrics-*.csv files and an HTML report.")
    add = parser.add_argument
    add("mode", nargs="?", choices=["profile"], default="profile", help="only 'profile'")
    add("--model-repository", "-m", type=Path, default=None, help="needed in local mode")
    add("--triton-launch-mode", choices=["local", "remote", "docker", "c_api"], default="local",
        help="local: a naiad serve per variant; remote: a server already running (EXPLICIT mode) loads each variant "
             "as a config override through the repository API")
    add("--triton-http-endpoint", default="localhost:8000", help="(remote) the running server's HTTP address")
    add("--triton-grpc-endpoint", default="localhost:8001", help="(remote) the running server's gRPC address")
    add("--profile-models", required=True, metavar="MODEL[,MODEL...]",
        help="models to analyze, one after another (an ensemble is measured end to end while its composing "
             "models' configs are varied)")
    add("--output-model-repository-path", type=Path, default=Path("output_model_repository"))
    add("--export-path", "-e", type=Path, default=Path("results"))
    add("--override-output-model-repository", action="store_true")
    add("--run-config-search-mode", choices=["brute", "quick"], default="",
        help="default: brute, quick for ensembles (as Model Analyzer)")
    add("--run-config-search-min-instance-count", type=int, default=1)
    add("--run-config-search-max-instance-count", type=int, default=3)
    add("--run-config-search-min-model-batch-size", type=int, default=1)
    add("--run-config-search-max-model-batch-size", type=int, default=16)
    add("--run-config-search-min-concurrency", type=int, default=1)
    add("--run-config-search-max-concurrency", type=int, default=32)
    add("--dynamic-batching", default="off,on", help="choices to try among off,on,preferred")
    add("--latency-budget", type=float, default=0.0, metavar="MS", help="constraint: p99 latency at most this")
    add("--min-throughput", type=float, default=0.0, metavar="INFER/S", help="constraint: throughput at least this")
    add("--max-memory", type=float, default=0.0, metavar="MB", help="constraint: server RAM at most this")
    add("--objectives", default="perf_throughput",
        help="comma list of perf_throughput, perf_latency_p99, cpu_used_ram, each optionally :weight")
    add("--client-protocol", choices=["http", "grpc"], default="http")
    add("--batch-size", type=int, default=1, help="client batch size of each request")
    add("--measurement-interval", type=float, default=1000.0, metavar="MS")
    add("--stability-percentage", type=float, default=20.0)
    add("--max-trials", type=int, default=6)
    add("--num-top-model-configs", type=int, default=3)
    add("--server-arg", action="append", default=[], help="extra flag for naiad serve (repeatable)")


def run(args: argparse.Namespace) -> int:
    from naiad.tools.errors import run_tool

    return run_tool("analyze", lambda: _run(args), "interrupted (the servers it started are stopped)")


def _run(args: argparse.Namespace) -> int:
    from naiad.tools.analyze.analyzer import AnalyzeOptions, run_analyze
    from naiad.tools.analyze.search import BATCHING_CHOICES, Constraints, parse_objectives
    from naiad.tools.errors import fail

    batching = [b.strip() for b in args.dynamic_batching.split(",") if b.strip()]
    bad = [b for b in batching if b not in BATCHING_CHOICES]
    if bad or not batching:
        return fail("analyze", f"--dynamic-batching takes off,on,preferred, got {args.dynamic_batching!r}")
    if args.triton_launch_mode in ("docker", "c_api"):
        return fail("analyze", f"--triton-launch-mode {args.triton_launch_mode} is not available: use local (a "
                               "naiad serve per variant) or remote (a server already running)")
    if args.triton_launch_mode == "local" and args.model_repository is None:
        return fail("analyze", "--model-repository is required in local mode")
    options = AnalyzeOptions(
        model_repository=args.model_repository or Path("."),
        models=[m.strip() for m in args.profile_models.split(",") if m.strip()],
        output_repository=args.output_model_repository_path, export_path=args.export_path,
        override_output=args.override_output_model_repository, search_mode=args.run_config_search_mode,
        min_instances=args.run_config_search_min_instance_count,
        max_instances=args.run_config_search_max_instance_count,
        min_batch_size=args.run_config_search_min_model_batch_size,
        max_batch_size=args.run_config_search_max_model_batch_size, batching=batching,
        min_concurrency=args.run_config_search_min_concurrency,
        max_concurrency=args.run_config_search_max_concurrency,
        constraints=Constraints(args.latency_budget, args.min_throughput, args.max_memory),
        objectives=parse_objectives(args.objectives), protocol=args.client_protocol,
        client_batch_size=args.batch_size, measurement_interval_ms=args.measurement_interval,
        stability_percentage=args.stability_percentage, max_trials=args.max_trials,
        top=args.num_top_model_configs, server_args=args.server_arg, launch_mode=args.triton_launch_mode,
        http_endpoint=args.triton_http_endpoint, grpc_endpoint=args.triton_grpc_endpoint)
    reports = run_analyze(options)
    return 0 if all(report.winners() for report in reports) else 3
