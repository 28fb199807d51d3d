"""An append that waits for a session's lock while an erasure of that session holds it
stores nothing erased: the append's own statement finds the tombstone under the lock
(issue 27's race, closed on SQLite, PostgreSQL and Citus by
``Capabilities.screens_erasure``). The append comes from another repository (another
gateway), which never saw the erased message stored: nothing it remembers stands in.

The interleaving is forced, not hoped for: another connection holds the session's row
(PostgreSQL, Citus: on its worker) or the write lock (SQLite); the erasure and then the
append queue behind it; on PostgreSQL and Citus the test waits until both wait on the
lock, in that order, before it lets go, so the erasure commits while the append waits.
(Which workers the racing append reaches on Citus: tests/citus/test_erasure.py.)
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from sessionrepo import AppendResult, Message, NotFound, open_repository
from sessionrepo.models.privacy import ErasureReport

from support.polling import eventually

pytestmark = pytest.mark.contract


@contextmanager
def _holding(url: str, backend: str) -> Iterator[Callable[[], int]]:
    """Hold the session's lock; yields how many other backends wait on a lock (on Citus,
    on any node; always 0 on SQLite, whose waiters poll)."""
    if backend == "sqlite":
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield lambda: 0
        finally:
            conn.rollback()
            conn.close()
        return
    with psycopg.connect(url, autocommit=True) as watcher, psycopg.connect(url) as holder:
        holder.execute("SELECT 1 FROM sessions WHERE id = 's' FOR UPDATE")

        activity = "citus_stat_activity" if backend == "citus" else "pg_stat_activity"

        def waiting() -> int:
            row = watcher.execute(
                f"SELECT count(*) FROM {activity}"
                " WHERE wait_event_type = 'Lock' AND datname = current_database()"
            ).fetchone()
            return int(row[0]) if row else 0

        yield waiting
        holder.rollback()


def _run(work: Callable[[], Any], into: list[Any]) -> threading.Thread:
    def target() -> None:
        try:
            into.append(work())
        except BaseException as exc:
            into.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_an_append_waiting_behind_an_erasure_stores_nothing_it_erased(
    database_url: str, backend: str
) -> None:
    repository = open_repository(database_url)
    other = open_repository(database_url)
    try:
        old = Message.from_openai({"role": "user", "content": "erase me, zebrafinch"})
        repository.append("s", [old])
        # Made before the erasure, never stored: a copy an outbox held back, say.
        held_back = Message.from_openai({"role": "user", "content": "held back, zebrafinch"})
        erased: list[Any] = []
        appended: list[Any] = []
        with _holding(database_url, backend) as waiting:
            eraser = _run(lambda: repository.erase(session_id="s"), erased)
            if backend != "sqlite":
                eventually(lambda: waiting() == 1, "the erasure waits for the session")
            else:
                time.sleep(0.3)
            appender = _run(lambda: other.append("s", [old, held_back]), appended)
            if backend != "sqlite":
                eventually(lambda: waiting() == 2, "the append waits behind the erasure")
            else:
                time.sleep(0.3)
        eraser.join(30)
        appender.join(30)
        assert isinstance(erased[0], ErasureReport), erased
        result = appended[0]
        assert isinstance(result, AppendResult), appended
        if backend != "sqlite":  # the order was forced: the erasure first
            assert erased[0].session_ids == ["s"]
            assert result.inserted == [], (result, old.client_msg_uuid, held_back.client_msg_uuid)
            assert result.erased == [old.client_msg_uuid, held_back.client_msg_uuid]
        # Whatever the order on SQLite, nothing erased is stored afterwards.
        stored = [m.content for m in repository.load_transcript("s")] if _exists(repository) else []
        assert not any("zebrafinch" in str(text) for text in stored), stored
        assert repository.search("zebrafinch") == []
    finally:
        other.close()
        repository.close()


def _exists(repository: Any) -> bool:
    try:
        repository.get_session("s")
    except NotFound:
        return False
    return True
