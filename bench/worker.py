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
import sys
import time
import traceback
import warnings
from multiprocessing.connection import Connection
from typing import Any

from bench.baseline import base_key, use_tree
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


def _distinct(keys: list[str]) -> list[str]:
    """The keys in order, each at its first occurrence."""
    return list(dict.fromkeys(keys))


class _Server:
    def __init__(self, key: str, target: Target, seed: int) -> None:
        self.contender: Contender = contender_class(base_key(key))(target)
        self.transcripts = Transcripts(seed)
        self.prepared: dict[str, Any] = {}
        self.kept: dict[str, list[Any]] = {}
        #: Per session: the keys of every message actually sent (capped calls not
        #: included), in sending order: what the checks compare the stored rows with.
        self.sent: dict[str, list[str]] = {}
        #: Per turn-flush session: the gateway's in-memory transcript (prepared objects).
        self.turns: dict[str, list[Any]] = {}
        #: ... and the keys of that transcript, in the same order.
        self.turn_keys: dict[str, list[str]] = {}
        self.turn_errors: dict[str, str] = {}

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
            # Which tree's package this process runs (a --baseline twin's is the other).
            "sessionrepo_file": getattr(sys.modules.get("sessionrepo"), "__file__", None),
        }

    def create_sessions(self, session_ids: list[str]) -> None:
        self.contender.create_sessions(session_ids)

    def _take(self, session_id: str, count: int) -> tuple[list[dict[str, Any]], list[Any]]:
        """The next ``count`` dicts of the session and what the gateway keeps for them
        (built here, before any timing)."""
        messages = self.transcripts.take(session_id, count)
        return messages, self.contender.prepare(messages)

    def _calls(self, spec: list[tuple[str, int]]) -> tuple[list[Any], list[Any]]:
        taken = [(session_id, self._take(session_id, count)) for session_id, count in spec]
        keys = [(sid, [m["client_msg_uuid"] for m in pair[0]]) for sid, pair in taken]
        return [(sid, pair[1]) for sid, pair in taken], keys

    def _record(self, keys: list[tuple[str, list[str]]], messages: int) -> list[str]:
        """Note the first ``messages`` messages of ``keys`` as sent; the sessions they
        touched."""
        touched: list[str] = []
        left = messages
        for session_id, call in keys:
            if left <= 0:
                break
            self.sent.setdefault(session_id, []).extend(call[:left])
            left -= len(call)
            if session_id not in touched:
                touched.append(session_id)
        return touched

    def _check(self, result: dict[str, Any], sessions: list[str]) -> dict[str, Any]:
        """Count the stored rows with plain SQL against what was sent, and their order.

        Per session: every key sent is stored, nothing else is; the distinct stored keys
        in the store's own order (``seq``, id, timestamp) are the keys in sending order;
        a key stored more than once is a store that stores again (a peer's property,
        never sessionrepo's). ``ok`` is all of that with no duplicate; ``ok_but_stores_again``
        the same with duplicates."""
        self.contender.settle()
        try:
            stored = self.contender.stored_keys(sessions)
        except Unsupported as exc:
            result["check"] = {"unsupported": str(exc)}
            return result
        sent = rows = missing = unexpected = duplicates = 0
        misordered: list[str] = []
        for session_id in sessions:
            expected = _distinct(self.sent.get(session_id, []))
            found = stored.get(session_id, [])
            distinct = _distinct(found)
            sent += len(expected)
            rows += len(found)
            duplicates += len(found) - len(distinct)
            missing += len(set(expected) - set(distinct))
            unexpected += len(set(distinct) - set(expected))
            if distinct != expected and not (set(expected) ^ set(distinct)):
                misordered.append(session_id)
        check: dict[str, Any] = {
            "sessions": len(sessions),
            "sent": sent,
            "rows": rows,
            "missing": missing,
            "unexpected": unexpected,
            "duplicates": duplicates,
            "misordered_sessions": len(misordered),
        }
        if result.get("parked"):
            check["parked"] = result["parked"]
        check["ok"] = not (missing or unexpected or misordered or duplicates)
        check["ok_but_stores_again"] = bool(
            duplicates and not (missing or unexpected or misordered)
        )
        result["check"] = check
        return result

    def _flush_checked(
        self, calls: list[Any], keys: list[tuple[str, list[str]]], cap: float
    ) -> dict[str, Any]:
        gc.collect()
        result = self.contender.flush(calls, cap)
        touched = self._record(keys, result["messages"])
        return self._check(result, touched)

    def flush(self, spec: list[tuple[str, int]], cap: float) -> dict[str, Any]:
        calls, keys = self._calls(spec)
        return self._flush_checked(calls, keys, cap)

    def first_write(self, session_id: str, count: int, cap: float) -> dict[str, Any]:
        messages, prepared = self._take(session_id, count)
        self.kept[session_id] = prepared
        keys = [m["client_msg_uuid"] for m in messages]
        self.kept[session_id + "/keys"] = keys
        return self._flush_checked([(session_id, prepared)], [(session_id, keys)], cap)

    def reflush(self, session_id: str, count: int, cap: float) -> dict[str, Any]:
        """The same objects again (the first ``count``: what the first write got through)."""
        prepared = self.kept.pop(session_id)[:count]
        keys = self.kept.pop(session_id + "/keys")[:count]
        return self._flush_checked([(session_id, prepared)], [(session_id, keys)], cap)

    def seed_turn(self, session_id: str, count: int) -> dict[str, Any]:
        """The stored part of a turn-flush transcript, sent through the contender's own
        write path by this process (so the objects are the ones it sent before), untimed."""
        start = time.perf_counter()
        messages, prepared = self._take(session_id, count)
        try:
            self.contender.seed_turn(session_id, prepared)
        except Unsupported:
            raise
        except Exception as exc:
            # Kept for the turn cells, which then fail with it (a seed that fails is a
            # failure of the write path, not of the harness).
            self.turn_errors[session_id] = f"seeding {count:,} messages failed: {exc!r}"
            raise
        self.turns[session_id] = prepared
        self.turn_keys[session_id] = [m["client_msg_uuid"] for m in messages]
        self._record([(session_id, self.turn_keys[session_id])], count)
        result = self._check({"messages": count, "seconds": 0.0}, [session_id])
        result["seconds"] = time.perf_counter() - start
        return result

    def turn_flush(self, session_id: str, new: int, cap: float) -> dict[str, Any]:
        """A turn: ``new`` new messages added to the kept transcript, flushed whole."""
        if session_id in self.turn_errors:
            raise RuntimeError(self.turn_errors[session_id])
        if session_id not in self.turns:
            raise Unsupported("no stored transcript to re-flush")
        messages, prepared = self._take(session_id, new)
        transcript = self.turns[session_id]
        transcript.extend(prepared)
        keys = self.turn_keys[session_id]
        keys.extend(m["client_msg_uuid"] for m in messages)
        gc.collect()
        result = self.contender.flush([(session_id, transcript)], cap)
        result["stored_before"] = len(transcript) - new
        # The transcript is sent in order, so what a call got through is its first
        # ``messages``: record those not recorded yet. A call the cap cut short before
        # the new ones leaves them to the next round's call, which sends them too.
        recorded = len(self.sent.get(session_id, []))
        done = result["messages"]
        if done > recorded:
            self._record([(session_id, keys[recorded:done])], done - recorded)
        return self._check(result, [session_id])

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
        calls, keys = self.prepared.pop("writes")
        start = time.perf_counter()
        result = self.contender.flush(calls, float("inf"))
        result["start"] = start
        result["end"] = time.perf_counter()
        touched = self._record(keys, result["messages"])
        return self._check(result, touched)

    def close(self) -> None:
        self.contender.close()


def serve(
    connection: Connection, key: str, target: Target, seed: int, tree: str | None = None
) -> None:
    """The worker's main loop: ``(method, args)`` in, ``("ok" | "unsupported" | "error",
    value)`` out, until ``close``. With ``tree``, sessionrepo comes from there (a
    ``--baseline`` twin, see :mod:`bench.baseline`)."""
    warnings.simplefilter("ignore")  # peers' deprecation chatter is not ours to fix here
    try:
        if tree is not None:
            use_tree(tree)
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

    def __init__(self, key: str, target: Target, seed: int, tree: str | None = None) -> None:
        self.key = key
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(
            target=serve,
            args=(child, key, target, seed, tree),
            name=f"bench-{key}",
            daemon=True,
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
