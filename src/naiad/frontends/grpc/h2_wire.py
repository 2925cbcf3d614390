"""HTTP/2 and gRPC wire pieces for Naiad's own gRPC server: frames, HPACK, timeouts, status trailers.

Response headers are encoded as HPACK literals without indexing (RFC 7541 6.2.2): stateless, so
they are built once per status and never touch a dynamic table. Request headers are decoded
with `hpack`; header blocks made only of indexed fields (what grpcio clients send once their
dynamic table is warm) or of literals without indexing (what simple clients send) are remembered:
decoding them again gives the same headers as long as the table has not changed.
"""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import Any
from urllib.parse import unquote

import hpack

from naiad.frontends.grpc.h2_inflater import Inflater, Inflation, MessageTooLarge

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# frame types (RFC 9113 6)
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
# flags
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# settings
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE, S_MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6
# error codes
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB

DEFAULT_WINDOW = 65535
MAX_WINDOW = 2**31 - 1
DEFAULT_FRAME_SIZE = 16384
MAX_MESSAGE_LENGTH = 2**31 - 1  # what Triton accepts and tritonclient sends

_HEAD = struct.Struct(">I")


def frame(ftype: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One frame: 24-bit length, type, flags, 31-bit stream id, payload."""
    n = len(payload)
    return bytes((n >> 16, (n >> 8) & 0xFF, n & 0xFF, ftype, flags)) + _HEAD.pack(stream) + payload


def settings_frame(settings: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in settings.items()))


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, _HEAD.pack(increment))


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, _HEAD.pack(code))


def goaway(last_stream: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack(">II", last_stream, code) + debug)


# ------------------------------------------------------------------ HPACK encoding (literals)


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _hpack_str(raw: bytes) -> bytes:
    return _hpack_int(len(raw), 7, 0x00) + raw


def literal(name: bytes, value: bytes, static_index: int = 0) -> bytes:
    """Literal header field without indexing; the name from the static table when it is there."""
    if static_index:
        return _hpack_int(static_index, 4, 0x00) + _hpack_str(value)
    return b"\x00" + _hpack_str(name) + _hpack_str(value)


STATUS_200 = b"\x88"  # static table entry 8, ":status: 200"
_CONTENT_TYPE = literal(b"content-type", b"application/grpc", 31)
ACCEPT_ENCODING = b"identity,deflate,gzip"
RESPONSE_HEADERS = STATUS_200 + _CONTENT_TYPE + literal(b"grpc-accept-encoding", ACCEPT_ENCODING)


def http_error_headers(status: int) -> bytes:
    """A plain HTTP answer for requests that are not gRPC (wrong method or content type)."""
    return literal(b":status", str(status).encode(), 8) + literal(b"content-type", b"text/plain", 31)


def _encode_message(message: str) -> bytes:
    """gRPC's percent-encoding of grpc-message: printable ASCII but '%' stays, the rest is %XX of UTF-8."""
    out = bytearray()
    for byte in message.encode("utf-8"):
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return bytes(out)


_OK_TRAILERS = literal(b"grpc-status", b"0")


# A unary call answered at once with OK: response headers, one DATA frame and the trailers, built in one go.
_RESPONSE_HEADERS_HEAD = bytes((0, 0, len(RESPONSE_HEADERS), HEADERS, END_HEADERS))
_OK_TRAILERS_HEAD = bytes((0, 0, len(_OK_TRAILERS), HEADERS, END_HEADERS | END_STREAM))
_MESSAGE_HEAD = struct.Struct(">BHBBIBI")  # DATA frame header (24-bit length as 8 + 16 bits), gRPC message prefix


def ok_response(stream: int, message: bytes) -> bytes:
    """The frames of a whole unary answer: headers, the message in one DATA frame, OK trailers."""
    n = len(message)
    size = n + 5
    sid = _HEAD.pack(stream)
    return b"".join((_RESPONSE_HEADERS_HEAD, sid, RESPONSE_HEADERS,
                     _MESSAGE_HEAD.pack(size >> 16, size & 0xFFFF, DATA, 0, stream, 0, n), message,
                     _OK_TRAILERS_HEAD, sid, _OK_TRAILERS))


def trailer_block(code: int, message: str = "", metadata: Any = None) -> bytes:
    """grpc-status (+ grpc-message, + trailing metadata) as a header block."""
    if code == 0 and not message and not metadata:
        return _OK_TRAILERS
    block = literal(b"grpc-status", str(code).encode())
    if message:
        block += literal(b"grpc-message", _encode_message(message))
    return block + encode_metadata(metadata)


def trailers_only_block(code: int, message: str) -> bytes:
    """A trailers-only response: the HTTP status and content type with the gRPC status, one block."""
    return STATUS_200 + _CONTENT_TYPE + trailer_block(code, message)


def encode_metadata(metadata: Any) -> bytes:
    if not metadata:
        return b""
    out = []
    for key, value in metadata:
        name = key.lower().encode("ascii")
        if name.endswith(b"-bin"):
            raw = value if isinstance(value, bytes) else str(value).encode()
            data = base64.b64encode(raw).rstrip(b"=")
        else:
            data = value if isinstance(value, bytes) else str(value).encode("ascii")
        out.append(literal(name, data))
    return b"".join(out)


def decode_message(raw: str) -> str:
    return unquote(raw)


# ------------------------------------------------------------------ gRPC timeouts

_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def parse_timeout(value: str) -> float | None:
    """`grpc-timeout` (1-8 digits and a unit) in seconds; None when malformed."""
    if len(value) < 2 or len(value) > 9 or not value[:-1].isdigit():
        return None
    unit = _UNITS.get(value[-1])
    return None if unit is None else int(value[:-1]) * unit


# ------------------------------------------------------------------ HPACK decoding


def _skip_int(block: bytes, i: int, prefix_bits: int) -> tuple[int, int]:
    """(value, next position) of an HPACK integer starting at i."""
    limit = (1 << prefix_bits) - 1
    value = block[i] & limit
    i += 1
    if value == limit:
        shift = 0
        while True:
            b = block[i]
            i += 1
            value += (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
    return value, i


def _stateless(block: bytes) -> bool:
    """True when decoding the block leaves the dynamic table unchanged: indexed fields and literals
    without indexing only (no incremental indexing, no table size update)."""
    i, n = 0, len(block)
    try:
        while i < n:
            b = block[i]
            if b & 0x80:
                _, i = _skip_int(block, i, 7)
                continue
            if b & 0xC0 == 0x40 or b & 0xE0 == 0x20:
                return False
            index, i = _skip_int(block, i, 4)
            for _ in range(1 if index else 2):
                length, i = _skip_int(block, i, 7)
                i += length
        return i == n
    except IndexError:
        return False


class Head:
    """What a call needs from its request headers, taken out once per distinct header block."""

    __slots__ = ("method", "path", "content_type", "timeout", "encoding", "metadata", "plain")

    def __init__(self, headers: list[tuple[str, str]]) -> None:
        self.method = self.path = self.content_type = self.timeout = self.encoding = ""
        for name, value in headers:
            if name == ":path":
                self.path = value
            elif name == ":method":
                self.method = value
            elif name == "content-type":
                self.content_type = value
            elif name == "grpc-timeout":
                self.timeout = value
            elif name == "grpc-encoding":
                self.encoding = value
        self.metadata = metadata_of(headers)
        # a gRPC POST without a timeout or compression: a call needs no further check of its headers
        self.plain = bool(self.path and self.method == "POST" and self.content_type.startswith("application/grpc")
                          and not self.timeout and self.encoding in ("", "identity"))


class HeaderDecoder:
    """One connection's HPACK decoder, with the memo of table-neutral blocks described above."""

    MEMO_LIMIT = 64

    def __init__(self, max_header_list_size: int) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
        self._decoder.max_allowed_table_size = 4096
        self.memo: dict[bytes, Head] = {}  # (looked up by the connection first: a call fewer per request)

    def decode(self, block: bytes) -> Head:
        """Raises hpack.HPACKError (or OversizedHeaderListError) on bad input."""
        memo = self.memo
        found = memo.get(block)
        if found is not None:
            return found
        stateless = _stateless(block)
        head = Head(self._decoder.decode(block, raw=False))
        if stateless:
            if len(memo) >= self.MEMO_LIMIT:
                memo.clear()
            memo[block] = head
        else:
            memo.clear()  # the dynamic table changed: remembered blocks may now mean other headers
        return head


def metadata_of(headers: list[tuple[str, str]]) -> tuple[tuple[str, Any], ...]:
    """Invocation metadata as grpcio gives it: no pseudo or transport headers, -bin values decoded."""
    out = []
    for name, value in headers:
        if not name or name[0] == ":" or name in _TRANSPORT_HEADERS:
            continue  # an empty name (malformed) is dropped like pseudo and transport headers
        if name.endswith("-bin"):
            try:
                out.append((name, base64.b64decode(value + "=" * (-len(value) % 4))))
            except ValueError:
                continue
        else:
            out.append((name, value))
    return tuple(out)


_TRANSPORT_HEADERS = frozenset(
    ("te", "content-type", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding", "content-length")
)


# ------------------------------------------------------------------ connection helpers


class Compressed:
    """A request message with the gRPC compressed flag, inflated when its handler takes it."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)


INFLATE_ON_LOOP = 64 << 10  # output inflated on the event loop; a larger message goes to the Inflater


async def inflate(encoding: str, data: bytes, limit: int, inflater: Inflater,
                  gate: asyncio.Semaphore) -> bytearray | memoryview:
    """The message inflated, never past `limit` bytes; a message inflating to more than INFLATE_ON_LOOP
    bytes is inflated by `inflater` while `gate` is held: until the work ends, even if the caller is
    cancelled first (so the memory inflating takes is bounded by the gate).

    Raises MessageTooLarge, ValueError or zlib.error."""
    if encoding == "gzip" and len(data) >= 18 and int.from_bytes(data[-4:], "little") > limit:
        # the gzip trailer states the size (modulo 2**32): a bomb that says so costs nothing
        raise MessageTooLarge(f"Received message larger than max (inflates to {int.from_bytes(data[-4:], 'little')} "
                              f"bytes, more than {limit})")
    job = Inflation(encoding, data, limit)
    if job.run(INFLATE_ON_LOOP):
        return job.result()
    job.close()
    await gate.acquire()
    loop = asyncio.get_running_loop()

    def release(_: object) -> None:
        try:
            loop.call_soon_threadsafe(gate.release)
        except RuntimeError:  # the loop is closed: nobody waits on the gate any more
            pass

    try:
        work = inflater.submit(encoding, data, limit)
    except BaseException:
        gate.release()
        raise
    work.add_done_callback(release)
    return await asyncio.wrap_future(work)


def peer_name(peername: Any) -> str:
    if isinstance(peername, tuple) and len(peername) >= 2:
        host, port = peername[0], peername[1]
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
    return f"unix:{peername}" if peername else "unknown"


def auth_of(ssl_object: Any) -> dict[str, list[bytes]]:
    auth: dict[str, list[bytes]] = {"transport_security_type": [b"ssl"]}
    cert = ssl_object.getpeercert()
    if cert:
        names = [value.encode() for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"]
        if names:
            auth["x509_common_name"] = names
    return auth
