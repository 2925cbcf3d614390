"""Server side of the model's calls into the server: BLS inference, model control, custom metrics."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from naiad.protocol.errors import NaiadError
from naiad.protocol.types import (
    InferenceRequest,
    InferenceResponse,
    InferInput,
    RequestedOutput,
)
from naiad.runtime.process.tensors import pack, unpack_one

if TYPE_CHECKING:
    from naiad.runtime.process.session import WorkerSession

log = logging.getLogger("naiad.python")


def _request(session: WorkerSession, message: tuple[Any, ...]) -> InferenceRequest:
    (_, _, model_name, version, request_id, correlation_id, flags, timeout, parameters, requested, block, metas,
     _) = message
    view = session.peers.view(block) if block else None
    inputs = [InferInput(m[0], m[1], tuple(m[2]), unpack_one(view, m, copy=True)) for m in metas]
    if block:
        session.release_peer(block)
    params = json.loads(parameters) if parameters and parameters != "{}" else {}
    return InferenceRequest(
        model_name=model_name,
        inputs=inputs,
        model_version="" if version is None or int(version) < 0 else str(version),
        id=request_id,
        outputs=[RequestedOutput(name) for name in requested],
        parameters=params,
        timeout_us=int(timeout or 0),
        sequence_id=correlation_id,
        sequence_start=bool(flags & 1),
        sequence_end=bool(flags & 2),
    )


def _send_item(session: WorkerSession, call_id: int, response: InferenceResponse | None, final: bool) -> None:
    if not session.alive:
        return
    if response is None:
        session.send(("b", call_id, None, None, None, None, final))
        return
    tensors = [(out.name, out.datatype, out.data) for out in response.outputs if out.data is not None]
    block, metas = pack(session.pool, [tensors])
    parameters = json.dumps(response.parameters, default=str) if response.parameters else "{}"
    session.send(("b", call_id, block, metas[0], parameters, None, final))


def _send_error(session: WorkerSession, call_id: int, message: str, code: str) -> None:
    if session.alive:
        session.send(("b", call_id, None, None, None, (message, code), True))


async def run_bls(session: WorkerSession, message: tuple[Any, ...]) -> None:
    """Run one BLS request through the server (scheduling, stats, validation included) and stream back results."""
    call_id, decoupled = message[1], message[-1]
    services = session.services
    if services is None:
        _send_error(session, call_id, "BLS is not available: this model was loaded without a server", "UNAVAILABLE")
        return
    try:
        request = _request(session, message)
        if decoupled:
            sent_final = False
            async for response, final in services.infer_stream(request):
                if isinstance(response, NaiadError):  # not asked for inline: streams raise their errors
                    raise response
                _send_item(session, call_id, response, final)
                sent_final = final
            if not sent_final:
                _send_item(session, call_id, None, True)
        else:
            _send_item(session, call_id, await services.infer_async(request), True)
    except asyncio.CancelledError:
        _send_error(session, call_id, "BLS request was cancelled", "CANCELLED")
    except NaiadError as exc:
        _send_error(session, call_id, exc.message, exc.code.name)
    except Exception as exc:  # anything else becomes the BLS response's error, never the server's
        log.exception("BLS request from %s failed", session.name)
        _send_error(session, call_id, f"{type(exc).__name__}: {exc}", "INTERNAL")


async def run_control(session: WorkerSession, call_id: int, op: str, args: tuple[Any, ...]) -> None:
    """pb_utils.load_model / unload_model / is_model_ready."""
    services = session.services
    try:
        if services is None:
            raise RuntimeError("model control is not available: this model was loaded without a server")
        if op == "load":
            name, config, files = args
            await services.load_model(name, config, files)
            value: Any = None
        elif op == "unload":
            name, unload_dependents = args
            await services.unload_model(name, unload_dependents)
            value = None
        elif op == "ready":
            name, version = args
            try:
                value = bool(services.model_ready(name, version))
            except NaiadError:
                value = False
        else:
            raise RuntimeError(f"unknown model control operation '{op}'")
    except NaiadError as exc:
        if session.alive:
            session.send(("q", call_id, False, exc.message))
        return
    except Exception as exc:  # reported to the model as a TritonModelException
        if session.alive:
            session.send(("q", call_id, False, str(exc)))
        return
    if session.alive:
        session.send(("q", call_id, True, value))


def forward_metric(session: WorkerSession, op: str, args: tuple[Any, ...]) -> None:
    """Hand custom-metric updates to the server's registry (none when the worker runs without a server)."""
    if session.services is None:
        return
    registry = session.services.custom_metrics
    try:
        registry.update(op, *args)
    except Exception:  # a metrics problem must never fail inference
        log.exception("custom metric update from %s failed", session.name)
