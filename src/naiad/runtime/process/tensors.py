"""Tensor transport: arrays packed into one shared-memory block (or, when small, into the message itself),
described by small metadata tuples."""

from __future__ import annotations

import mmap
import struct
from typing import Any

import numpy as np

from naiad.protocol.datatypes import NUMPY_DTYPES, datatype_of_array
from naiad.runtime.process.shm import BlockPool

ALIGN = 64
_LEN = struct.Struct("<I")

# The one datatype table lives in naiad.protocol (BF16 travels as raw uint16 words).
NUMPY_OF = NUMPY_DTYPES


def datatype_of(array: np.ndarray) -> str:
    """Protocol datatype of a numpy array (object, bytes and str arrays are BYTES)."""
    return datatype_of_array(array)


def _element_bytes(item: object) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, (bytearray, memoryview)):
        return bytes(item)
    return str(item).encode("utf-8")


def encode_bytes(array: np.ndarray) -> bytes:
    """Triton's BYTES serialization: 4-byte LE length + content, row-major."""
    parts = []
    for item in array.reshape(-1):
        data = _element_bytes(item)
        parts.append(_LEN.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def decode_bytes(buffer: bytes | memoryview | mmap.mmap, count: int) -> np.ndarray:
    """Object array (1-D, `count` elements) of bytes from a serialized BYTES buffer."""
    data = bytes(buffer)
    result = np.empty(count, dtype=np.object_)
    offset = 0
    size = len(data)
    for index in range(count):
        if offset + 4 > size:
            raise ValueError("BYTES tensor data is truncated")
        (length,) = _LEN.unpack_from(data, offset)
        offset += 4
        if offset + length > size:
            raise ValueError("BYTES tensor data is truncated")
        result[index] = data[offset : offset + length]
        offset += length
    return result


SMALL_COPY = 64 * 1024  # below this, bytes() + one memcpy beats building a memoryview
# Messages whose tensors total at most this many bytes carry them inline: a shared-memory block costs
# more than the bytes themselves below it (acquire, copy in, the peer's mapping lookup, and a release
# message with its timer), measured ~3.5 us vs ~1.3-2 us per tensor up to 16 KiB, in each direction.
INLINE_MAX = 16 * 1024


def _prepare(datatype: str, array: np.ndarray) -> tuple[bytes | np.ndarray, int]:
    """(payload, nbytes): a C-contiguous array of the wire dtype, or encoded bytes for BYTES."""
    if datatype == "BYTES":
        data = encode_bytes(array if array.dtype.kind == "O" else np.asarray(array, dtype=np.object_))
        return data, len(data)
    wanted = NUMPY_OF[datatype]
    dtype = array.dtype
    # `is` first: the common case (the datatype's own dtype) skips the slower comparison
    if not array.flags.c_contiguous or (dtype is not wanted and dtype != wanted and datatype != "BF16"):
        array = np.ascontiguousarray(array, dtype=None if datatype == "BF16" else wanted)
    return array, array.nbytes


# Numeric datatypes and their numpy dtypes (an array of exactly that dtype goes out as it is).
NUMERIC = {datatype: dtype for datatype, dtype in NUMPY_OF.items() if datatype != "BYTES"}


def append_flat_inputs(fields: list[Any], arrays: dict[str, np.ndarray], datatypes: dict[str, str]) -> bool:
    """Append (name, datatype, shape, data) of each of a request's inputs (name -> array; datatypes by name,
    else the array's own) to the fields of a flat message (the "y" request of a batch of one request);
    False, leaving the message unusable, when a tensor does not fit one (BYTES, another dtype than its
    datatype's, empty, or too big to travel inline). The worker's "o" answer follows the same rules
    (python_host.PythonModelHost._finish). Taking the request's dict as it is, with no list of
    (name, datatype, array) built first: ~4k instructions less per add_sub request in the server."""
    total = 0
    for name, array in arrays.items():
        datatype = datatypes.get(name) or datatype_of(array)
        nbytes = array.nbytes
        if array.dtype is not NUMERIC.get(datatype) or not nbytes:
            return False
        total += (nbytes + ALIGN - 1) & ~(ALIGN - 1)
        if total > INLINE_MAX:
            return False
        fields.append((name, datatype, array.shape, bytearray(array.tobytes())))
    return True


def pack(pool: BlockPool, groups: list[Any], inline_max: int = INLINE_MAX) -> tuple[Any, ...]:
    """Write groups of (name, datatype, array) into one block: (block_name or None, [metadata lists]).

    Metadata of one tensor: (name, datatype, shape, where, nbytes). `where` is the tensor's 64-byte
    aligned offset in the block, or, when all the groups' data fits `inline_max` bytes (then there is
    no block), the data itself: a bytearray (its array is writable, like one in a block) or, for BYTES,
    bytes. BYTES tensors travel with Triton's 4-byte little-endian length prefix per element.
    """
    # The usual small message in one pass: numeric arrays of their datatype's dtype, all fitting inline
    # (tobytes() copies any layout in C order: no contiguity check or conversion needed). Anything else
    # goes to the general path. add_sub's two FP32[16] tensors: ~0.75 us instead of ~1.25 us per
    # message, on each side of the channel.
    metas = []
    total = 0
    for group in groups:
        meta = []
        for name, datatype, array in group:
            if array.dtype is not NUMERIC.get(datatype):
                return _pack_general(pool, groups, inline_max)
            nbytes = array.nbytes
            offset = total
            total += (nbytes + ALIGN - 1) & ~(ALIGN - 1)
            if total > inline_max:  # a bigger message: the general path puts it in shared memory
                return _pack_general(pool, groups, inline_max)
            # bytearray(tobytes()), never bytearray(array): that takes a 0-d integer array for a size (and asks
            # numpy for a full buffer description, ~40 ns more)
            meta.append((name, datatype, array.shape, bytearray(array.tobytes()) if nbytes else offset, nbytes))
        metas.append(meta)
    return None, metas


def _pack_general(pool: BlockPool, groups: list[Any], inline_max: int) -> tuple[Any, ...]:
    """pack() for any datatypes, layouts and sizes."""
    prepared = []
    total = 0
    for group in groups:
        items = []
        for name, datatype, array in group:
            if array.dtype is NUMPY_OF.get(datatype) and datatype != "BYTES" and array.flags.c_contiguous:
                payload, nbytes = array, array.nbytes  # what _prepare returns for it, without the call
            else:
                payload, nbytes = _prepare(datatype, array)
            items.append((name, datatype, array.shape, total, nbytes, payload))
            total += (nbytes + ALIGN - 1) & ~(ALIGN - 1)
        prepared.append(items)
    if total == 0:
        return None, [[item[:5] for item in items] for items in prepared]
    if total <= inline_max:
        return None, [[(name, datatype, shape,
                        (payload if isinstance(payload, bytes) else bytearray(payload.tobytes())) if nbytes else offset,
                        nbytes)
                       for name, datatype, shape, offset, nbytes, payload in items] for items in prepared]
    block = pool.acquire(total)
    mapping = block.mapping
    metas = []
    for items in prepared:
        meta = []
        for name, datatype, shape, offset, nbytes, payload in items:
            if nbytes:
                if isinstance(payload, bytes):
                    mapping[offset : offset + nbytes] = payload
                elif nbytes <= SMALL_COPY:
                    mapping[offset : offset + nbytes] = payload.tobytes()
                else:
                    mapping[offset : offset + nbytes] = payload.reshape(-1).data.cast("B")
            meta.append((name, datatype, shape, offset, nbytes))
        metas.append(meta)
    return block.name, metas


def unpack_one(mapping: mmap.mmap | None, meta: tuple[Any, ...], copy: bool) -> np.ndarray:
    """The array described by one metadata tuple, in a mapped block or inline; `copy` detaches it from the
    block (an inline tensor's array owns its data already)."""
    _, datatype, shape, where, nbytes = meta
    inline = isinstance(where, (bytes, bytearray))
    if datatype == "BYTES":
        count = 1
        for dim in shape:
            count *= dim
        if inline:
            return decode_bytes(where, count).reshape(shape) if count else np.empty(shape, dtype=np.object_)
        if count == 0 or mapping is None:
            return np.empty(shape, dtype=np.object_)
        return decode_bytes(mapping[where : where + nbytes], count).reshape(shape)
    dtype = NUMPY_OF[datatype]
    if inline:
        return np.ndarray(shape, dtype, where)  # one call: half the cost of frombuffer().reshape()
    if mapping is None or nbytes == 0:
        return np.zeros(shape, dtype=dtype)
    array = np.ndarray(shape, dtype, mapping, where)
    return array.copy() if copy else array
