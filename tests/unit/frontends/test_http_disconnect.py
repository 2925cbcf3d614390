"""until_disconnect: cancels the request's work when the client leaves, through Naiad's connection hook
or, under any other ASGI server, through a watcher on receive()."""

from __future__ import annotations

import asyncio

import pytest

from naiad.frontends.http.disconnect import until_disconnect
from naiad.frontends.http.errors import ClientDisconnected


async def _forever(started: asyncio.Event) -> str:
    started.set()
    await asyncio.sleep(3600)
    return "never"


def test_the_watcher_cancels_the_work_under_another_asgi_server():
    async def body() -> None:
        gone = asyncio.Event()

        async def receive() -> dict:
            await gone.wait()
            return {"type": "http.disconnect"}

        started = asyncio.Event()
        call = asyncio.ensure_future(until_disconnect(receive, _forever(started)))
        await started.wait()
        await asyncio.sleep(0.05)  # past WATCH_AFTER_S: the watcher is waiting on receive()
        gone.set()
        with pytest.raises(ClientDisconnected):
            await asyncio.wait_for(call, 5)

    asyncio.run(body())


def test_the_connection_hook_is_registered_and_forgotten():
    async def body() -> None:
        registered: list = []
        scope = {"extensions": {"naiad.on_disconnect": registered.append}}

        async def receive() -> dict:
            raise AssertionError("with the hook, receive() is not watched")

        assert await until_disconnect(receive, asyncio.sleep(0, "done"), scope) == "done"
        assert callable(registered[0]) and registered[-1] is None

        # The connection runs the callback, then cancels the work: a ClientDisconnected for the handler.
        started = asyncio.Event()
        call = asyncio.ensure_future(until_disconnect(receive, _forever(started), scope))
        await started.wait()
        registered[-1]()
        call.cancel()
        with pytest.raises(ClientDisconnected):
            await call

    asyncio.run(body())
