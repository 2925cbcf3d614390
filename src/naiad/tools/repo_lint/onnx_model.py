"""The inputs and outputs an ONNX model file declares, read with onnxruntime as the server reads them."""

from __future__ import annotations

from pathlib import Path

from naiad.config.onnx_io import ModelTensor, ort_tensor


def onnx_tensors(path: Path) -> tuple[list[ModelTensor], list[ModelTensor]]:
    """(inputs, outputs) of `path` (a file, or a directory holding model.onnx and its external data).

    Raises ValueError with onnxruntime's reason when the file does not load."""
    import onnxruntime as ort  # imported on use: linting other repositories never needs it

    if path.is_dir():
        path = path / "model.onnx"
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime has its own exception types for bad files
        raise ValueError(f"unable to load ONNX model '{path}': {exc}") from None
    return ([ort_tensor(t.name, t.type, t.shape) for t in session.get_inputs()],
            [ort_tensor(t.name, t.type, t.shape) for t in session.get_outputs()])
