"""`backend: "transformers"`: Triton's vLLM backend contract (model.json, text_input -> text_output, decoupled)
served by the in-process continuous-batching engine."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import (
    BackendRequest,
    BackendResponse,
    ChatTemplate,
    InProcessRequestInstance,
    InstanceSpec,
    ModelSource,
    ResponseCallback,
)
from naiad.backends.transformers_backend.contract import (
    Emitter,
    auto_complete,
    load_model_json,
    parse_request,
)
from naiad.backends.transformers_backend.engine import (
    Engine,
    EngineError,
    Sequence,
    kv_bytes_per_token,
)
from naiad.backends.transformers_backend.sampling import SamplingError, parse_sampling
from naiad.backends.transformers_backend.stats import families
from naiad.config.model_config import ConfigError
from naiad.protocol.errors import NaiadError, invalid_arg

log = logging.getLogger("naiad.backends.transformers")

DEFAULT_KV_CACHE_BYTES = 512 << 20
TOKEN_IDS = "prompt_token_ids"  # optional input: the prompt as token ids, used instead of text_input
DEFAULT_MAX_NUM_SEQS = 64

# vLLM AsyncEngineArgs that mean nothing here: accepted so a repository moves between the two backends.
_VLLM_ONLY = {"gpu_memory_utilization", "enforce_eager", "disable_log_stats", "tensor_parallel_size",
              "disable_log_requests", "enable_prefix_caching", "swap_space", "block_size",
              "pipeline_parallel_size", "distributed_executor_backend", "enable_chunked_prefill"}
_OWN = {"model", "tokenizer", "kv_cache_bytes", "max_num_seqs", "max_model_len", "max_num_batched_tokens", "dtype",
        "device", "seed", "trust_remote_code"}
# Prefill is compute-bound on CPU (two 128-token prompts cost as much together as one after the
# other), so a small per-step budget there spreads a burst of arrivals over steps and keeps time
# to first token low; a GPU gains from batching more.
DEFAULT_MAX_NUM_BATCHED_TOKENS = {"cpu": 128, "cuda": 2048}

# transformers' from_pretrained is not thread-safe: while it builds a model it swaps class and module
# attributes for the whole process (PreTrainedModel.tie_weights and init_weights become no-ops, torch's
# init functions are patched) and restores them on exit. Two loads that overlap restore each other's
# patches: tied weights (a GPT-2 lm_head) stay on the meta device ("Cannot copy out of meta tensor"),
# and the process may keep the no-op for good. Models are therefore built one at a time, tokenizers
# included; moving a built model to its device and serving run in parallel.
_FROM_PRETRAINED = threading.Lock()


class TransformersBackend:
    """Hugging Face causal LMs from a local directory named by `<version>/model.json`."""

    name = "transformers"
    kind = "request"

    def auto_complete_config(self, config: mc.ModelConfig, model_file: Path, default_max_batch_size: int) -> None:
        """Fill the vLLM-contract inputs/outputs the config leaves out, and the decoupled policy; add the
        optional prompt_token_ids input (a prompt given as token ids, as vLLM's prompts may be)."""
        auto_complete(config)
        if TOKEN_IDS not in {t.name for t in config.input}:
            config.input.add(name=TOKEN_IDS, data_type=mc.TYPE_INT64, optional=True).dims.append(-1)

    async def create_instance(self, source: ModelSource, spec: InstanceSpec) -> TransformersInstance:
        config = source.config
        if not config.model_transaction_policy.decoupled:
            raise ConfigError(f"model '{config.name}': the transformers backend needs "
                              "model_transaction_policy { decoupled: true }")
        if config.max_batch_size != 0:
            raise ConfigError(f"model '{config.name}': the transformers backend batches internally; set max_batch_size: 0")
        settings = read_model_json(source.version_dir)
        loop = asyncio.get_running_loop()
        model, tokenizer, device, max_len = await loop.run_in_executor(None, load_model, settings, spec)
        # a forward pass: off the event loop, which keeps serving the other models meanwhile
        per_token = await loop.run_in_executor(None, kv_bytes_per_token, model)
        engine = Engine(
            model, tokenizer, device=device,
            kv_cache_bytes=int(settings.get("kv_cache_bytes", DEFAULT_KV_CACHE_BYTES)),
            max_num_seqs=int(settings.get("max_num_seqs", DEFAULT_MAX_NUM_SEQS)),
            max_model_len=max_len, name=config.name, bytes_per_token=per_token,
            max_num_batched_tokens=int(settings.get("max_num_batched_tokens",
                                                    DEFAULT_MAX_NUM_BATCHED_TOKENS.get(device.type, 2048))),
        )
        return TransformersInstance(spec.name, engine, source)


def read_model_json(version_dir: Path) -> dict[str, Any]:
    path, settings = load_model_json(version_dir, "transformers backend reads the model directory from it",
                                     " (a local Hugging Face model directory)")
    unknown = set(settings) - _OWN - _VLLM_ONLY
    if unknown:
        log.warning("%s: ignoring settings the transformers backend does not use: %s", path, ", ".join(sorted(unknown)))
    model_dir = Path(settings["model"]).expanduser()
    if not model_dir.is_absolute():
        model_dir = (version_dir / model_dir).resolve()
    if not model_dir.is_dir():
        raise ConfigError(f"{path}: \"model\" must be a local Hugging Face model directory (absolute or relative to "
                          f"{version_dir}); '{model_dir}' is not a directory. Models are never downloaded at run time.")
    settings["model"] = str(model_dir)
    if "tokenizer" in settings:
        tok = Path(settings["tokenizer"]).expanduser()
        settings["tokenizer"] = str(tok if tok.is_absolute() else (version_dir / tok).resolve())
    for key in ("kv_cache_bytes", "max_num_seqs", "max_model_len", "max_num_batched_tokens"):
        if key in settings and (not isinstance(settings[key], int) or isinstance(settings[key], bool) or settings[key] < 1):
            raise ConfigError(f"{path}: \"{key}\" must be a positive integer")
    return settings


def load_model(settings: dict[str, Any], spec: InstanceSpec) -> tuple[Any, Any, Any, int]:
    """Blocking: tokenizer and model from local files only, on the instance's device."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # load-time progress bars would interleave with the server log

    if spec.kind == mc.ModelInstanceGroup.KIND_GPU and torch.cuda.is_available():
        device = torch.device(f"cuda:{spec.device_id}")
    else:
        device = torch.device(settings.get("device", "cpu"))
    dtype_name = settings.get("dtype", "auto")
    dtypes = {"auto": "auto", "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if dtype_name not in dtypes:
        raise ConfigError(f"model.json: \"dtype\" must be one of {sorted(dtypes)}, got {dtype_name!r}")
    dtype = dtypes[dtype_name]
    if dtype == "auto" and device.type == "cpu":
        dtype = torch.float32
    trust = bool(settings.get("trust_remote_code", False))
    try:
        with _FROM_PRETRAINED:
            tokenizer = AutoTokenizer.from_pretrained(settings.get("tokenizer", settings["model"]),
                                                      local_files_only=True, trust_remote_code=trust)
            model = AutoModelForCausalLM.from_pretrained(settings["model"], local_files_only=True, dtype=dtype,
                                                         trust_remote_code=trust)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"unable to load the Hugging Face model from '{settings['model']}': {exc}") from None
    model.to(device).eval()
    if "seed" in settings:
        torch.manual_seed(int(settings["seed"]))
    max_len = settings.get("max_model_len") or _model_max_len(model, tokenizer)
    return model, tokenizer, device, int(max_len)


def _model_max_len(model: Any, tokenizer: Any) -> int:
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(model.config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and 0 < limit < 1_000_000 else 2048


class TransformersInstance(InProcessRequestInstance):
    """A request-level instance: execute_requests hands requests to the engine and returns at once."""

    def __init__(self, name: str, engine: Engine, source: ModelSource) -> None:
        self.name = name
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self._labels = {"model": source.config.name, "version": str(source.version)}
        self._providers = source.server.metrics.extra_families if source.server is not None else None
        if self._providers is not None:
            self._providers.append(self._families)

    def _families(self):
        return families([(self._labels, self.engine.stats)])

    def chat_template(self) -> ChatTemplate:
        return self.apply_chat_template

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The prompt the tokenizer's chat template makes of OpenAI-style messages."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise invalid_arg(f"model '{self._labels['model']}' has no chat template in its tokenizer configuration; "
                              "use /v1/completions")
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def healthy(self) -> bool:
        return self.engine.healthy()

    async def aclose(self) -> None:
        if self._providers is not None and self._families in self._providers:
            self._providers.remove(self._families)
        await self.engine.close()

    async def execute_requests(self, requests: list[BackendRequest], respond: ResponseCallback) -> None:
        for index, request in enumerate(requests):
            try:
                seq = self._sequence(index, request, respond)
                self.engine.add(seq)
            except (SamplingError, EngineError) as exc:
                respond(index, BackendResponse(None, error=invalid_arg(str(exc)), final=True, counts_as_failure=False))
            except NaiadError as exc:
                respond(index, BackendResponse(None, error=exc, final=True, counts_as_failure=False))

    def _sequence(self, index: int, request: BackendRequest, respond: ResponseCallback) -> Sequence:
        parsed = parse_request(request)
        if parsed.sampling is not None:
            params = parse_sampling(parsed.sampling, strict=True)
        else:
            params = parse_sampling(request.parameters, strict=False)
        ids = request.inputs.get(TOKEN_IDS)
        if ids is not None and ids.size:
            prompt_ids = [int(t) for t in ids.ravel()]
            if not parsed.exclude_input:  # the prompt prepended to the output is its text
                parsed.prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        else:
            prompt_ids = self.engine.tokenize(parsed.prompt)
        emitter = Emitter(index, respond, parsed, set(request.requested_outputs))
        return Sequence(prompt_ids, params, emitter, request.is_cancelled)
