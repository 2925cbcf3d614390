"""A model for a GPU-only Triton backend (TensorRT, TensorRT-LLM, DALI) is told what to serve instead."""

import pytest

from naiad.backends.registry import BackendRegistry, BackendUnavailable


@pytest.mark.parametrize(("name", "advice"), [
    ("tensorrt", 'serve the ONNX model the engine was built from (backend: "onnxruntime")'),
    ("tensorrtllm", 'backend: "vllm"'),
    ("dali", 'Python model (backend: "python")'),
])
def test_gpu_only_backend_names_the_alternative(name: str, advice: str) -> None:
    with pytest.raises(BackendUnavailable) as info:
        BackendRegistry().get(name)
    assert f"unable to find backend '{name}'" in str(info.value) and advice in str(info.value)


def test_other_unknown_backends_keep_the_plain_message() -> None:
    with pytest.raises(BackendUnavailable, match="no built-in or installed backend has this name$"):
        BackendRegistry().get("no_such_backend")
