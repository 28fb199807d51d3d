"""sessionrepo, used as a gateway uses it: ``open_repository(url).append(session_id, messages)``.

``sessionrepo``: the gateway keeps ``Message`` objects (``Message.from_openai(d)``, built
before the timed call, as the peers' objects are), and a turn flush sends the same objects
again. ``sessionrepo-dicts``: the gateway's OpenAI-format dicts (stamped with
``client_msg_uuid``) go to ``append`` as they are, so validating them into ``Message``
objects is part of every timed call. ``writer`` / ``writer-drainer``: the same ``Message``
objects through ``TranscriptWriter.write`` (the path a gateway calls), its outbox in a local
SQLite file, without and with its background drainer (``writer.start()``). Load is
``load_transcript`` (``StoredMessage`` objects; ``sessionrepo-dicts``: ``load_openai``, the
wire dicts); list is ``list_sessions`` (newest activity
first, with a preview).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from typing import Any, ClassVar

from bench.contenders.base import (
    Call,
    Contender,
    Message,
    Unsupported,
    seed_count,
    sqlite_pragmas,
    timed,
    timed_calls,
)

_PG_SEED = [
    """
    INSERT INTO sessions (id, source, user_id, started_at, last_active_at, message_count,
        next_seq)
    SELECT 'listed-' || g, 'bench', 'user-' || (g %% 1000),
        now() - g * interval '1 second', now() - g * interval '1 second', 1, 2
    FROM generate_series(1, %(count)s) AS g
    """,
    """
    INSERT INTO messages (session_id, seq, client_msg_uuid, role, content, "timestamp",
        openai_keys, content_hash)
    SELECT 'listed-' || g, 1, gen_random_uuid(), 'user', 'question number ' || g, now(),
        '["role","content"]', decode(md5('question number ' || g), 'hex')
    FROM generate_series(1, %(count)s) AS g
    """,
    "ANALYZE sessions",
    "ANALYZE messages",
]

# SQLite: SQLAlchemy keeps times as naive UTC text and UUIDs as 32 hex digits.
_SQLITE_SEED = """
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {count})
INSERT INTO sessions (id, source, user_id, started_at, last_active_at, message_count, next_seq)
SELECT 'listed-' || n, 'bench', 'user-' || (n % 1000),
    strftime('%Y-%m-%d %H:%M:%S', 'now', '-' || n || ' seconds') || '.000000',
    strftime('%Y-%m-%d %H:%M:%S', 'now', '-' || n || ' seconds') || '.000000', 1, 2
FROM g;
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {count})
INSERT INTO messages (session_id, seq, client_msg_uuid, role, content, "timestamp",
    openai_keys, content_hash)
SELECT 'listed-' || n, 1, lower(hex(randomblob(16))), 'user', 'question number ' || n,
    strftime('%Y-%m-%d %H:%M:%S', 'now') || '.000000', '["role","content"]', randomblob(16)
FROM g;
ANALYZE;
"""


_KEYS_SQL = (
    "SELECT session_id, client_msg_uuid FROM messages WHERE session_id IN ({sessions}) "
    "ORDER BY session_id, seq"
)


def _as_messages(messages: list[Message]) -> list[Any]:
    from sessionrepo import Message as Validated

    return [Validated.from_openai(message) for message in messages]


class SessionRepo(Contender):
    key = "sessionrepo"
    label = "sessionrepo append"
    packages: ClassVar[tuple[str, ...]] = ("sessionrepo", "sqlalchemy", "pydantic", "psycopg")
    keys_sql = _KEYS_SQL
    usage = (
        "`open_repository(url).append(session_id, messages)` of `Message` objects built "
        "before the timed call (`Message.from_openai(d)`, as a gateway keeps them); "
        "`load_transcript`; "
        "`list_sessions(limit=50)`; its own SQLite default `synchronous=FULL`; the search "
        "index is maintained as by default: each append adds a backlog row, and the "
        "indexing itself happens later, in the catch-up (not timed here: "
        "`bench/search_bench.py` measures it)"
    )

    def open(self) -> None:
        from sessionrepo import open_repository

        location = self.target.location
        self.repo = open_repository(location, auto_migrate=True)

    def settings(self) -> dict[str, Any]:
        engine = self.repo.database.engine
        with engine.connect() as connection:
            raw = connection.connection.dbapi_connection
            if self.target.backend == "sqlite":
                values = sqlite_pragmas(raw)
            else:
                values = {
                    "synchronous_commit": connection.exec_driver_sql(
                        "SHOW synchronous_commit"
                    ).scalar()
                }
            connection.rollback()
        return values | {"driver": engine.dialect.driver}

    def create_sessions(self, session_ids: Sequence[str]) -> None:
        for session_id in session_ids:
            self.repo.create_session(session_id, source="bench")

    def prepare(self, messages: list[Message]) -> list[Any]:
        return _as_messages(messages)

    def _append(self, session_id: str, messages: list[Message]) -> int:
        self.repo.append(session_id, messages)
        return 0

    def flush(self, calls: Sequence[Call], cap: float) -> dict[str, Any]:
        return timed_calls(calls, cap, self._append)

    def seed_transcript(self, session_id: str, messages: list[Message]) -> None:
        for start in range(0, len(messages), 1000):
            self.repo.append(session_id, messages[start : start + 1000])

    def load(self, session_id: str) -> dict[str, Any]:
        messages, seconds = timed(lambda: self.repo.load_transcript(session_id))
        return {"messages": len(messages), "seconds": seconds}

    def seed_listing(self, total: int) -> int:
        count = seed_count(self.target, "sessions", total)
        if not count:
            return 0
        connection = self.target.connect()
        try:
            if self.target.backend == "sqlite":
                connection.executescript(_SQLITE_SEED.format(count=int(count)))
            else:
                for statement in _PG_SEED:
                    connection.execute(statement, {"count": count})
        finally:
            connection.close()
        return count

    def list_newest(self, limit: int) -> dict[str, Any]:
        page, seconds = timed(lambda: self.repo.list_sessions(limit=limit))
        return {"sessions": len(page.sessions), "seconds": seconds}

    def close(self) -> None:
        self.repo.close()


class SessionRepoNoIndex(SessionRepo):
    """The same, with the full-text index not maintained on append (``search_index=False``):
    what the index costs, for comparison with peers that have no search."""

    key = "sessionrepo-noindex"
    label = "sessionrepo (search_index=False)"
    usage = "as sessionrepo, opened with `search_index=False` (appends skip the search index)"

    def open(self) -> None:
        import inspect

        from sessionrepo import open_repository

        if "search_index" not in inspect.signature(open_repository).parameters:
            raise Unsupported("this sessionrepo has no search_index option")
        self.repo = open_repository(self.target.location, auto_migrate=True, search_index=False)


class SessionRepoImmediate(SessionRepo):
    """The same, with the full-text index written inside each append's transaction
    (``search_index="immediate"``): a search right after it needs no catch-up."""

    key = "sessionrepo-immediate"
    label = 'sessionrepo (search_index="immediate")'
    usage = (
        'as sessionrepo, opened with `search_index="immediate"` (each append indexes its '
        "messages in its own transaction)"
    )

    def open(self) -> None:
        from sessionrepo import open_repository

        self.repo = open_repository(
            self.target.location, auto_migrate=True, search_index="immediate"
        )


class SessionRepoDicts(SessionRepo):
    """The same, the gateway's dicts passed as they are: validation timed."""

    key = "sessionrepo-dicts"
    label = "sessionrepo append of dicts (validation timed)"
    usage = (
        "as sessionrepo, the gateway's dicts passed to `append` as they are (validation into "
        "`Message` and encoding timed); load is `load_openai`, the OpenAI wire dicts a "
        "gateway sends to the model, straight from the stored JSON (no `StoredMessage`)"
    )

    def prepare(self, messages: list[Message]) -> list[Any]:
        return messages

    def load(self, session_id: str) -> dict[str, Any]:
        load_openai = getattr(self.repo, "load_openai", None)
        if load_openai is None:  # a baseline checkout from before it existed
            raise Unsupported("this sessionrepo has no load_openai")
        messages, seconds = timed(lambda: load_openai(session_id))
        return {"messages": len(messages), "seconds": seconds}


