"""Triton's vLLM backend contract, shared by the `transformers` and `vllm` backends (no torch import here).

Tensors (text_input, stream, sampling_parameters, exclude_input_in_output, return_* flags ->
text_output, finish_reason, num_input_tokens, num_output_tokens), the decoupled policy, reading
a request's inputs, and turning generation updates into backend responses.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import BackendRequest, BackendResponse, ResponseCallback
from naiad.config.model_config import ConfigError
from naiad.protocol.errors import internal, invalid_arg, unavailable

# name, data type, dims, optional
INPUTS = [
    ("text_input", mc.TYPE_STRING, [1], False),
    ("stream", mc.TYPE_BOOL, [1], True),
    ("sampling_parameters", mc.TYPE_STRING, [1], True),
    ("exclude_input_in_output", mc.TYPE_BOOL, [1], True),
    ("return_finish_reason", mc.TYPE_BOOL, [1], True),
    ("return_num_input_tokens", mc.TYPE_BOOL, [1], True),
    ("return_num_output_tokens", mc.TYPE_BOOL, [1], True),
]
OUTPUTS = [
    ("text_output", mc.TYPE_STRING, [-1]),
    ("finish_reason", mc.TYPE_STRING, [-1]),
    ("num_input_tokens", mc.TYPE_UINT32, [1]),
    ("num_output_tokens", mc.TYPE_UINT32, [-1]),
]

MODEL_JSON = "model.json"


def load_model_json(version_dir: Path, purpose: str, model_hint: str = "") -> tuple[Path, dict[str, Any]]:
    """`<version>/model.json` as a dict with a "model" string (both LLM backends' contract).

    `purpose` ends the missing-file message ("reads the model directory from it"); `model_hint`
    says what "model" should name."""
    path = version_dir / MODEL_JSON
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"unable to find '{path}': the {purpose}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON: {exc}") from None
    if not isinstance(settings, dict) or not isinstance(settings.get("model"), str):
        raise ConfigError(f"{path}: expected a JSON object with a \"model\" string{model_hint}")
    return path, settings


@dataclass
class SequenceOutput:
    """What one step produced for one sequence (delivered on the event loop)."""

    text: str
    finished: bool = False
    finish_reason: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None


def auto_complete(config: mc.ModelConfig) -> None:
    """Fill the contract's inputs/outputs the config leaves out, and the decoupled policy."""
    have = {t.name for t in config.input}
    for name, dtype, dims, optional in INPUTS:
        if name not in have:
            entry = config.input.add(name=name, data_type=dtype, optional=optional)
            entry.dims.extend(dims)
    have = {t.name for t in config.output}
    for name, dtype, dims in OUTPUTS:
        if name not in have:
            config.output.add(name=name, data_type=dtype).dims.extend(dims)
    config.model_transaction_policy.decoupled = True


def flag(request: BackendRequest, name: str, default: bool = False) -> bool:
    array = request.inputs.get(name)
    if array is None or array.size == 0:
        return default
    return bool(np.asarray(array).ravel()[0])


def text(request: BackendRequest, name: str) -> str | None:
    array = request.inputs.get(name)
    if array is None or array.size == 0:
        return None
    value = np.asarray(array).ravel()[0]
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def bytes_array(value: str) -> np.ndarray:
    array = np.empty(1, dtype=np.object_)
    array[0] = value.encode("utf-8")
    return array


@dataclass
class ParsedRequest:
    prompt: str
    stream: bool
    exclude_input: bool
    sampling: dict[str, Any] | None  # the sampling_parameters JSON object; None: use request parameters
    wanted: dict[str, bool]


def parse_request(request: BackendRequest) -> ParsedRequest:
    """The contract's inputs of one request; raises INVALID_ARG naming the input."""
    prompt = text(request, "text_input")
    if prompt is None:
        raise invalid_arg("input 'text_input' is required")
    stream = flag(request, "stream")
    exclude = flag(request, "exclude_input_in_output", default=stream)
    if stream and "exclude_input_in_output" in request.inputs and not exclude:
        raise invalid_arg("exclude_input_in_output=false is not supported with stream=true (streaming never "
                          "prepends the prompt)")
    raw = text(request, "sampling_parameters")
    sampling = None
    if raw is not None and raw.strip():
        try:
            sampling = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise invalid_arg(f"input 'sampling_parameters' is not valid JSON: {exc}") from None
        if not isinstance(sampling, dict):
            raise invalid_arg("input 'sampling_parameters' must be a JSON object")
    wanted = {
        "finish_reason": flag(request, "return_finish_reason"),
        "num_input_tokens": flag(request, "return_num_input_tokens"),
        "num_output_tokens": flag(request, "return_num_output_tokens"),
    }
    return ParsedRequest(prompt, stream, exclude, sampling, wanted)


class Emitter:
    """Turns generation updates into backend responses: one per text piece when streaming, else one at the end."""

    def __init__(self, index: int, respond: ResponseCallback, parsed: ParsedRequest, requested: set[str]) -> None:
        self._index = index
        self._respond = respond
        self._stream = parsed.stream
        prefix = "" if parsed.exclude_input else parsed.prompt
        self._parts = [prefix] if prefix else []
        self._wanted = parsed.wanted
        self._requested = requested
        self._sent_tokens = 0

    def __call__(self, out: SequenceOutput) -> None:
        if out.error is not None:
            error = unavailable(out.error) if out.finish_reason == "abort" else internal(out.error)
            self._respond(self._index, BackendResponse(None, error=error, final=True))
            return
        if self._stream:
            if not out.text and not out.finished:
                return
            if not out.text and not any(self._wanted.values()):
                self._respond(self._index, BackendResponse(None, final=True))
                return
            self._respond(self._index, BackendResponse(self._outputs(out, out.text), final=out.finished))
            return
        self._parts.append(out.text)
        if out.finished:
            self._respond(self._index, BackendResponse(self._outputs(out, "".join(self._parts)), final=True))

    def _outputs(self, out: SequenceOutput, value: str) -> dict[str, np.ndarray]:
        outputs = {"text_output": bytes_array(value)}
        if self._wanted["finish_reason"] and out.finished:
            outputs["finish_reason"] = bytes_array(out.finish_reason or "stop")
        if self._wanted["num_input_tokens"]:
            outputs["num_input_tokens"] = np.array([out.prompt_tokens], dtype=np.uint32)
        if self._wanted["num_output_tokens"]:
            outputs["num_output_tokens"] = np.array([out.output_tokens - self._sent_tokens], dtype=np.uint32)
            self._sent_tokens = out.output_tokens
        if self._requested:
            outputs = {k: v for k, v in outputs.items() if k in self._requested}
        return outputs


Emit = Callable[[SequenceOutput], None]
