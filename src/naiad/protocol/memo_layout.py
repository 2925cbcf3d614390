"""What the infer decoders' memos keep of a request's fixed-size raw input (HTTP binary header memo, gRPC memo)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MEMO_LIMIT = 64   # layouts a memo keeps (it starts afresh when full)
MAX_KEY = 4096    # longer keys (long ids, many tensors) are not remembered


@dataclass(frozen=True, slots=True)
class RawInput:
    """An input whose bytes arrive as they are: wrapped as an array of `dtype` and `shape` (`nbytes` long)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    nbytes: int
    dtype: np.dtype
