"""run_first_step: a handler runs at once, gets a task only when it waits, and waits like any task would."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any

from naiad.frontends.first_step import run_first_step

REQUEST = contextvars.ContextVar("REQUEST", default="")


class Tasks:
    """The `resume` callback of a frontend: the handler goes on as a task in its context."""

    def __init__(self) -> None:
        self.started: list[asyncio.Task[Any]] = []

    def __call__(self, coroutine: Coroutine[Any, Any, Any], context: contextvars.Context) -> None:
        self.started.append(asyncio.get_running_loop().create_task(coroutine, context=context))


def test_a_handler_that_never_waits_finishes_in_its_first_step_without_a_task() -> None:
    async def body() -> None:
        tasks, answered = Tasks(), []

        async def handler() -> None:
            answered.append(REQUEST.get())

        REQUEST.set("health")
        assert run_first_step(handler(), tasks) is None
        assert answered == ["health"] and tasks.started == []

    asyncio.run(body())


def test_handlers_waiting_on_one_shared_future_all_get_its_result() -> None:
    """Several requests' first steps wait on one future (a model loading on demand), and a task awaits
    it too: each gets the result, in its own context."""

    async def body() -> None:
        loop = asyncio.get_running_loop()
        tasks, loaded, answered = Tasks(), loop.create_future(), []

        async def handler(name: str) -> str:
            REQUEST.set(name)
            version = await loaded
            await asyncio.sleep(0)
            answered.append((REQUEST.get(), version))
            return name

        waited = [run_first_step(handler(f"r{i}"), tasks) for i in range(3)]
        assert all(future is loaded for future in waited) and tasks.started == []
        other = loop.create_task(handler("task"))
        await asyncio.sleep(0)
        loaded.set_result("v1")
        await other
        await asyncio.gather(*tasks.started)
        assert sorted(answered) == [("r0", "v1"), ("r1", "v1"), ("r2", "v1"), ("task", "v1")]
        assert [task.result() for task in tasks.started] == ["r0", "r1", "r2"]

    asyncio.run(body())


def test_cancelling_what_the_first_step_waits_on_delivers_cancelled_error_to_the_handler() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        tasks, execution, seen = Tasks(), loop.create_future(), []

        async def handler() -> str:
            try:
                await execution
            except asyncio.CancelledError:
                seen.append("cancelled")
                await asyncio.sleep(0)  # may still wait while cleaning up
                return "cleaned up"
            return "answered"

        assert run_first_step(handler(), tasks) is execution
        execution.cancel()  # what a frontend does when the client goes away before there is a task
        await asyncio.sleep(0)
        assert len(tasks.started) == 1
        assert await tasks.started[0] == "cleaned up" and seen == ["cancelled"]

    asyncio.run(body())


def test_after_a_bare_yield_the_handler_goes_on_in_a_task_at_once() -> None:
    async def body() -> None:
        tasks = Tasks()

        async def handler() -> int:
            await asyncio.sleep(0)
            return 7

        assert run_first_step(handler(), tasks) is None
        assert len(tasks.started) == 1 and await tasks.started[0] == 7

    asyncio.run(body())
