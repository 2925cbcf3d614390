"""`naiad navigate`: variants of a model, each checked against the original and measured; the fastest correct
one is written to a Triton model repository with its config.pbtxt."""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from naiad.tools.errors import ToolError
from naiad.tools.navigate.runtimes import (
    OpenVinoRunner,
    OrtRunner,
    OrtSettings,
    Runner,
    available,
    onnx_io,
    openvino_from_onnx,
    optimize_onnx_offline,
)
from naiad.tools.navigate.samples import Sample, batched_samples, is_batchable, load_npz, random_samples
from naiad.tools.navigate.triton_config import ModelSignature, write_model

MAX_ITERATIONS = 10_000


class NavigateError(ToolError):
    """The navigation cannot run (message is for the user)."""


@dataclass
class Variant:
    name: str
    fmt: str  # onnx | torchscript | openvino
    path: Path
    make_runner: Callable[[], Runner]
    ort: OrtSettings | None = None
    status: str = "pending"  # ok | incorrect | error
    error: str = ""
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    p50_ms: dict[int, float] = field(default_factory=dict)
    throughput: dict[int, float] = field(default_factory=dict)  # samples/s per batch size

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "format": self.fmt, "path": str(self.path), "status": self.status,
                "error": self.error, "max_abs_diff": self.max_abs_diff,
                "p50_latency_ms": {str(k): v for k, v in self.p50_ms.items()},
                "throughput_samples_per_sec": {str(k): v for k, v in self.throughput.items()},
                "ort_settings": vars(self.ort) if self.ort else None}


@dataclass
class NavigateOptions:
    model_name: str
    output_repository: Path
    onnx: Path | None = None
    torch_module: str = ""  # "package.module:factory" (needs torch)
    sample_inputs: Path | None = None
    workspace: Path = Path("navigator_workspace")
    batch_sizes: list[int] = field(default_factory=lambda: [1, 8])
    max_batch_size: int = 0  # 0 = the largest batch size measured
    atol: float = 1e-4
    rtol: float = 1e-4
    measure_seconds: float = 1.0
    optimize_for: str = "throughput"  # throughput | latency
    formats: list[str] = field(default_factory=lambda: ["onnx", "torchscript", "openvino"])
    instance_count: int = 1
    extra_onnx: list[Path] = field(default_factory=list)  # more candidate ONNX files, checked like the rest
    verify_server: bool = False
    seed: int = 0


def compare(reference: dict[str, np.ndarray], got: dict[str, np.ndarray], atol: float, rtol: float) -> tuple[bool, dict[str, float], str]:
    """Every reference output present, same shape, |got - ref| <= atol + rtol * |ref| elementwise (NaN == NaN)."""
    diffs: dict[str, float] = {}
    for name, expected in reference.items():
        if name not in got:
            return False, diffs, f"output '{name}' missing"
        actual = np.asarray(got[name])
        if actual.shape != expected.shape:
            return False, diffs, f"output '{name}' has shape {actual.shape}, expected {expected.shape}"
        if expected.dtype.kind in "fc" or actual.dtype.kind in "fc":
            a, e = actual.astype(np.float64), expected.astype(np.float64)
            both_nan = np.isnan(a) & np.isnan(e)
            delta = np.where(both_nan, 0.0, np.abs(a - e))
            diffs[name] = float(np.nan_to_num(delta, nan=np.inf).max()) if delta.size else 0.0
            if not np.all(both_nan | np.isclose(a, e, atol=atol, rtol=rtol)):
                return False, diffs, f"output '{name}' differs by up to {diffs[name]:.3g} (atol {atol:g}, rtol {rtol:g})"
        else:
            equal = np.array_equal(actual, expected)
            diffs[name] = 0.0 if equal else float("inf")
            if not equal:
                return False, diffs, f"output '{name}' is not equal to the original"
    return True, diffs, ""


def measure(runner: Runner, sample: Sample, seconds: float) -> tuple[float, float]:
    """(p50 latency ms, samples/s at that latency) over repeated runs for `seconds` (bounded by MAX_ITERATIONS).
    The median, not the mean, so that a busy machine's stalls do not decide the choice."""
    for _ in range(3):
        runner.run(sample)
    batch = next(iter(sample.values())).shape[0] if sample else 1
    latencies = []
    deadline = time.perf_counter() + seconds
    for _ in range(MAX_ITERATIONS):
        t0 = time.perf_counter()
        runner.run(sample)
        latencies.append(time.perf_counter() - t0)
        if t0 >= deadline:
            break
    median_s = float(np.median(latencies))
    return median_s * 1000.0, batch / median_s if median_s > 0 else 0.0


