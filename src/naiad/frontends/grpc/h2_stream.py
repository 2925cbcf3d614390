"""The state of one HTTP/2 stream (one gRPC call) on Naiad's own gRPC server."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from naiad.frontends.grpc.h2_call import CallContext, RequestStream
from naiad.frontends.grpc.h2_wire import Compressed


class Stream:
    """Windows, inbound message assembly, queued outbound DATA and the call's handler state."""

    __slots__ = ("sid", "send_window", "recv_window", "recv_unacked", "last_rx", "recv_closed", "finished",
                 "headers_sent", "sent_end", "buf", "message", "encoding", "handler", "ctx", "task", "requests",
                 "awaited", "pending", "pending_bytes", "trailers", "drain", "deadline_handle", "counted",
                 "held")

    def __init__(self, sid: int, send_window: int, recv_window: int, now: float) -> None:
        self.sid = sid
        self.send_window = send_window
        self.recv_window = recv_window
        self.recv_unacked = 0
        self.last_rx = now
        self.recv_closed = False      # the client sent END_STREAM (or we stopped reading)
        self.finished = False         # the call's status is decided (trailers sent or queued)
        self.headers_sent = False
        self.sent_end = False         # our END_STREAM went out
        self.buf: bytearray | None = None     # a partial inbound gRPC message
        self.message: bytes | Compressed | None = None  # the request of a unary call, until END_STREAM
        self.encoding = ""
        self.handler: Any = None
        self.ctx: CallContext | None = None
        self.task: asyncio.Task[None] | None = None
        self.requests: RequestStream | None = None
        self.awaited: asyncio.Future[Any] | None = None  # what a unary handler's first step waits on (no task yet)
        self.pending: collections.deque[memoryview] | None = None  # DATA waiting for flow-control window
        self.pending_bytes = 0
        self.trailers: bytes | None = None    # sent once `pending` is empty
        self.drain: asyncio.Future[None] | None = None
        self.deadline_handle: asyncio.TimerHandle | None = None
        self.counted = False          # holds one of the server's --grpc-max-concurrent-rpcs slots
        self.held = 0                 # request bytes the connection holds for this call (not yet taken)
