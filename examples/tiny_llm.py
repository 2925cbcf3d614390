"""Build a tiny random-weight language model and a model repository that serves it, with nothing downloaded.

    python examples/tiny_llm.py --output my_models      # writes my_models/tiny_llm/ and tiny_llm_weights/

The model (GPT-2 layout, 2 layers, ~100 KB of weights) and its byte-level BPE tokenizer are made
here, so it works offline in a few seconds. It writes random words: it is for trying the LLM
endpoints (generate, generate_stream, OpenAI /v1), not for reading. Needs `pip install -e '.[llm]'`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# A chat template so /v1/chat/completions works too.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, this is a tiny language model",
    "naiad serves models over http and grpc with streaming responses",
    "once upon a time there was a small model that wrote random words",
    "numbers 0 1 2 3 4 5 6 7 8 9 and punctuation . , ! ? : ;",
]


def build_model(directory: Path, seed: int = 0) -> Path:
    """Train a small tokenizer on CORPUS, make a random GPT-2, save both in Hugging Face's layout."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(CORPUS * 4, trainer)
    end = "<|endoftext|>"
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=end, bos_token=end, unk_token=end, pad_token=end)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)
    eos = tokenizer.convert_tokens_to_ids(end)
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=bpe.get_vocab_size(), n_positions=1024, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    model = GPT2LMHeadModel(config).eval()
    model.generation_config.eos_token_id = eos
    model.save_pretrained(directory)
    return directory


def write_repository_entry(repository: Path, name: str, weights: Path) -> Path:
    """<repository>/<name>/config.pbtxt and 1/model.json pointing at the weights (the vLLM backend's layout)."""
    version = repository / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    (repository / name / "config.pbtxt").write_text('backend: "transformers"\n')
    # relative to the version directory, so the repository can be moved with the weights beside it
    beside = weights.resolve().parent == repository.resolve().parent
    relative = Path("..", "..", "..", weights.name) if beside else weights.resolve()
    (version / "model.json").write_text(json.dumps({"model": str(relative)}, indent=2) + "\n")
    return repository / name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, required=True, help="model repository to add the model to")
    parser.add_argument("--name", default="tiny_llm", help="model name (default: tiny_llm)")
    args = parser.parse_args()
    # the weights live beside the repository, not in it: every directory in a repository is a model
    weights = build_model(args.output.resolve().parent / f"{args.name}_weights")
    model_dir = write_repository_entry(args.output, args.name, weights)
    print(f"wrote {model_dir} (weights in {weights})")


if __name__ == "__main__":
    main()
