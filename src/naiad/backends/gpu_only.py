"""Triton backends that exist only for NVIDIA GPUs, and what to serve instead (said when a model asks for one)."""

from __future__ import annotations

INSTEAD = {
    "tensorrt": "TensorRT engines (model.plan) are built for one NVIDIA GPU model and run only in NVIDIA's "
                "TensorRT runtime, which Naiad does not include: serve the ONNX model the engine was built from "
                "(backend: \"onnxruntime\"); with onnxruntime-gpu, a KIND_GPU instance group runs it on the GPU "
                "and optimization { execution_accelerators { gpu_execution_accelerator: [{ name: \"tensorrt\" }] } } "
                "uses TensorRT through ONNX Runtime",
    "tensorrtllm": "TensorRT-LLM runs only on NVIDIA GPUs: serve the Hugging Face model with backend: \"vllm\" "
                   "or backend: \"transformers\" (docs/llm.md)",
    "dali": "DALI pipelines need NVIDIA's DALI library, which Naiad does not include: do the preprocessing in a "
            "Python model (backend: \"python\") or in an ensemble step",
}


def instead(name: str) -> str:
    """'; <what to do>' for a GPU-only Triton backend, '' for any other name."""
    hint = INSTEAD.get(name)
    return f"; {hint}" if hint else ""
