"""The runtimes a variant can execute in: ONNX Runtime (settings per variant), TorchScript, OpenVINO (when installed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

ORT_TYPES = {
    "tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16", "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64", "tensor(int8)": "INT8", "tensor(int16)": "INT16", "tensor(int32)": "INT32",
    "tensor(int64)": "INT64", "tensor(float16)": "FP16", "tensor(float)": "FP32", "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}
# Triton's onnxruntime backend: optimization.graph.level -> ORT level
CONFIG_GRAPH_LEVEL = {"all": 0, "basic": -1, "extended": 1, "disable": 2}


@dataclass
class IoSpec:
    name: str
    datatype: str
    shape: list[int | None]  # None / -1 for dynamic dims


class Runner(Protocol):
    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


@dataclass
class OrtSettings:
    graph_level: str = "all"  # all | basic | extended | disable
    intra_op_threads: int = 0
    parallel_execution: bool = False

    def session_options(self) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = {
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        }[self.graph_level]
        if self.intra_op_threads > 0:
            options.intra_op_num_threads = self.intra_op_threads
        options.execution_mode = (ort.ExecutionMode.ORT_PARALLEL if self.parallel_execution
                                  else ort.ExecutionMode.ORT_SEQUENTIAL)
        return options

    def config_parameters(self) -> dict[str, str]:
        params = {}
        if self.intra_op_threads > 0:
            params["intra_op_thread_count"] = str(self.intra_op_threads)
        if self.parallel_execution:
            params["execution_mode"] = "1"
        return params


class OrtRunner:
    def __init__(self, path: Path, settings: OrtSettings) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(path), sess_options=settings.session_options(),
                                            providers=["CPUExecutionProvider"])
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.output_names, self.session.run(self.output_names, inputs)))


def onnx_io(path: Path) -> tuple[list[IoSpec], list[IoSpec]]:
    """Inputs and outputs of an ONNX file as ONNX Runtime reports them."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])

    def specs(items: list[Any]) -> list[IoSpec]:
        out = []
        for item in items:
            if item.type not in ORT_TYPES:
                raise ValueError(f"tensor '{item.name}' has type {item.type}, which Triton configs cannot express")
            out.append(IoSpec(item.name, ORT_TYPES[item.type], [d if isinstance(d, int) and d >= 0 else None
                                                                for d in item.shape]))
        return out

    return specs(session.get_inputs()), specs(session.get_outputs())


def optimize_onnx_offline(source: Path, target: Path, level: str = "extended") -> Path:
    """Run ONNX Runtime's graph optimizer once and save the optimized graph as a new ONNX file."""
    settings = OrtSettings(graph_level=level)
    options = settings.session_options()
    options.optimized_model_filepath = str(target)
    import onnxruntime as ort

    ort.InferenceSession(str(source), sess_options=options, providers=["CPUExecutionProvider"])
    if not target.is_file():
        raise RuntimeError(f"ONNX Runtime did not write {target}")
    return target


@dataclass
class TorchScriptRunner:
    path: Path
    input_names: list[str]
    output_names: list[str]
    module: Any = field(init=False, default=None)

    def __post_init__(self) -> None:
        import torch

        self.module = torch.jit.load(str(self.path), map_location="cpu").eval()

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        with torch.inference_mode():
            result = self.module(*[torch.from_numpy(np.ascontiguousarray(inputs[n])) for n in self.input_names])
        outputs = result if isinstance(result, (tuple, list)) else [result]
        return {name: out.detach().cpu().numpy() for name, out in zip(self.output_names, outputs)}


class OpenVinoRunner:
    def __init__(self, xml_path: Path, output_names: list[str]) -> None:
        import openvino as ov

        self.compiled = ov.Core().compile_model(str(xml_path), "CPU")
        self.output_names = output_names

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = self.compiled(inputs)
        values = [np.asarray(result[port]) for port in self.compiled.outputs]
        return dict(zip(self.output_names, values))


def openvino_from_onnx(source: Path, target_xml: Path) -> Path:
    import openvino as ov

    model = ov.convert_model(str(source))
    ov.save_model(model, str(target_xml))
    return target_xml


def available(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