class Navigator:
    def __init__(self, options: NavigateOptions, out: TextIO | None = None) -> None:
        self.options = options
        self.out = out or sys.stdout
        self.workspace = Path(options.workspace)
        self.variants: list[Variant] = []

    def log(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    # ------------------------------------------------------------------ sources
    def _onnx_variants(self, source: Path, prefix: str = "onnx") -> list[Variant]:
        formats = self.options.formats
        out: list[Variant] = []
        if "onnx" in formats:
            settings = [
                (f"{prefix}", OrtSettings("all")),
                (f"{prefix}-ort-basic", OrtSettings("basic")),
                (f"{prefix}-ort-extended", OrtSettings("extended")),
                (f"{prefix}-ort-1-thread", OrtSettings("all", intra_op_threads=1)),
                (f"{prefix}-ort-parallel", OrtSettings("all", parallel_execution=True)),
            ]
            for name, s in settings:
                out.append(Variant(name, "onnx", source, lambda p=source, s=s: OrtRunner(p, s), s))
            optimized = self.workspace / f"{prefix}-optimized" / "model.onnx"
            optimized.parent.mkdir(parents=True, exist_ok=True)
            try:
                optimize_onnx_offline(source, optimized, "extended")
                s = OrtSettings("disable")
                out.append(Variant(f"{prefix}-optimized", "onnx", optimized, lambda p=optimized, s=s: OrtRunner(p, s), s))
            except Exception as exc:
                out.append(Variant(f"{prefix}-optimized", "onnx", optimized, lambda: None, None, "error", str(exc)))
        if "openvino" in formats and available("openvino"):
            xml = self.workspace / f"{prefix}-openvino" / "model.xml"
            xml.parent.mkdir(parents=True, exist_ok=True)
            try:
                openvino_from_onnx(source, xml)
                names = [o.name for o in onnx_io(source)[1]]
                out.append(Variant(f"{prefix}-openvino", "openvino", xml, lambda x=xml, n=names: OpenVinoRunner(x, n)))
            except Exception as exc:
                out.append(Variant(f"{prefix}-openvino", "openvino", xml, lambda: None, None, "error", str(exc)))
        elif "openvino" in formats:
            self.log("  (OpenVINO variant skipped: the 'openvino' package is not installed)")
        return out

    def _from_onnx(self) -> tuple[ModelSignature, dict[int, Sample], Callable[[Sample], dict[str, np.ndarray]]]:
        source = Path(self.options.onnx)  # type: ignore[arg-type]
        if not source.is_file():
            raise NavigateError(f"no ONNX file at {source}")
        inputs, outputs = onnx_io(source)
        batchable = is_batchable(inputs, outputs)
        samples = self._samples(inputs, batchable)
        reference_runner = OrtRunner(source, OrtSettings("disable"))
        self.variants = self._onnx_variants(source)
        for index, extra in enumerate(self.options.extra_onnx):
            s = OrtSettings("all")
            self.variants.append(Variant(f"extra-{index}-{Path(extra).stem}", "onnx", Path(extra),
                                         lambda p=Path(extra), s=s: OrtRunner(p, s), s))
        return ModelSignature(inputs, outputs, batchable), samples, reference_runner.run

    def _samples(self, inputs: list[Any], batchable: bool) -> dict[int, Sample]:
        o = self.options
        if o.sample_inputs is not None:
            arrays = load_npz(Path(o.sample_inputs))
            missing = [spec.name for spec in inputs if spec.name not in arrays]
            if missing:
                raise NavigateError(f"{o.sample_inputs} has no array for input(s) {missing} (it has {sorted(arrays)})")
            arrays = {spec.name: arrays[spec.name] for spec in inputs}
            return batched_samples(arrays, o.batch_sizes) if batchable else {1: arrays}
        try:
            return random_samples(inputs, o.batch_sizes, batchable, o.seed)
        except ValueError as exc:
            raise NavigateError(str(exc)) from None

    def _from_torch(self) -> tuple[ModelSignature, dict[int, Sample], Callable[[Sample], dict[str, np.ndarray]]]:
        from naiad.tools.navigate.torch_source import TorchSource

        if not available("torch"):
            raise NavigateError("--torch-module needs PyTorch (pip install torch); or pass an ONNX file with --onnx")
        if self.options.sample_inputs is None:
            raise NavigateError("a PyTorch module needs --sample-inputs FILE.npz (arrays in forward() order)")
        source = TorchSource(self.options.torch_module, load_npz(Path(self.options.sample_inputs)))
        samples = batched_samples(source.arrays, self.options.batch_sizes)
        self.variants = []
        if "torchscript" in self.options.formats:
            self.variants.append(source.torchscript_variant(self.workspace, samples[min(samples)], Variant))
        if "onnx" in self.options.formats or "openvino" in self.options.formats:
            try:
                exported = source.export_onnx(self.workspace / "onnx-export" / "model.onnx", samples[min(samples)])
                self.variants += self._onnx_variants(exported, "torch-onnx")
            except Exception as exc:
                self.variants.append(Variant("torch-onnx", "onnx", self.workspace, lambda: None, None, "error", str(exc)))
        return source.signature(), samples, source.run

    # ------------------------------------------------------------------ the run
    def _check_and_measure(self, variant: Variant, samples: dict[int, Sample],
                           references: dict[int, dict[str, np.ndarray]]) -> None:
        if variant.status == "error":
            return
        try:
            runner = variant.make_runner()
            for b, sample in samples.items():
                ok, diffs, why = compare(references[b], runner.run(sample), self.options.atol, self.options.rtol)
                for name, value in diffs.items():
                    variant.max_abs_diff[name] = max(variant.max_abs_diff.get(name, 0.0), value)
                if not ok:
                    variant.status, variant.error = "incorrect", f"batch {b}: {why}"
                    return
            for b, sample in samples.items():
                variant.p50_ms[b], variant.throughput[b] = measure(runner, sample, self.options.measure_seconds)
            variant.status = "ok"
        except Exception as exc:
            variant.status, variant.error = "error", f"{type(exc).__name__}: {exc}"

    def _pick(self, batch_sizes: list[int]) -> Variant | None:
        good = [v for v in self.variants if v.status == "ok"]
        if not good:
            return None
        if self.options.optimize_for == "latency":
            smallest = min(batch_sizes)
            return min(good, key=lambda v: v.p50_ms[smallest])
        largest = max(batch_sizes)
        return max(good, key=lambda v: v.throughput[largest])

    def run(self) -> Variant:
        o = self.options
        if bool(o.onnx) == bool(o.torch_module):
            raise NavigateError("give exactly one source: --onnx FILE or --torch-module MODULE:FACTORY")
        self.workspace.mkdir(parents=True, exist_ok=True)
        signature, samples, reference = self._from_torch() if o.torch_module else self._from_onnx()
        references = {b: reference(sample) for b, sample in samples.items()}
        self.log(f"Checking {len(self.variants)} variant(s) against the original on batch sizes {sorted(samples)} "
                 f"(atol {o.atol:g}, rtol {o.rtol:g})")
        for variant in self.variants:
            self._check_and_measure(variant, samples, references)
            self.log("  " + self._line(variant))
        best = self._pick(list(samples))
        self._write_report(best)
        if best is None:
            raise NavigateError("no variant produced the original's outputs within tolerance; see "
                                f"{self.workspace / 'navigation_report.json'}")
        max_batch = (o.max_batch_size or max(samples)) if signature.batchable else 0
        model_dir = write_model(Path(o.output_repository), o.model_name, best, signature, max_batch, o.instance_count)
        self.log(f"Fastest correct variant: {best.name} -> {model_dir}")
        if o.verify_server:
            self._verify(signature, samples, references)
        return best

    def _line(self, v: Variant) -> str:
        if v.status != "ok":
            return f"{v.name:<28} {v.status.upper():<9} {v.error}"
        perf = ", ".join(f"b{b}: {v.p50_ms[b]:.3f} ms p50, {v.throughput[b]:.0f}/s" for b in sorted(v.p50_ms))
        diff = max(v.max_abs_diff.values(), default=0.0)
        return f"{v.name:<28} OK        max |diff| {diff:.2g}; {perf}"

    def _write_report(self, best: Variant | None) -> None:
        doc = {"model_name": self.options.model_name, "chosen": best.name if best else None,
               "optimize_for": self.options.optimize_for, "atol": self.options.atol, "rtol": self.options.rtol,
               "variants": [v.as_json() for v in self.variants]}
        (self.workspace / "navigation_report.json").write_text(json.dumps(doc, indent=2))

    def _verify(self, signature: ModelSignature, samples: dict[int, Sample],
                references: dict[int, dict[str, np.ndarray]]) -> None:
        """Serve the written repository with `naiad serve` and compare its answer with the original's."""
        from naiad.tools.analyze.server import ManagedServer
        from naiad.tools.v2client import HttpControl

        o = self.options
        b = min(samples)
        config = (Path(o.output_repository) / o.model_name / "config.pbtxt").read_text()
        torchscript = 'backend: "pytorch"' in config
        inputs = [(f"INPUT__{i}" if torchscript else spec.name, spec.datatype, array)
                  for i, (spec, array) in enumerate(zip(signature.inputs, samples[b].values()))]
        with ManagedServer(Path(o.output_repository), [o.model_name]) as server:
            control = HttpControl(server.url("http"))
            try:
                answer = control.infer_json(o.model_name, inputs)
            finally:
                control.close()
        expected = {signature.wire_output(name): value for name, value in references[b].items()}
        # a batch-only output is declared dims [1] + reshape []: the server answers it as [batch, 1]
        batch_only = {spec.name for spec in signature.outputs if signature.batchable and len(spec.shape) == 1}
        expected = {k: v.reshape(-1, 1) if k in batch_only else v for k, v in expected.items()}
        ok, _, why = compare(expected, {k: np.asarray(v, dtype=expected[k].dtype) if k in expected else v
                                        for k, v in answer.items()}, o.atol, o.rtol)
        if not ok:
            raise NavigateError(f"the served model differs from the original: {why}")
        self.log("Verified: naiad serve loads the repository and answers like the original")


def run_navigate(options: NavigateOptions, out: TextIO | None = None) -> Variant:
    return Navigator(options, out).run()


def clean_workspace(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
