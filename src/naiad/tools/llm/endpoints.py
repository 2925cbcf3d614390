"""Request bodies and response parsing for the LLM endpoints: v2 generate(_stream), OpenAI completions and chat."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from naiad.tools.llm.prompts import Prompt


@dataclass
class EndpointSpec:
    kind: str  # generate | completions | chat
    model: str
    streaming: bool
    input_name: str = "text_input"
    output_name: str = "text_output"
    extra_inputs: dict[str, Any] = field(default_factory=dict)
    exclude_input: bool = False  # (generate) send exclude_input_in_output: the model declares that input

    def path(self) -> str:
        if self.kind == "generate":
            return f"/v2/models/{self.model}/" + ("generate_stream" if self.streaming else "generate")
        return "/v1/completions" if self.kind == "completions" else "/v1/chat/completions"

    def body(self, prompt: Prompt) -> dict[str, Any]:
        if self.kind == "generate":
            doc: dict[str, Any] = {self.input_name: prompt.text}
            if self.streaming:
                doc["stream"] = True  # Triton's LLM backends answer with one response unless asked to stream
            if self.exclude_input:
                doc["exclude_input_in_output"] = True
            if prompt.max_tokens is not None:
                doc["max_tokens"] = prompt.max_tokens
        elif self.kind == "completions":
            doc = {"model": self.model, "prompt": prompt.text, "stream": self.streaming}
            if prompt.max_tokens is not None:
                doc["max_tokens"] = prompt.max_tokens
        else:
            doc = {"model": self.model, "messages": [{"role": "user", "content": prompt.text}], "stream": self.streaming}
            if prompt.max_tokens is not None:
                doc["max_tokens"] = prompt.max_tokens
        doc.update(self.extra_inputs)
        return doc

    def text_of(self, doc: Any) -> str:
        """The generated text one event (or a whole non-streamed answer) carries."""
        if not isinstance(doc, dict):
            return ""
        if self.kind == "generate":
            value = doc.get(self.output_name, "")
            if isinstance(value, list):
                return "".join(str(v) for v in value)
            return "" if value is None else str(value)
        pieces = []
        for choice in doc.get("choices") or []:
            if self.kind == "completions":
                pieces.append(choice.get("text") or "")
            else:
                part = choice.get("delta") if self.streaming else choice.get("message")
                pieces.append((part or {}).get("content") or "")
        return "".join(pieces)


class EventError(RuntimeError):
    """The server reported an error inside the stream."""


class SseDecoder:
    """Server-Sent Events framing: `data: ...` lines, events separated by a blank line."""

    def __init__(self) -> None:
        self.buffer = ""

    def feed(self, chunk: bytes) -> list[str]:
        self.buffer += chunk.decode("utf-8", errors="replace").replace("\r\n", "\n")
        events = []
        while "\n\n" in self.buffer:
            raw, self.buffer = self.buffer.split("\n\n", 1)
            data = [line[5:].lstrip() for line in raw.split("\n") if line.startswith("data:")]
            if data:
                events.append("\n".join(data))
        return events


def parse_event(data: str) -> Any:
    """One event's JSON (None for the OpenAI terminator); an error event raises."""
    if data.strip() == "[DONE]":
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        raise EventError(f"event is not JSON: {data[:200]!r}") from None
    if isinstance(doc, dict) and "error" in doc and not doc.get("choices"):
        error = doc["error"]
        raise EventError(error.get("message", str(error)) if isinstance(error, dict) else str(error))
    return doc
