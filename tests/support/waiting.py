"""Waiting for what a server does in its own time: poll a condition until it holds, never sleep a fixed time.

A condition that never holds fails the test after `timeout` seconds with a message naming what was
awaited; the timeouts are generous because the machines running the suite are often loaded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], what: str = "the condition", timeout: float = 30.0,
               interval: float = 0.02) -> T:
    """Call condition() until it returns something truthy, and return that; AssertionError after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


async def wait_until_async(condition: Callable[[], T], what: str = "the condition", timeout: float = 30.0,
                           interval: float = 0.005) -> T:
    """wait_until for a test running on the event loop: the loop keeps running between polls."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)
