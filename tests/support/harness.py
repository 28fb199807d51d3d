"""Process and thread helpers the multi-process tests share."""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import sqlite3
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
import pytest

from sessionrepo.store import bridge

from support.polling import eventually

#: How the tests start a child process: a fresh interpreter, as a separate gateway
#: process would be. It finds its worker function (in ``support``) by the module's name,
#: on the path it inherits.
SPAWN = multiprocessing.get_context("spawn")

#: How long a test waits for its child processes' reports.
RUN_TIMEOUT = 180.0


@contextmanager
def children() -> Iterator[list[Any]]:
    """Processes started inside are joined on the way out; stragglers are killed."""
    processes: list[Any] = []
    try:
        yield processes
    finally:
        end = time.monotonic() + 30
        for process in processes:
            process.join(max(0.0, end - time.monotonic()))
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()


def collect_reports(results: Any, count: int, processes: list[Any]) -> list[dict[str, Any]]:
    """``count`` reports from ``results``; fails (naming exit codes) if they do not come."""
    reports: list[dict[str, Any]] = []
    end = time.monotonic() + RUN_TIMEOUT
    while len(reports) < count:
        try:
            reports.append(results.get(timeout=max(0.1, end - time.monotonic())))
        except queue.Empty:
            codes = [p.exitcode for p in processes]
            pytest.fail(f"only {len(reports)} of {count} reports came; exit codes {codes}")
    return reports


class ThreadCall:
    """Runs ``fn`` in a thread; ``done`` is set when it returned or raised."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.elapsed = 0.0
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        began = time.monotonic()
        try:
            self.result = fn()
        except BaseException as exc:
            self.error = exc
        finally:
            self.elapsed = time.monotonic() - began
            self.done.set()

    def join(self) -> None:
        self._thread.join(RUN_TIMEOUT)


@contextmanager
def holding_the_write_lock(url: str, backend: str, session_id: str) -> Iterator[None]:
    """Another connection holds what an append to ``session_id`` must wait for."""
    if backend == "sqlite":
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            conn.rollback()
            conn.close()
        return
    with psycopg.connect(url) as conn:
        conn.execute("SELECT 1 FROM sessions WHERE id = %s FOR UPDATE", (session_id,))
        yield
        conn.rollback()


@asynccontextmanager
async def holding_the_write_lock_off_the_loop(
    url: str, backend: str, session_id: str
) -> AsyncIterator[None]:
    """:func:`holding_the_write_lock` for a test on an event loop: taken and released on a
    thread of its own (one thread: a SQLite connection stays on the thread that made it),
    so the loop keeps running while the lock waits. A writer's drainer commits its
    catch-ups on the loop; a lock taken on the loop could wait for such a commit while
    blocking it."""
    held = holding_the_write_lock(url, backend, session_id)
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=1) as thread:
        await loop.run_in_executor(thread, held.__enter__)
        try:
            yield
        finally:
            await loop.run_in_executor(thread, held.__exit__, None, None, None)


def held_until(event: threading.Event, timeout: float, *, on_loop: bool) -> None:
    """Block the caller until ``event`` is set (at most ``timeout`` seconds): a fault
    hook's hold. ``on_loop``: the caller is sessionrepo's code on an asyncio writer's
    loop (a task), which must let the loop run while it waits."""
    give_up = time.monotonic() + timeout
    while not event.is_set() and time.monotonic() < give_up:
        if on_loop:
            bridge.sleep(0.01)
        else:
            event.wait(0.01)


def until_primary_back(writer: Any, seconds: float = 15.0) -> None:
    """Wait for a ``TranscriptWriter``'s probe to find the primary answering (its
    breaker closed): until then its writes park at once."""
    eventually(lambda: writer.primary_down is None, "the primary back", timeout=seconds)


def error_text(where: str, exc: BaseException) -> str:
    """An exception a child caught, for its report: where, what, and the traceback."""
    return f"{where}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"
