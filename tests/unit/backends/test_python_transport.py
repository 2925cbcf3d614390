"""Shared-memory blocks, tensor packing and message framing used between the server and its workers."""

from __future__ import annotations

import os
import pickle
import uuid

import numpy as np
import pytest

from naiad.runtime.process import tensors
from naiad.runtime.process.framing import FrameDecoder, encode
from naiad.runtime.process.shm import (
    DEFAULT_BYTE_SIZE,
    BlockPool,
    PeerBlocks,
    block_size_for,
    remove_prefixed,
    shm_create,
)
from naiad.runtime.process.tensors import (
    INLINE_MAX,
    datatype_of,
    decode_bytes,
    encode_bytes,
    pack,
    unpack_one,
)


@pytest.fixture
def prefix():
    name = f"ntt{uuid.uuid4().hex[:8]}_"
    yield name
    remove_prefixed(name)


def _names(prefix: str) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]


def test_pool_reuses_released_blocks(prefix):
    pool = BlockPool(prefix)
    first = pool.acquire(100)
    assert first.size == DEFAULT_BYTE_SIZE
    pool.release(first.name)
    again = pool.acquire(DEFAULT_BYTE_SIZE)
    assert again.name == first.name
    bigger = pool.acquire(DEFAULT_BYTE_SIZE + 1)
    assert bigger.size == 2 * DEFAULT_BYTE_SIZE and bigger.name != first.name
    assert pool.in_use() == 2
    pool.close()
    assert _names(prefix) == []


def test_block_sizes_follow_default_and_growth(prefix):
    assert block_size_for(1, 4096, 1000) == 4096
    assert block_size_for(4097, 4096, 1000) == 5096
    assert block_size_for(10_000, 4096, 1000) == 10_096
    pool = BlockPool(prefix, 4096, 4096)
    pool.prewarm()
    assert pool.in_use() == 0 and len(_names(prefix)) == 1  # one default block, ready in the free list
    block = pool.acquire(3 * 4096 + 1)
    assert block.size == 4 * 4096
    assert pool.acquire(10).size == 4096  # the prewarmed block
    pool.close()


def test_peer_mapping_unlinks_the_name(prefix):
    pool = BlockPool(prefix)
    block = pool.acquire(10)
    block.mapping[:4] = bytes([1, 2, 3, 4])
    assert _names(prefix) == [block.name]
    peers = PeerBlocks()
    view = peers.view(block.name)
    assert list(view[:4]) == [1, 2, 3, 4]
    assert _names(prefix) == []  # both sides mapped: nothing can leak any more
    block.mapping[0:1] = b"\x09"
    assert view[0] == 9  # same memory
    del view
    peers.close()
    pool.close()


def test_remove_prefixed(prefix):
    mapping = shm_create(prefix + "x", 4096)
    mapping.close()
    assert remove_prefixed(prefix) == 1
    assert _names(prefix) == []


@pytest.mark.parametrize("dtype", ["bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
                                   "float16", "float32", "float64"])
def test_pack_unpack_fixed_size(prefix, dtype):
    pool = BlockPool(prefix)
    array = (np.arange(24) % 7).astype(dtype).reshape(2, 3, 4)
    datatype = datatype_of(array)
    block, metas = pack(pool, [[("A", datatype, array)], [("B", datatype, array[:1])]], inline_max=0)
    view = PeerBlocks().view(block)
    first = unpack_one(view, metas[0][0], copy=False)
    second = unpack_one(view, metas[1][0], copy=True)
    np.testing.assert_array_equal(first, array)
    np.testing.assert_array_equal(second, array[:1])
    assert first.dtype == array.dtype and metas[1][0][3] % 64 == 0
    pool.close()


