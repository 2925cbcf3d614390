"""Run a request handler's first step at once, as an eager task would, and give it a task only if it waits.

Measured (benchmarks/run_onnx_bench.py, ONNX add_sub and MLP, HTTP and gRPC, 1 and 8 clients, best
of 3): giving every request a task from the start instead served 0.16-0.73x the requests per second.
Python 3.12's `asyncio.Task(..., eager_start=True)` does this publicly; 3.11 has no public way to
start a task eagerly, so the coroutine is stepped here with the coroutine protocol
(`send(None)`), and a future it then waits on is handed to the task that goes on exactly as a
task's own step would.

Taking delivery of that future: awaiting a pending future marks it as waited on (the `_asyncio_future_blocking`
field of asyncio's Future protocol, asyncio/futures.py) until the driver of the coroutine clears
the mark; while it is set, any other coroutine awaiting the same future fails ("await wasn't used
with future"). Several requests may wait on one future (a model loading on demand), so the mark is
cleared at once, as Task does when its step receives a future. The one private field this module
touches; on Python 3.12 `eager_start` makes it unnecessary.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine
from typing import Any

Resume = Callable[[Coroutine[Any, Any, Any], contextvars.Context], None]


def taken_future(awaited: Any) -> asyncio.Future[Any] | None:
    """What a coroutine's step yielded: the future it now waits on, its delivery taken as a Task does
    (module docstring), or None after a bare yield. For a driver of its own (the frontend workers'
    dispatcher), which needs the coroutine's return value and errors that these runners leave to it."""
    if type(awaited) is asyncio.Future or asyncio.isfuture(awaited):
        awaited._asyncio_future_blocking = False
        return awaited  # type: ignore[no-any-return]
    return None


def run_first_step(coroutine: Coroutine[Any, Any, Any], resume: Resume) -> asyncio.Future[Any] | None:
    """Step `coroutine` now, in a copy of the current context.

    A handler that never waits (health, metadata, an infer request on an inline model) finishes here
    with no task; an infer request reaches the scheduler in this event-loop turn. If it waits on a
    future, that future is returned and `resume(coroutine, context)` is called once it is done (it
    should create the task that goes on); after a bare yield, `resume` is called at once. Errors
    raised by the first step propagate to the caller.
    """
    # run_next_step written out: one call fewer on every request's path
    context = contextvars.copy_context()
    try:
        awaited = context.run(coroutine.send, None)
    except StopIteration:
        return None
    if type(awaited) is asyncio.Future or asyncio.isfuture(awaited):
        awaited._asyncio_future_blocking = False  # delivery taken, as a Task does (module docstring)
        awaited.add_done_callback(lambda _: resume(coroutine, context))
        return awaited
    resume(coroutine, context)
    return None


def run_next_step(coroutine: Coroutine[Any, Any, Any], context: contextvars.Context, resume: Resume) -> asyncio.Future[Any] | None:
    """Step `coroutine` now in `context` (the one its earlier steps ran in), as run_first_step does.

    For a frontend whose `resume` finds the awaited future done: the handler's next step runs in the
    loop callback the future's completion scheduled, instead of in a new task's first step (a task
    and two loop turns fewer for an infer request that waited for its batch or its thread).
    """
    try:
        awaited = context.run(coroutine.send, None)
    except StopIteration:
        return None
    if type(awaited) is asyncio.Future or asyncio.isfuture(awaited):  # (the usual future told apart without a call)
        awaited._asyncio_future_blocking = False  # delivery taken, as a Task does (module docstring)
        awaited.add_done_callback(lambda _: resume(coroutine, context))
        return awaited
    resume(coroutine, context)
    return None
