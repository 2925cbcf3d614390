"""Response compression chosen from Accept-Encoding (gzip / deflate / identity, highest q wins)."""

from __future__ import annotations

import zlib

_SUPPORTED = (b"identity", b"deflate", b"gzip")


def choose_encoding(accept_encoding: bytes | None) -> bytes | None:
    """b"gzip", b"deflate" or None (identity) for an Accept-Encoding value; malformed entries are skipped."""
    if not accept_encoding:
        return None
    best = b"identity"
    best_weight = 0.0
    for entry in accept_encoding.split(b","):
        coding, _, params = entry.partition(b";")
        coding = coding.strip().lower()
        if coding not in _SUPPORTED:
            continue
        weight = 1.0
        params = params.strip()
        if params:
            key, _, value = params.partition(b"=")
            if key.strip().lower() != b"q":
                continue
            try:
                weight = float(value)
            except ValueError:
                continue
        if weight > best_weight:
            best, best_weight = coding, weight
    return None if best == b"identity" else best


def compress(body: bytes, encoding: bytes) -> bytes:
    """gzip or deflate (zlib stream, as Triton and tritonclient use) a response body."""
    wbits = 16 + zlib.MAX_WBITS if encoding == b"gzip" else zlib.MAX_WBITS
    compressor = zlib.compressobj(6, zlib.DEFLATED, wbits)
    return compressor.compress(body) + compressor.flush()
