"""Per-connection limits of Naiad's own HTTP/2 server: what one client may cost the shared event loop.

Each budget is a token bucket: a burst a well-behaved client never reaches, refilled at a steady
rate. A connection that empties one is ended with GOAWAY ENHANCE_YOUR_CALM, as nginx, h2o and Go's
net/http2 do since the rapid-reset (CVE-2023-44487) and frame-flood (CVE-2019-9512..9518) attacks.
"""

from __future__ import annotations

# Streams the client opened and then reset (RST_STREAM) before their answer, or that were refused or
# cancelled by a deadline: work started and thrown away. A client cancelling all of its concurrent
# calls at once stays well inside the burst.
RESET_BURST = 2000
RESET_RATE = 200.0  # per second

# Frames that cost the server work but carry no request: PING, SETTINGS, PRIORITY, GOAWAY, unknown
# types, every CONTINUATION, empty DATA without END_STREAM, WINDOW_UPDATE when no DATA was sent since
# the previous one, RST_STREAM of closed streams.
CHEAP_FRAME_BURST = 2000
CHEAP_FRAME_RATE = 1000.0  # per second
# Each call the client opens adds this many (up to the burst): gRPC C-core clients send a PING (BDP
# probe) and WINDOW_UPDATEs for every few answers, thousands a second under load.
CHEAP_FRAMES_PER_CALL = 8
# Each DATA frame the server sends adds this many: a client acknowledges what it receives with a
# stream and a connection WINDOW_UPDATE and a BDP PING, so a stream of answers on one long call
# (a decoupled model, perf_analyzer --streaming) earns what it needs, and a flood earns nothing.
CHEAP_FRAMES_PER_DATA = 3

# Fairness: one connection handles at most this many frames (or bytes) per event-loop turn, then
# pauses reading and goes on in a later turn, after the other connections had theirs.
FRAMES_PER_TURN = 256
BYTES_PER_TURN = 1 << 20

# Request bytes a connection holds for calls (partial messages, messages not yet taken by their
# handler). Past it the connection window is no longer re-opened, except for the one stream holding
# the most (so a single message larger than this still arrives).
HELD_BYTES_LIMIT = 32 << 20

# Request messages refused after the server had to take them in: larger than --grpc-max-message-size,
# inflating past --grpc-max-decompressed-size, corrupt, or over INFLATIONS_PER_CONNECTION. A client
# never needs them; past the burst the connection stops being read until the budget refills, so a
# stream of decompression bombs waits instead of taking the server's CPU (the calls fail anyway).
REFUSED_MESSAGE_BURST = 16
REFUSED_MESSAGE_RATE = 2.0  # per second

# A connection ended with GOAWAY ENHANCE_YOUR_CALM (a budget above ran out) is no longer read, and
# closed only after this many seconds: a client reconnecting at once gets a fresh budget once a second,
# not every few milliseconds.
CALM_LINGER = 1.0

# Streams whose answers wait for the client's flow-control window (it does not read, or sends no
# WINDOW_UPDATE): past this many, the connection is read only once per STALL_PAUSE seconds, so a
# client that never reads cannot keep the server running calls whose answers it will not take.
STALLED_STREAMS = 256
STALL_PAUSE = 0.2

# A connection that held this many request bytes at once hands the memory back to the system when it
# closes (glibc's malloc_trim, at most once per TRIM_INTERVAL seconds server-wide): the buffers of many
# partial messages leave the allocator's heap fragmented, and it would otherwise keep it.
TRIM_AFTER_HELD = 1 << 20
TRIM_INTERVAL = 1.0

# Compressed messages a connection may have waiting for or in inflation; past it the call fails
# RESOURCE_EXHAUSTED at once. Large inflations run one per connection (and INFLATE_THREADS server-wide).
INFLATIONS_PER_CONNECTION = 4
INFLATE_THREADS = 2

# Stream ids this connection reset itself are remembered (the most recent ones), so that frames the
# client sent before it saw the reset are ignored rather than treated as a protocol error.
RECENT_RESETS = 4096


class TokenBucket:
    """`take()` is False once more than `burst` were taken faster than `rate` per second refills them."""

    __slots__ = ("burst", "_rate", "tokens", "_stamp")

    def __init__(self, burst: int, rate: float, now: float) -> None:
        self.burst = float(burst)
        self._rate = rate
        self.tokens = float(burst)
        self._stamp = now

    def take(self, now: float) -> bool:
        tokens = min(self.burst, self.tokens + (now - self._stamp) * self._rate)
        self._stamp = now
        if tokens < 1.0:
            self.tokens = tokens
            return False
        self.tokens = tokens - 1.0
        return True

    def give(self, tokens: float) -> None:
        if self.tokens < self.burst:  # (a well-behaved client's bucket stays full)
            self.tokens = min(self.burst, self.tokens + tokens)

    def wait(self) -> float:
        """Seconds from the last `take()` until a token is there again."""
        return max(0.0, (1.0 - self.tokens) / self._rate) + 1e-3  # (past rounding: take() then succeeds)
