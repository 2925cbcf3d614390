"""Sends LLM requests (closed loop at a concurrency, or at a request rate) and timestamps every streamed event."""

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
        record = RequestRecord(index, time.monotonic_ns())
        while self.idle and self.idle[-1].closed:
            self.idle.pop()
        try:
            conn = self.idle.pop() if self.idle else await HttpConnection.open(self.host, self.port)
        except OSError as exc:
            record.end_ns = time.monotonic_ns()
            record.error = f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}"
            return record
        decoder = SseDecoder()
        endpoint = self.endpoint
        problems: list[str] = []

        def on_body(chunk: bytes) -> None:
            if not endpoint.streaming or (conn.parser is not None and conn.parser.status != 200):
                body.extend(chunk)
                return
            now = time.monotonic_ns()
            for data in decoder.feed(chunk):
                try:
                    doc = parse_event(data)
                except EventError as exc:
                    problems.append(str(exc))
                    continue
                text = endpoint.text_of(doc) if doc is not None else ""
                if text:
                    record.event_ns.append(now)
                    record.texts.append(text)

        body = bytearray()
        try:
            parser = await asyncio.wait_for(conn.start(self.payloads[index], on_body), self.timeout_s)
        except (TimeoutError, OSError) as exc:
            conn.close()
            record.end_ns = time.monotonic_ns()
            record.error = f"{type(exc).__name__}: {exc}"
            return record
        record.end_ns = time.monotonic_ns()
        if conn.closed or parser.headers.get("connection", "").lower() == "close":
            conn.close()
        else:
            self.idle.append(conn)
        if parser.status != 200:
            record.error = f"HTTP {parser.status}: {bytes(body[:300]).decode(errors='replace')}"
        elif problems:
            record.error = problems[0]
        elif not endpoint.streaming:
            try:
                text = endpoint.text_of(json.loads(bytes(body)))
            except ValueError:
                text, record.error = "", "response is not JSON"
            if text:
                record.event_ns.append(record.end_ns)
                record.texts.append(text)
        return record

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()


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