class Writer(SessionRepo):
    """``TranscriptWriter.write`` of the same ``Message`` objects, its outbox in a local
    SQLite file (as the README recommends), no drainer running."""

    key = "writer"
    label = "TranscriptWriter.write"
    drainer = False
    usage = (
        "`TranscriptWriter(repo, outbox_url=<local SQLite file>).write(session_id, messages)` "
        "of `Message` objects built before timing; defaults otherwise (deadline 5 s); no "
        "drainer; a write that parks counts as a failed check (the primary is healthy)"
    )

    def open(self) -> None:
        from sessionrepo import TranscriptWriter, open_repository

        self.repo = open_repository(self.target.location, auto_migrate=True)
        self._scratch = tempfile.mkdtemp(
            prefix="bench-outbox-", dir=os.environ.get("BENCH_SQLITE_DIR")
        )
        outbox = os.path.join(self._scratch, "outbox.db")
        self.writer = TranscriptWriter(self.repo, outbox_url=f"sqlite:///{outbox}")
        if self.drainer:
            self.writer.start()
        self.parked = 0

    def _append(self, session_id: str, messages: list[Message]) -> int:
        result = self.writer.write(session_id, messages)
        if result.status != "stored":
            self.parked += len(messages)
        return 0

    def flush(self, calls: Sequence[Call], cap: float) -> dict[str, Any]:
        before = self.parked
        result = timed_calls(calls, cap, self._append)
        result["parked"] = self.parked - before
        return result

    def seed_transcript(self, session_id: str, messages: list[Message]) -> None:
        raise Unsupported("the writer only writes (load is the repository's: see append)")

    def load(self, session_id: str) -> dict[str, Any]:
        raise Unsupported("the writer only writes")

    def seed_listing(self, total: int) -> int:
        raise Unsupported("the writer only writes")

    def list_newest(self, limit: int) -> dict[str, Any]:
        raise Unsupported("the writer only writes")

    def settle(self) -> None:
        """With the drainer running: wait until its search catch-up has emptied the backlog
        that this contender's writes left, so that it does not run inside the next
        contender's timing (its work during this contender's own cells is counted); then
        embed what the semantic catch-up has left (the drainer does that only while
        writes pause: here, untimed, rather than beside the next contender's cells)."""
        if not self.drainer:
            return
        deadline = time.monotonic() + 30
        connection = self.target.connect()
        try:
            while time.monotonic() < deadline:
                row = connection.execute("SELECT count(*) FROM search_backlog").fetchone()
                if not row[0]:
                    break
                time.sleep(0.05)
        finally:
            connection.close()
        catch_up = getattr(self.repo, "catch_up_semantic_index", None)  # a baseline may lack it
        while catch_up is not None and catch_up(limit=2000):
            pass

    def close(self) -> None:
        self.writer.close()
        self.repo.close()
        shutil.rmtree(self._scratch, ignore_errors=True)


class WriterDrainer(Writer):
    key = "writer-drainer"
    label = "TranscriptWriter.write, drainer running"
    drainer = True
    usage = (
        "as TranscriptWriter.write, with `writer.start()`: the background drainer (outbox "
        "rounds and the search catch-up, every second by default) runs in the same process "
        "while the writes are timed"
    )
