"""`naiad navigate` on the command line."""

from __future__ import annotations

import argparse
from pathlib import Path


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("batch sizes must be positive")
    return values


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "navigate", help="convert a model to its fastest correct deployable form (Model Navigator)",
        description="Builds variants of an ONNX file (or a PyTorch module when torch is installed), checks each "
                    "against the original on sample inputs, measures them, and writes a model repository with "
                    "the fastest correct one.")
    add = parser.add_argument
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--onnx", type=Path, help="source ONNX file")
    source.add_argument("--torch-module", default="", metavar="MODULE:FACTORY",
                        help="a torch.nn.Module (or a function returning one); needs torch")
    add("--model-name", required=True, help="name of the model in the written repository")
    add("--output-repository", type=Path, required=True, help="model repository to write (created if needed)")
    add("--sample-inputs", type=Path, default=None, help=".npz with one array per input, batch dim first")
    add("--workspace", type=Path, default=Path("navigator_workspace"), help="variants and navigation_report.json")
    add("--batch-sizes", type=_int_list, default=[1, 8], help="batch sizes to check and measure (default 1,8)")
    add("--max-batch-size", type=int, default=0, help="max_batch_size in the config (default: largest batch size)")
    add("--atol", type=float, default=1e-4)
    add("--rtol", type=float, default=1e-4)
    add("--measure-seconds", type=float, default=1.0, help="time spent measuring each variant per batch size")
    add("--optimize-for", choices=["throughput", "latency"], default="throughput")
    add("--formats", default="onnx,torchscript,openvino", help="variant formats to try")
    add("--instance-count", type=int, default=1)
    add("--extra-onnx", type=Path, action="append", default=[], help="another candidate ONNX file (repeatable)")
    add("--verify-server", action="store_true", help="serve the result with naiad serve and compare its answer")


def run(args: argparse.Namespace) -> int:
    from naiad.tools.errors import run_tool

    return run_tool("navigate", lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    from naiad.tools.navigate.navigator import NavigateOptions, run_navigate

    options = NavigateOptions(
        model_name=args.model_name, output_repository=args.output_repository, onnx=args.onnx,
        torch_module=args.torch_module, sample_inputs=args.sample_inputs, workspace=args.workspace,
        batch_sizes=args.batch_sizes, max_batch_size=args.max_batch_size, atol=args.atol, rtol=args.rtol,
        measure_seconds=args.measure_seconds, optimize_for=args.optimize_for,
        formats=[f.strip() for f in args.formats.split(",") if f.strip()], instance_count=args.instance_count,
        extra_onnx=args.extra_onnx, verify_server=args.verify_server)
    run_navigate(options)
    return 0
