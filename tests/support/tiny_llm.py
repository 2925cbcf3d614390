"""A tiny random-weight causal LM (GPT-2 layout) and a byte-level BPE tokenizer trained here: nothing downloaded."""

from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, this is a tiny language model used in tests",
    "naiad serves models over http and grpc with streaming responses",
    "once upon a time there was a small model that wrote random words",
    "numbers 0 1 2 3 4 5 6 7 8 9 and punctuation . , ! ? : ;",
]


def build_tiny_llm(directory: Path, *, vocab_size: int = 320, layers: int = 2, seed: int = 0, positions: int = 2048,
                   hidden: int = 32, heads: int = 2) -> Path:
    """Save tokenizer + model into `directory` (save_pretrained); returns it.

    vLLM's CPU attention needs a head size (hidden // heads) of at least 32."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(_CORPUS * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                        unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=bpe.get_vocab_size(), n_positions=positions, n_embd=hidden, n_layer=layers, n_head=heads,
                        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    model = GPT2LMHeadModel(config).eval()
    model.generation_config.eos_token_id = eos
    model.save_pretrained(directory)
    return directory


def force_one_token(directory: Path, token: str) -> int:
    """Rewrite the saved model so that greedy decoding always picks `token` (a vocabulary entry); returns its id.

    The final layer norm then outputs its bias whatever the input, and the (tied) output embedding of the
    token is aligned with that bias."""
    import torch
    from transformers import AutoTokenizer, GPT2LMHeadModel

    token_id = AutoTokenizer.from_pretrained(directory).convert_tokens_to_ids(token)
    model = GPT2LMHeadModel.from_pretrained(directory)
    with torch.no_grad():
        bias = torch.ones_like(model.transformer.ln_f.bias)
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.copy_(bias)
        model.transformer.wte.weight[token_id] = 10 * bias
    model.save_pretrained(directory)
    return token_id


def write_llm_repository(repo: Path, hf_dir: Path, *, name: str = "tiny_llm", kv_cache_bytes: int | None = None,
                         config_text: str = 'backend: "transformers"\n', extra: dict | None = None) -> Path:
    """A Triton-layout repository whose model.json points (relatively) at hf_dir."""
    version = repo / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(config_text)
    settings: dict = {"model": str(Path("..", "..", "..", hf_dir.name)) if hf_dir.parent == repo.parent else str(hf_dir)}
    if kv_cache_bytes is not None:
        settings["kv_cache_bytes"] = kv_cache_bytes
    settings.update(extra or {})
    (version / "model.json").write_text(json.dumps(settings))
    return repo
