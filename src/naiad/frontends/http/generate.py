"""The generate extension: POST .../generate (one JSON answer) and .../generate_stream (Server-Sent Events)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from naiad.frontends.http.body import Receive, RequestHeaders, body_timeout, read_body
from naiad.frontends.http.errors import (
    ClientDisconnected,
    HttpError,
    status_and_message,
)
from naiad.frontends.http.infer_params import apply_request_parameters
from naiad.frontends.http.responses import JSON, Send, send_error
from naiad.frontends.security import HeaderForwarder
from naiad.protocol.errors import NaiadError, invalid_arg
from naiad.protocol.request_json import load_request_json
from naiad.protocol.tensor_codec import array_from_json, array_to_json
from naiad.protocol.types import InferenceRequest, InferenceResponse, InferInput

if TYPE_CHECKING:
    from naiad.core.facade import ResolvedModel, ServerAPI

logger = logging.getLogger("naiad.http")

ONE_RESPONSE_MESSAGE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that generates "
    "various number of responses"
)
EVENT_STREAM = b"text/event-stream; charset=utf-8"


def _tensor_shape(declared: list[int], count: int, name: str) -> tuple[int, ...]:
    """Fixed dims must divide the element count; the innermost -1 takes the rest, other -1 become 1."""
    shape = list(declared)
    variable = [i for i, d in enumerate(shape) if d == -1]
    fixed = 1
    for d in shape:
        if d != -1:
            fixed *= d
    if variable:
        for i in variable[:-1]:
            shape[i] = 1
        if fixed == 0 or count % fixed:
            raise invalid_arg(f"unable to fit {count} element(s) of '{name}' into shape {declared}")
        shape[variable[-1]] = count // fixed
    elif fixed != count:
        raise invalid_arg(f"input '{name}' expects {fixed} element(s) for shape {declared}, got {count}")
    return tuple(shape)


def build_generate_request(resolved: ResolvedModel, model: str, version: str, doc: Any) -> InferenceRequest:
    """Map a flat JSON object onto the resolved model's inputs (keys naming inputs) and request
    parameters (the rest)."""
    if not isinstance(doc, dict):
        raise invalid_arg("failed to parse the request JSON buffer: expected a JSON object")
    inputs_meta = {entry.name: entry for entry in resolved.inputs}
    if "parameters" in inputs_meta:
        raise invalid_arg("'parameters' can not be used as an input name for the generate extension")
    nested = doc.get("parameters", {})
    if not isinstance(nested, dict):
        raise invalid_arg("Unable to parse 'parameters': expected a JSON object")
    values: dict[str, Any] = {}
    params: dict[str, Any] = {}
    request_id = ""
    for source in (doc, nested):
        for key, value in source.items():
            if source is doc and key == "parameters":
                continue
            if key in inputs_meta:
                values[key] = value
            elif source is doc and key == "id":
                if not isinstance(value, str):
                    raise invalid_arg("Unable to parse 'id': expected a string")
                request_id = value
            else:
                params[key] = value
    request = InferenceRequest(model_name=model, model_version=version, inputs=[], id=request_id)
    apply_request_parameters(params, request)
    for name, value in values.items():
        entry = inputs_meta[name]
        items = value if isinstance(value, list) else [value]
        shape = _tensor_shape(list(entry.shape), len(items), name)
        array = array_from_json(entry.datatype, shape, items, name)
        request.inputs.append(InferInput(name, entry.datatype, shape, array))
    return request


def response_document(response: InferenceResponse) -> dict[str, Any]:
    """model_name, model_version, id, response parameters and each output as a top-level key."""
    doc: dict[str, Any] = {"model_name": response.model_name, "model_version": str(response.model_version)}
    if response.id:
        doc["id"] = response.id
    doc.update(response.parameters)
    for out in response.outputs:
        if out.data is None:
            continue
        data = array_to_json(np.asarray(out.data), out.datatype)
        doc[out.name] = data[0] if len(data) == 1 else data
    return doc


class GenerateHandler:
    """Both generate endpoints; errors before the first response are ordinary JSON errors."""

    def __init__(self, server: ServerAPI) -> None:
        self.server = server
        self.forward_headers: HeaderForwarder | None = None  # --http-header-forward-pattern

    async def handle(self, scope: dict[str, Any], receive: Receive, send: Send, model: str, version: str, stream: bool) -> None:
        server = self.server
        headers = RequestHeaders.from_scope(scope)
        try:
            if headers.content_encoding not in (None, b"identity"):
                raise invalid_arg(f"unsupported Content-Encoding '{headers.content_encoding.decode(errors='replace')}' for generate")
            body = await read_body(receive, headers, server.config.http_max_input_size, body_timeout(scope, server.config.http_body_timeout_secs))
            doc = load_request_json(body)
            resolved = await server.inference.resolve(model, version)
            request = build_generate_request(resolved, model, version, doc)
            if self.forward_headers is not None:
                self.forward_headers.apply(scope["headers"], request.parameters)
            responses = self._responses(request, resolved)
            first = await anext(responses, None)
        except ClientDisconnected:
            return
        except (NaiadError, HttpError) as exc:
            status, message = status_and_message(exc)
            await send_error(send, status, message)
            return
        if stream:
            await self._stream(send, receive, first, responses)
        else:
            await self._single(send, first, responses)

    async def _responses(self, request: InferenceRequest, resolved: ResolvedModel) -> AsyncIterator[InferenceResponse]:
        async for response, _final in self.server.inference.stream(request, resolved=resolved):
            if response is not None:
                yield response

    async def _single(self, send: Send, first: InferenceResponse | None, rest: AsyncIterator[InferenceResponse]) -> None:
        try:
            extra = [r async for r in rest]
            if first is None or extra:
                raise invalid_arg(ONE_RESPONSE_MESSAGE)
            body = orjson.dumps(response_document(first))
        except NaiadError as exc:
            status, message = status_and_message(exc)
            await send_error(send, status, message)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", JSON), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _stream(self, send: Send, receive: Receive, first: InferenceResponse | None, rest: AsyncIterator[InferenceResponse]) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", EVENT_STREAM), (b"cache-control", b"no-cache")]})
        # uvicorn ignores sends after a disconnect, so watch for it: a client that goes away
        # cancels its request instead of letting the model generate for nobody.
        watcher = asyncio.ensure_future(_disconnected(receive))
        try:
            if first is not None:
                await send({"type": "http.response.body", "body": _event(response_document(first)), "more_body": True})
            while True:
                step = asyncio.ensure_future(anext(rest, None))
                done, _ = await asyncio.wait({step, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if step not in done:
                    step.cancel()
                    await rest.aclose()
                    return
                response = step.result()
                if response is None:
                    break
                await send({"type": "http.response.body", "body": _event(response_document(response)), "more_body": True})
        except NaiadError as exc:
            # Once streaming began the status stays 200: the error travels as an event.
            await send({"type": "http.response.body", "body": _event({"error": exc.message}), "more_body": True})
        except OSError:
            return
        finally:
            watcher.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _event(doc: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"
