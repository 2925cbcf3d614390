"""Sends LLM requests (closed loop at a concurrency, or at a request rate) and timestamps every streamed event.

While the load runs, the client only sends, frames the HTTP response and keeps each body chunk with the
time its bytes arrived; Server-Sent Events and JSON are decoded after the run (`decode_records`), as
GenAI-Perf parses what perf_analyzer recorded. Decoding on the fly made every event wait for the decoding
of the events queued before it (on all streams), and took CPU from a server sharing the machine, which
inflated time to first token and inter-token latency at concurrency > 1.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import numpy as np

from naiad.tools.http_wire import HttpConnection
from naiad.tools.llm.endpoints import EndpointSpec, EventError, SseDecoder, parse_event
from naiad.tools.llm.prompts import Prompt


@dataclass
class RequestRecord:
    prompt_index: int
    start_ns: int
    end_ns: int = 0
    event_ns: list[int] = field(default_factory=list)  # arrival of each event that carried text
    texts: list[str] = field(default_factory=list)
    error: str = ""
    status: int = 0
    chunks: list[tuple[int, bytes]] = field(default_factory=list, repr=False)  # (arrival ns, body bytes) until decoded

    @property
    def text(self) -> str:
        return "".join(self.texts)


class LlmClient:
    def __init__(self, host: str, port: int, endpoint: EndpointSpec, prompts: list[Prompt],
                 headers: dict[str, str] | None = None, timeout_s: float = 300.0) -> None:
        self.host, self.port = host, port
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.payloads = [self._payload(p, headers or {}) for p in prompts]
        self.idle: list[HttpConnection] = []
        self.turn = 0

    def _payload(self, prompt: Prompt, headers: dict[str, str]) -> bytes:
        body = json.dumps(self.endpoint.body(prompt)).encode()
        lines = [f"POST {self.endpoint.path()} HTTP/1.1", f"Host: {self.host}:{self.port}",
                 "Content-Type: application/json", f"Content-Length: {len(body)}"]
        if self.endpoint.streaming:
            lines.append("Accept: text/event-stream")
        lines += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body

    def next_index(self) -> int:
        index = self.turn % len(self.payloads)
        self.turn += 1
        return index

    async def send(self, index: int) -> RequestRecord:
        record = RequestRecord(index, time.perf_counter_ns())
        while self.idle and self.idle[-1].closed:
            self.idle.pop()
        try:
            conn = self.idle.pop() if self.idle else await HttpConnection.open(self.host, self.port)
        except OSError as exc:
            record.end_ns = time.perf_counter_ns()
            record.error = f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}"
            return record
        chunks = record.chunks

        def on_body(chunk: bytes) -> None:
            chunks.append((conn.received_ns, chunk))  # decoded after the run: nothing else to do here

        try:
            parser = await asyncio.wait_for(conn.start(self.payloads[index], on_body), self.timeout_s)
        except (TimeoutError, OSError) as exc:
            conn.close()
            record.end_ns = time.perf_counter_ns()
            record.error = f"{type(exc).__name__}: {exc}"
            return record
        record.end_ns = conn.received_ns
        record.status = parser.status
        if conn.closed or parser.headers.get("connection", "").lower() == "close":
            conn.close()
        else:
            self.idle.append(conn)
        return record

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()


def decode_records(records: list[RequestRecord], endpoint: EndpointSpec) -> None:
    """Turn each record's timestamped body chunks into its text events (or its error); after the run."""
    for record in records:
        chunks, record.chunks = record.chunks, []
        if record.error:
            continue
        if record.status != 200:
            body = b"".join(chunk for _, chunk in chunks)
            record.error = f"HTTP {record.status}: {body[:300].decode(errors='replace')}"
        elif endpoint.streaming:
            _decode_stream(record, chunks, endpoint)
        else:
            try:
                text = endpoint.text_of(json.loads(b"".join(chunk for _, chunk in chunks)))
            except ValueError:
                text, record.error = "", "response is not JSON"
            if text:
                record.event_ns.append(record.end_ns)
                record.texts.append(text)


def _decode_stream(record: RequestRecord, chunks: list[tuple[int, bytes]], endpoint: EndpointSpec) -> None:
    """An event is timed by the arrival of the chunk that completed it."""
    decoder = SseDecoder()
    for arrived_ns, chunk in chunks:
        for data in decoder.feed(chunk):
            try:
                doc = parse_event(data)
            except EventError as exc:
                record.error = record.error or str(exc)
                continue
            text = endpoint.text_of(doc) if doc is not None else ""
            if text:
                record.event_ns.append(arrived_ns)
                record.texts.append(text)


async def run_load(client: LlmClient, concurrency: int, request_rate: float, request_count: int,
                   duration_s: float, seed: int = 0, poisson: bool = False) -> list[RequestRecord]:
    """Closed loop at `concurrency` (or open loop at `request_rate`) until `request_count` requests were sent
    (when > 0) or `duration_s` passed; always bounded by both a count and a time limit."""
    records: list[RequestRecord] = []
    deadline = time.monotonic() + (duration_s if request_count <= 0 else max(duration_s, 3600.0))
    budget = request_count if request_count > 0 else 10_000_000
    sent = 0

    def take() -> int | None:
        nonlocal sent
        if sent >= budget or time.monotonic() >= deadline:
            return None
        sent += 1
        return client.next_index()

    async def closed_loop() -> None:
        while (index := take()) is not None:
            records.append(await client.send(index))

    if request_rate <= 0:
        await asyncio.gather(*(closed_loop() for _ in range(max(1, concurrency))))
        return records
    rng = np.random.default_rng(seed)
    tasks = []
    next_at = time.monotonic()
    while (index := take()) is not None:
        wait = next_at - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.ensure_future(client.send(index)))
        next_at += float(rng.exponential(1.0 / request_rate)) if poisson else 1.0 / request_rate
    records.extend(await asyncio.gather(*tasks))
    return records
