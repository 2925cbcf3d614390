"""Run a request handler's first step at once, as an eager task would, and give it a task only if it waits."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine
from typing import Any

Resume = Callable[[Coroutine[Any, Any, Any], contextvars.Context], None]


def run_first_step(coroutine: Coroutine[Any, Any, Any], resume: Resume) -> asyncio.Future | None:
    """Step `coroutine` now, in a copy of the current context.

    A handler that never waits (health, metadata, an infer request on an inline model) finishes here
    with no task; an infer request reaches the scheduler in this event-loop turn. If it waits on a
    future, that future is returned and `resume(coroutine, context)` is called once it is done (it
    should create the task that goes on); after a bare yield, `resume` is called at once. Errors
    raised by the first step propagate to the caller.
    """
    context = contextvars.copy_context()
    try:
        awaited = context.run(coroutine.send, None)
    except StopIteration:
        return None
    if getattr(awaited, "_asyncio_future_blocking", False):
        awaited._asyncio_future_blocking = False
        awaited.add_done_callback(lambda _: resume(coroutine, context))
        return awaited
    resume(coroutine, context)
    return None
