"""One contender in its own process, answering the harness's commands over a pipe.

Each contender gets a process of its own, so that one library's imports, caches and garbage
never weigh on another's timings. Only one contender runs at a time (the harness waits for
each answer) except in the concurrency step, where several writer processes of the same
contender run together. Messages are never sent over the pipe: each process makes them from
the seed (see :mod:`bench.workload`), so every contender gets the same ones.
"""

from __future__ import annotations

import gc
import importlib.metadata
import multiprocessing
import time
import traceback
import warnings
from multiprocessing.connection import Connection
from typing import Any

from bench.contenders import Contender, Unsupported, contender_class
from bench.databases import Target
from bench.workload import Transcripts


class WorkerError(Exception):
    """The contender failed in its process (the message has its traceback)."""


class UnsupportedStep(Exception):
    """The contender has no way to do this step."""


def _versions(packages: tuple[str, ...]) -> dict[str, str]:
    versions = {}
    for name in packages:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


class _Server:
    def __init__(self, key: str, target: Target, seed: int) -> None:
        self.contender: Contender = contender_class(key)(target)
        self.transcripts = Transcripts(seed)
        self.prepared: dict[str, Any] = {}
        self.kept: dict[str, list[dict[str, Any]]] = {}

    def open(self) -> dict[str, Any]:
        self.contender.open()
        # Imports and setup stay alive for the whole run: keep the collections before each
        # timed step (and any inside it) from walking them again and again.
        gc.collect()
        gc.freeze()
        cls = type(self.contender)
        return {
            "settings": self.contender.settings(),
            "versions": _versions(cls.packages),
            "label": cls.label,
            "usage": cls.usage,
            "batch_api": cls.batch_api,
        }

    def create_sessions(self, session_ids: list[str]) -> None:
        self.contender.create_sessions(session_ids)

    def _calls(self, spec: list[tuple[str, int]]) -> list[tuple[str, list[dict[str, Any]]]]:
        return [
            (session_id, self.transcripts.take(session_id, count)) for session_id, count in spec
        ]

    def flush(self, spec: list[tuple[str, int]], cap: float) -> dict[str, Any]:
        calls = self._calls(spec)
        gc.collect()
        return self.contender.flush(calls, cap)

    def first_write(self, session_id: str, count: int, cap: float) -> dict[str, Any]:
        messages = self.transcripts.take(session_id, count)
        self.kept[session_id] = messages
        gc.collect()
        result = self.contender.flush([(session_id, messages)], cap)
        result["stored"] = self.contender.count(session_id)
        return result

    def reflush(self, session_id: str, count: int, cap: float) -> dict[str, Any]:
        """The same dicts again (the first ``count``: what the first write got through)."""
        messages = self.kept.pop(session_id)[:count]
        gc.collect()
        result = self.contender.flush([(session_id, messages)], cap)
        result["stored"] = self.contender.count(session_id)
        return result

    def seed_transcript(self, session_id: str, count: int) -> dict[str, Any]:
        start = time.perf_counter()
        self.contender.seed_transcript(session_id, self.transcripts.take(session_id, count))
        return {"seconds": time.perf_counter() - start}

    def load(self, session_id: str) -> dict[str, Any]:
        gc.collect()
        return self.contender.load(session_id)

    def seed_listing(self, total: int) -> dict[str, Any]:
        start = time.perf_counter()
        added = self.contender.seed_listing(total)
        return {"added": added, "seconds": time.perf_counter() - start}

    def list_newest(self, limit: int) -> dict[str, Any]:
        gc.collect()
        return self.contender.list_newest(limit)

    def prepare_writes(self, spec: list[tuple[str, int]]) -> None:
        self.prepared["writes"] = self._calls(spec)
        gc.collect()

    def write(self) -> dict[str, Any]:
        calls = self.prepared.pop("writes")
        start = time.perf_counter()
        result = self.contender.flush(calls, float("inf"))
        result["start"] = start
        result["end"] = time.perf_counter()
        return result

    def close(self) -> None:
        self.contender.close()


def serve(connection: Connection, key: str, target: Target, seed: int) -> None:
    """The worker's main loop: ``(method, args)`` in, ``("ok" | "unsupported" | "error",
    value)`` out, until ``close``."""
    warnings.simplefilter("ignore")  # peers' deprecation chatter is not ours to fix here
    try:
        server = _Server(key, target, seed)
    except Exception:
        connection.send(("error", traceback.format_exc()))
        return
    connection.send(("ok", None))
    while True:
        try:
            method, args = connection.recv()
        except EOFError:
            break
        try:
            value = getattr(server, method)(*args)
        except Unsupported as exc:
            connection.send(("unsupported", str(exc)))
        except Exception:
            connection.send(("error", traceback.format_exc()))
        else:
            connection.send(("ok", value))
        if method == "close":
            break
    connection.close()


class Worker:
    """The harness's handle on one contender process."""

    def __init__(self, key: str, target: Target, seed: int) -> None:
        self.key = key
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(
            target=serve, args=(child, key, target, seed), name=f"bench-{key}", daemon=True
        )
        self._process.start()
        child.close()
        self._started = False

    def _receive(self) -> Any:
        status, value = self._connection.recv()
        if status == "unsupported":
            raise UnsupportedStep(value)
        if status == "error":
            raise WorkerError(value)
        return value

    def wait_started(self) -> None:
        if not self._started:
            self._receive()
            self._started = True

    def send(self, method: str, *args: Any) -> None:
        self.wait_started()
        self._connection.send((method, args))

    def receive(self) -> Any:
        return self._receive()

    def call(self, method: str, *args: Any) -> Any:
        self.send(method, *args)
        return self.receive()

    def close(self) -> None:
        try:
            if self._process.is_alive():
                self.call("close")
        except (WorkerError, UnsupportedStep, EOFError, OSError, BrokenPipeError):
            pass
        self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
