"""Token counting and prompt sizing in a tokenizer's tokens (a Hugging Face tokenizer, or an approximation).

GenAI-Perf sizes prompts and counts output tokens with `--tokenizer` (default: the Llama tokenizer
`hf-internal-testing/llama-tokenizer`). Here that default is used when it is in the local Hugging Face
cache; otherwise tokens are approximated as words and punctuation marks, and the run says so.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Protocol

DEFAULT_TOKENIZER = "hf-internal-testing/llama-tokenizer"
TOKEN_PATTERN = re.compile(r"\w+|[^\w\s]", re.UNICODE)


class Tokenizer(Protocol):
    name: str

    def count(self, text: str) -> int: ...

    def fit(self, text: str, tokens: int) -> str:
        """`text` cut to its first `tokens` tokens (it must be long enough)."""
        ...


class ApproximateTokenizer:
    """Words and punctuation marks: close to what BPE tokenizers give for plain English text."""

    name = "approximate (words and punctuation)"

    def count(self, text: str) -> int:
        return len(TOKEN_PATTERN.findall(text))

    def fit(self, text: str, tokens: int) -> str:
        return " ".join(text.split()[:tokens])


class HuggingFaceTokenizer:
    def __init__(self, name: str, loaded: Any) -> None:
        self.name = name
        self.loaded = loaded

    def count(self, text: str) -> int:
        return len(self.loaded.encode(text, add_special_tokens=False))

    def fit(self, text: str, tokens: int) -> str:
        ids = self.loaded.encode(text, add_special_tokens=False)
        cut = tokens
        fitted = self.loaded.decode(ids[:cut], skip_special_tokens=True)
        for _ in range(8):  # decode/encode can merge or split a token at the cut: nudge the cut until it fits
            missing = tokens - self.count(fitted)
            if missing == 0 or not 0 < cut + missing <= len(ids):
                break
            cut += missing
            fitted = self.loaded.decode(ids[:cut], skip_special_tokens=True)
        return fitted


def _load(name: str, local_only: bool) -> Any:
    from transformers import AutoTokenizer  # optional dependency

    return AutoTokenizer.from_pretrained(name, local_files_only=local_only)


def load_tokenizer(name: str) -> tuple[Tokenizer, str]:
    """The tokenizer for `--tokenizer NAME` (a local directory or a Hugging Face model id) and a notice
    to print ("" when there is nothing to say). Without a name, GenAI-Perf's default from the local cache,
    else the approximation."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        if name:
            raise ValueError("--tokenizer needs the 'transformers' package (pip install transformers)") from None
        return ApproximateTokenizer(), ("tokens are approximated as words and punctuation marks "
                                        "(install 'transformers' and pass --tokenizer for exact counts)")
    if not name:
        try:
            return HuggingFaceTokenizer(DEFAULT_TOKENIZER, _load(DEFAULT_TOKENIZER, local_only=True)), ""
        except Exception:
            return ApproximateTokenizer(), (f"the default tokenizer {DEFAULT_TOKENIZER} is not in the local Hugging "
                                            "Face cache: tokens are approximated as words and punctuation marks "
                                            "(pass --tokenizer with the served model's tokenizer for exact counts)")
    local = Path(name).expanduser()
    if name.startswith(("/", ".", "~")) and not local.is_dir():
        raise ValueError(f"--tokenizer {name}: no such directory")
    try:
        return HuggingFaceTokenizer(name, _load(str(local) if local.is_dir() else name, local.is_dir())), ""
    except Exception as exc:
        reason = " ".join(str(exc).split())[:300]
        raise ValueError(f"--tokenizer {name}: cannot load a tokenizer ({reason})") from None
