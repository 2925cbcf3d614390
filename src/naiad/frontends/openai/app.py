"""ASGI handler for /v1/...: model listing, completions and chat completions (JSON or SSE ending in [DONE])."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from naiad.frontends.http.body import Receive, RequestHeaders, body_timeout, read_body
from naiad.frontends.http.errors import ClientDisconnected, HttpError
from naiad.frontends.http.responses import JSON, Send
from naiad.frontends.openai.schema import (
    GenerationRequest,
    RequestError,
    parse_chat,
    parse_completion,
)
from naiad.protocol.errors import ErrorCode, NaiadError
from naiad.protocol.types import InferenceRequest, InferInput

if TYPE_CHECKING:
    from naiad.core.facade import ResolvedModel, ServerAPI

OWNER = "Naiad"
EVENT_STREAM = b"text/event-stream; charset=utf-8"
TOKEN_IDS = "prompt_token_ids"  # optional input of models that take a prompt as token ids
Route = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]
_RETURN_FLAGS = ("return_finish_reason", "return_num_input_tokens", "return_num_output_tokens")


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def _unknown_model(name: str) -> ApiError:
    # OpenAI's answer (vLLM's too, except that vLLM's `code` is the status number): typed clients
    # read `code` as a string, and the openai client raises NotFoundError on the 404.
    return ApiError(404, f"The model `{name}` does not exist.", param="model", code="model_not_found")


def _is_llm(inputs: dict[str, str], outputs: set[str]) -> bool:
    """Takes text_input (BYTES) and gives text_output: the vLLM contract the OpenAI API serves."""
    return inputs.get("text_input") == "BYTES" and "text_output" in outputs


def _error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> bytes:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return orjson.dumps({"detail": message, "error": {"message": message, "type": kind, "param": param, "code": code}})


async def _send_json(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", JSON), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


@dataclass
class Piece:
    """One response of one choice."""

    index: int
    text: str
    finish_reason: str | None
    prompt_tokens: int
    output_tokens: int
    final: bool
    prompt_index: int = 0


class OpenAIApp:
    """Serves /v1 for one Server; usable as a standalone ASGI app or mounted in the HTTP app."""

    def __init__(self, server: ServerAPI) -> None:
        self.server = server
        self.created = int(time.time())
        # The route table: (the whole path, trailing slash ignored; the one method allowed, or None
        # for any; handler). The first match answers; another method on its path is a 405, no match a 404.
        self.routes: tuple[tuple[re.Pattern[str], str | None, Route], ...] = (
            (re.compile(r"/v1/chat/completions"), "POST", self._chat_completions),
            (re.compile(r"/v1/completions"), "POST", self._completions),
            (re.compile(r"/v1/models"), "GET", self._models),
            (re.compile(r"/v1/models/(.+)"), "GET", self._model),
            (re.compile(r"(?:/v1)?/health/ready"), None, self._health),
        )

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        try:
            await self._dispatch(scope, receive, send)
        except ClientDisconnected:
            return
        except ApiError as exc:
            await _send_json(send, exc.status, _error_body(exc.status, exc.message, exc.param, exc.code))
        except HttpError as exc:
            await _send_json(send, exc.status, _error_body(exc.status, exc.message))

    async def _dispatch(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        path = scope["path"].rstrip("/")
        for pattern, method, handler in self.routes:
            if pattern.fullmatch(path):
                if method is not None:
                    self._only(scope["method"], method)
                await handler(scope, receive, send)
                return
        raise ApiError(404, "Not Found")

    async def _models(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await _send_json(send, 200, orjson.dumps({"object": "list", "data": [self._model_card(m) for m in self._llm_models()]}))

    async def _model(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        name = scope["path"].rstrip("/")[len("/v1/models/"):]
        if name not in self._llm_models():
            raise _unknown_model(name)
        await _send_json(send, 200, orjson.dumps(self._model_card(name)))

    async def _completions(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await self._generate(scope, receive, send, chat=False)

    async def _chat_completions(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await self._generate(scope, receive, send, chat=True)

    async def _health(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await _send_json(send, 200 if self.server.control.is_ready() else 503, b"{}")

    @staticmethod
    def _only(method: str, allowed: str) -> None:
        if method != allowed:
            raise ApiError(405, "Method Not Allowed")

    # ------------------------------------------------------------ models

    def _model_card(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": self.created, "owned_by": OWNER}

    def _llm_models(self) -> list[str]:
        """Ready models that take text_input (BYTES) and give text_output: the vLLM contract."""
        names = []
        for entry in self.server.control.repository_index(ready_only=True):
            name = entry["name"]
            if name in names:
                continue
            try:
                meta = self.server.info.model_metadata(name)
            except NaiadError:
                continue
            if _is_llm({t["name"]: t["datatype"] for t in meta["inputs"]}, {t["name"] for t in meta["outputs"]}):
                names.append(name)
        return names

    async def _resolve_llm(self, name: str) -> ResolvedModel:
        """The one lookup of a generation request: the model, if it serves the vLLM contract (else 404)."""
        try:
            resolved = await self.server.inference.resolve(name)
        except NaiadError as exc:
            if exc.code is ErrorCode.NOT_FOUND:
                raise _unknown_model(name) from None
            raise ApiError(_status(exc), exc.message) from None
        if not _is_llm({t.name: t.datatype for t in resolved.inputs}, {t.name for t in resolved.outputs}):
            raise _unknown_model(name)
        return resolved

    # ------------------------------------------------------------ generation

    async def _generate(self, scope: dict[str, Any], receive: Receive, send: Send, chat: bool) -> None:
        config = self.server.config
        body = await read_body(receive, RequestHeaders.from_scope(scope), config.http_max_input_size,
                               body_timeout(scope, config.http_body_timeout_secs))
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
        try:
            request = parse_chat(doc) if chat else parse_completion(doc)
        except RequestError as exc:
            raise ApiError(400, str(exc)) from None
        resolved = await self._resolve_llm(request.model)
        prompts = [self._chat_prompt(request, resolved)] if chat else request.prompts
        inputs = {t.name for t in resolved.inputs}
        if any(not isinstance(p, str) for p in prompts):
            if TOKEN_IDS not in inputs:
                raise ApiError(400, f"model '{request.model}' takes text prompts only (it has no '{TOKEN_IDS}' input)",
                               param="prompt")
            if request.echo:
                raise ApiError(400, "'echo' is not supported with token-id prompts", param="echo")
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        # One choice per prompt and n: choice p * n + i is the i-th of prompt p (vLLM's numbering).
        streams = [self._choice(request, resolved, prompt, inputs, p * request.n + i, i, p)
                   for p, prompt in enumerate(prompts) for i in range(request.n)]
        merged = _merge(streams)
        # Errors before the first response are ordinary JSON errors with a status.
        try:
            first = await _with_disconnect(anext(merged, None), receive)
        except NaiadError as exc:
            await merged.aclose()
            raise ApiError(_status(exc), exc.message) from None
        except ClientDisconnected:
            await merged.aclose()
            return
        writer = _ChatWriter(ident, request) if chat else _CompletionWriter(ident, request, prompts)
        if request.stream:
            await self._stream(send, receive, first, merged, writer)
        else:
            await self._single(send, receive, first, merged, writer)

    @staticmethod
    def _chat_prompt(request: GenerationRequest, resolved: ResolvedModel) -> str:
        try:
            prompt = resolved.apply_chat_template(request.messages, request.add_generation_prompt)
        except Exception as exc:  # a template error (jinja) is the request's problem
            raise ApiError(400, f"the chat template failed: {exc}") from None
        if prompt is None:
            raise ApiError(400, f"model '{request.model}' has no tokenizer chat template; use /v1/completions")
        return prompt

    async def _choice(self, request: GenerationRequest, resolved: ResolvedModel, prompt: str | list[int],
                      inputs: set[str], index: int, nth: int, prompt_index: int) -> AsyncIterator[Piece]:
        sampling = dict(request.sampling)
        if nth and sampling.get("seed") is not None:
            sampling["seed"] = int(sampling["seed"]) + nth  # n choices from one seed must differ
        prompt_text = prompt if isinstance(prompt, str) else ""  # token ids travel in their own input
        tensors = [_bytes("text_input", prompt_text), _bool("stream", True),
                   _bytes("sampling_parameters", json.dumps(sampling))]
        if not isinstance(prompt, str):
            tensors.append(InferInput(TOKEN_IDS, "INT64", (len(prompt),), np.array(prompt, dtype=np.int64)))
        tensors.append(_bool("exclude_input_in_output", True))
        tensors.extend(_bool(flag, True) for flag in _RETURN_FLAGS if flag in inputs)
        infer = InferenceRequest(model_name=request.model, model_version="",
                                 inputs=[t for t in tensors if t.name in inputs])
        prompt_tokens = 0
        async for response, final in self.server.inference.stream(infer, resolved=resolved):
            text, reason, out_tokens = "", None, 0
            if response is not None:
                outputs = {o.name: o.data for o in response.outputs if o.data is not None}
                text = _first_text(outputs.get("text_output"))
                reason = _first_text(outputs.get("finish_reason")) or None
                if "num_input_tokens" in outputs:
                    prompt_tokens = int(np.asarray(outputs["num_input_tokens"]).ravel()[0])
                if "num_output_tokens" in outputs:
                    out_tokens = int(np.asarray(outputs["num_output_tokens"]).sum())
            yield Piece(index, text, reason if final else None, prompt_tokens, out_tokens, final, prompt_index)

    async def _single(self, send: Send, receive: Receive, first: Piece | None, rest: AsyncIterator[Piece], writer) -> None:
        async def collect() -> list[Piece]:
            pieces = [first] if first is not None else []
            async for piece in rest:
                pieces.append(piece)
            return pieces

        try:
            pieces = await _with_disconnect(collect(), receive)
        except ClientDisconnected:
            return
        except NaiadError as exc:
            raise ApiError(_status(exc), exc.message) from None
        finally:
            await rest.aclose()
        await _send_json(send, 200, orjson.dumps(writer.whole(pieces)))

    async def _stream(self, send: Send, receive: Receive, first: Piece | None, rest: AsyncIterator[Piece], writer) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", EVENT_STREAM), (b"cache-control", b"no-cache")]})

        async def pump() -> None:
            for chunk in writer.opening():
                await _event(send, chunk)
            if first is not None:
                for chunk in writer.chunks(first):
                    await _event(send, chunk)
            async for piece in rest:
                for chunk in writer.chunks(piece):
                    await _event(send, chunk)
            for chunk in writer.closing():
                await _event(send, chunk)

        try:
            await _with_disconnect(pump(), receive)
        except ClientDisconnected:
            return
        except NaiadError as exc:  # after streaming began: an error event, status stays 200
            await _event(send, {"error": {"message": exc.message, "type": "server_error", "param": None, "code": None}})
        finally:
            await rest.aclose()
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _event(send: Send, doc: dict[str, Any]) -> None:
    await send({"type": "http.response.body", "body": b"data: " + orjson.dumps(doc) + b"\n\n", "more_body": True})


async def _with_disconnect(awaitable: Awaitable[Any], receive: Receive) -> Any:
    """Await `awaitable`; if the client disconnects first, cancel it (freeing the model's slot) and raise."""
    work = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if work in done:
            return work.result()
        work.cancel()
        with contextlib.suppress(BaseException):
            await work
        raise ClientDisconnected()
    finally:
        watcher.cancel()
        if not work.done():
            work.cancel()


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _merge(streams: list[AsyncIterator[Piece]]) -> AsyncIterator[Piece]:
    """Interleave the n choices' pieces as they arrive; closing this closes (cancels) them all."""
    if len(streams) == 1:
        try:
            async for piece in streams[0]:
                yield piece
        finally:
            await streams[0].aclose()
        return
    queue: asyncio.Queue[Piece | BaseException | None] = asyncio.Queue()

    async def drain(stream: AsyncIterator[Piece]) -> None:
        try:
            async for piece in stream:
                await queue.put(piece)
        except BaseException as exc:  # handed to the consumer
            await queue.put(exc)
        finally:
            await queue.put(None)

    tasks = [asyncio.ensure_future(drain(s)) for s in streams]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task


def _status(exc: NaiadError) -> int:
    return 400 if exc.code is ErrorCode.INVALID_ARG else exc.code.http_status


def _first_text(array: Any) -> str:
    if array is None or np.asarray(array).size == 0:
        return ""
    value = np.asarray(array).ravel()[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _bytes(name: str, value: str) -> InferInput:
    array = np.empty(1, dtype=np.object_)
    array[0] = value.encode("utf-8")
    return InferInput(name, "BYTES", (1,), array)


def _bool(name: str, value: bool) -> InferInput:
    return InferInput(name, "BOOL", (1,), np.array([value], dtype=np.bool_))


class _Usage:
    """Each prompt's tokens once (whatever n), every choice's generated tokens."""

    def __init__(self, choices: int) -> None:
        self.prompts: dict[int, int] = {}
        self.completion = [0] * choices

    def add(self, piece: Piece) -> None:
        self.prompts[piece.prompt_index] = max(self.prompts.get(piece.prompt_index, 0), piece.prompt_tokens)
        self.completion[piece.index] += piece.output_tokens

    def as_dict(self) -> dict[str, int]:
        prompt, done = sum(self.prompts.values()), sum(self.completion)
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}


class _CompletionWriter:
    """text_completion objects and chunks."""

    def __init__(self, ident: str, request: GenerationRequest, prompts: list[str | list[int]]) -> None:
        self.ident, self.request = ident, request
        # echo is refused for token-id prompts, so an echoed prompt is text
        self.echoed = [(p if isinstance(p, str) and request.echo else "") for p in prompts for _ in range(request.n)]
        self.created = int(time.time())
        self.usage = _Usage(len(self.echoed))

    def _base(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.ident, "object": "text_completion", "created": self.created, "model": self.request.model,
                "choices": choices}

    def whole(self, pieces: list[Piece]) -> dict[str, Any]:
        texts = list(self.echoed)
        reasons: list[str | None] = [None] * len(texts)
        for piece in pieces:
            texts[piece.index] += piece.text
            reasons[piece.index] = piece.finish_reason or reasons[piece.index]
            self.usage.add(piece)
        doc = self._base([{"index": i, "text": texts[i], "finish_reason": reasons[i] or "stop", "logprobs": None}
                          for i in range(len(texts))])
        doc["usage"] = self.usage.as_dict()
        return doc

    def opening(self) -> list[dict[str, Any]]:
        if not self.request.echo:
            return []
        return [self._base([{"index": i, "text": text, "finish_reason": None, "logprobs": None}])
                for i, text in enumerate(self.echoed)]

    def chunks(self, piece: Piece) -> list[dict[str, Any]]:
        self.usage.add(piece)
        if not piece.text and not piece.final:
            return []
        reason = (piece.finish_reason or "stop") if piece.final else None
        return [self._base([{"index": piece.index, "text": piece.text, "finish_reason": reason, "logprobs": None}])]

    def closing(self) -> list[dict[str, Any]]:
        if not self.request.include_usage:
            return []
        doc = self._base([])
        doc["usage"] = self.usage.as_dict()
        return [doc]


class _ChatWriter:
    """chat.completion objects and chat.completion.chunk chunks (first delta carries the role)."""

    def __init__(self, ident: str, request: GenerationRequest) -> None:
        self.ident, self.request = ident, request
        self.created = int(time.time())
        self.usage = _Usage(request.n)

    def _base(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.ident, "object": kind, "created": self.created, "model": self.request.model,
                "system_fingerprint": None, "choices": choices}

    def whole(self, pieces: list[Piece]) -> dict[str, Any]:
        texts = [""] * self.request.n
        reasons: list[str | None] = [None] * self.request.n
        for piece in pieces:
            texts[piece.index] += piece.text
            reasons[piece.index] = piece.finish_reason or reasons[piece.index]
            self.usage.add(piece)
        doc = self._base("chat.completion", [
            {"index": i, "message": {"role": "assistant", "content": texts[i]}, "finish_reason": reasons[i] or "stop",
             "logprobs": None} for i in range(self.request.n)])
        doc["usage"] = self.usage.as_dict()
        return doc

    def opening(self) -> list[dict[str, Any]]:
        return [self._base("chat.completion.chunk", [
            {"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None, "logprobs": None}])
            for i in range(self.request.n)]

    def chunks(self, piece: Piece) -> list[dict[str, Any]]:
        self.usage.add(piece)
        out = []
        if piece.text:
            out.append(self._base("chat.completion.chunk", [
                {"index": piece.index, "delta": {"content": piece.text}, "finish_reason": None, "logprobs": None}]))
        if piece.final:
            out.append(self._base("chat.completion.chunk", [
                {"index": piece.index, "delta": {}, "finish_reason": piece.finish_reason or "stop", "logprobs": None}]))
        return out

    def closing(self) -> list[dict[str, Any]]:
        if not self.request.include_usage:
            return []
        doc = self._base("chat.completion.chunk", [])
        doc["usage"] = self.usage.as_dict()
        return [doc]
