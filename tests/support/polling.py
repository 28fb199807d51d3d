"""Bounded polls, for a condition the test cannot be told about (a background drainer's
progress, a server's state): checked every 20 ms until it holds, a failure naming what
never happened once the bound has passed. A healthy run never comes near the bound."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

#: How often a poll looks.
INTERVAL = 0.02


def eventually(condition: Callable[[], object], what: str, *, timeout: float = 30.0) -> None:
    """Wait until ``condition()`` is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:g}s: {what}")
        time.sleep(INTERVAL)


async def eventually_async(
    condition: Callable[[], Awaitable[object]], what: str, *, timeout: float = 30.0
) -> None:
    """:func:`eventually` for a coroutine's condition, sleeping on the event loop."""
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:g}s: {what}")
        await asyncio.sleep(INTERVAL)