def test_pack_bytes_and_empty(prefix):
    pool = BlockPool(prefix)
    strings = np.array([[b"", b"a\x00b"], ["é", b"xyz"]], dtype=np.object_)
    empty = np.zeros((0, 3), np.float32)
    block, metas = pack(pool, [[("S", "BYTES", strings), ("E", "FP32", empty)]], inline_max=0)
    view = PeerBlocks().view(block)
    decoded = unpack_one(view, metas[0][0], copy=True)
    assert decoded.shape == (2, 2) and decoded[0, 1] == b"a\x00b" and decoded[1, 0] == "é".encode()
    assert unpack_one(view, metas[0][1], copy=True).shape == (0, 3)
    assert pack(pool, [[("E", "FP32", empty)]])[0] is None  # nothing to write: no block
    pool.close()


def test_small_tensors_travel_inline_without_a_block(prefix):
    pool = BlockPool(prefix)
    numbers = np.arange(12, dtype=np.float32).reshape(3, 4)
    strings = np.array([b"ab", "\u00e9"], dtype=np.object_)
    empty = np.zeros((0, 2), np.int64)
    block, metas = pickle.loads(pickle.dumps(
        pack(pool, [[("N", "FP32", numbers), ("S", "BYTES", strings)], [("E", "INT64", empty)]])))
    assert block is None and pool.in_use() == 0  # no segment to fill, map and hand back
    received = unpack_one(None, metas[0][0], copy=False)
    np.testing.assert_array_equal(received, numbers)
    received[0, 0] = 7  # a model may write into its inputs, as into a block's
    assert list(unpack_one(None, metas[0][1], copy=True)) == [b"ab", "\u00e9".encode()]
    assert unpack_one(None, metas[1][0], copy=True).shape == (0, 2)
    big = np.zeros(INLINE_MAX // 4 + 1, np.float32)
    assert pack(pool, [[("B", "FP32", big)]])[0] is not None  # past the limit: shared memory
    pool.close()


def test_one_pass_inline_packing_matches_the_general_path(prefix):
    pool = BlockPool(prefix)
    square = np.arange(16, dtype=np.float32).reshape(4, 4)
    groups = [
        [("C", "FP32", square), ("T", "FP32", square.T), ("S", "FP32", square[:, ::2]),
         ("F", "FP32", np.asfortranarray(square)), ("Z", "INT64", np.zeros((0, 2), np.int64))],
        [],
        [("B", "BOOL", np.array([True, False])), ("H", "BF16", np.array([0x3F80], np.uint16)),
         ("0", "INT32", np.array(5, np.int32))],
    ]
    block, metas = pack(pool, groups)
    assert block is None and (block, metas) == tensors._pack_general(pool, groups, INLINE_MAX)
    assert all(type(meta[3]) is bytearray for group in metas for meta in group if meta[4])
    # a 0-d integer array's data, not a buffer of that many zero bytes
    assert unpack_one(None, metas[2][2], copy=True) == 5
    assert unpack_one(None, tensors._pack_general(pool, [groups[2]], INLINE_MAX)[1][0][2], copy=True) == 5
    # Up to the limit inline, past it in shared memory, as the general path decides.
    fits = np.zeros(INLINE_MAX // 4, np.float32)
    assert pack(pool, [[("A", "FP32", fits)]]) == (None, [[("A", "FP32", fits.shape, bytearray(fits), INLINE_MAX)]])
    block, metas = pack(pool, [[("A", "FP32", fits), ("B", "FP32", square)]])
    assert block is not None and [meta[3] for meta in metas[0]] == [0, INLINE_MAX]
    pool.release(block)
    assert pool.in_use() == 0
    pool.close()


def test_bytes_codec():
    encoded = encode_bytes(np.array([b"ab", b""], dtype=np.object_))
    assert encoded == b"\x02\x00\x00\x00ab\x00\x00\x00\x00"
    assert list(decode_bytes(encoded, 2)) == [b"ab", b""]
    with pytest.raises(ValueError):
        decode_bytes(encoded[:-5], 2)


def test_frame_decoder_handles_split_and_joined_frames():
    data = encode(("x", 1, "a" * 1000)) + encode(("y", 2))
    decoder = FrameDecoder()
    got = []
    for start in range(0, len(data), 7):
        got.extend(decoder.feed(data[start:start + 7]))
    assert got == [("x", 1, "a" * 1000), ("y", 2)]
    assert FrameDecoder().feed(data) == got
