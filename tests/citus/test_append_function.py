"""The append on Citus as one delegated call: ``sessionrepo_append`` (migrations 0014 and
0016) exists on every node with the signature the dialect calls, is distributed by its
session id co-located with ``sessions``, and an append is that one call, sent to the one
worker holding the session's shard group and committed there in one phase; the locked
path (the fallback, and a schema migrated before 0016) is routed too. The function of 0022
counts the session's open day on its row, and its downgrade moves that count into the
rollup. (The call racing an erasure: tests/citus/test_erasure.py; 0023's update-first
path: tests/citus/test_append_update_first.py.)

Needs ``SESSIONREPO_TEST_CITUS_URL`` (``python tests/citus_cluster.py start`` prints
one); skipped without it (failed with ``SESSIONREPO_REQUIRE_CITUS=1``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from sqlalchemy.engine import make_url

from sessionrepo import (
    ConflictError,
    Message,
    TranscriptWriter,
    open_async_repository,
    open_repository,
)
from sessionrepo.dialects import CitusDialect
from sessionrepo.dialects.base import DirectAppend
from sessionrepo.dialects.citus.append import APPEND_ARGUMENTS, APPEND_FUNCTION
from sessionrepo.errors import QueuedBehindOutbox
from sessionrepo.store.codec import message_row
from sessionrepo.store.database import Database
from sessionrepo.store.schema import downgrade, upgrade

from support.citus_remote import RemoteCommands, assert_one_worker

pytestmark = pytest.mark.citus


def _conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _function_on_nodes(url: str) -> list[int]:
    """How many ``sessionrepo_append`` functions the URL's schema has on the coordinator,
    then on each worker."""
    probe = (
        "SELECT count(*) FROM pg_proc WHERE proname = '{0}' AND pronamespace = '{1}'::regnamespace"
    )
    with psycopg.connect(_conninfo(url), autocommit=True) as conn:
        schema = str(conn.execute("SELECT current_schema()").fetchone()[0])  # type: ignore[index]
        sql = probe.format(APPEND_FUNCTION, schema)
        here = int(conn.execute(sql).fetchone()[0])  # type: ignore[arg-type, index]
        workers = conn.execute(
            "SELECT result FROM run_command_on_workers(%s) ORDER BY nodeport", [sql]
        ).fetchall()
    return [here, *(int(row[0]) for row in workers)]


def _arguments(url: str) -> int:
    """How many arguments (in, out excluded) the schema's function takes."""
    with psycopg.connect(_conninfo(url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT pronargs FROM pg_proc WHERE proname = %s "
            "AND pronamespace = current_schema()::regnamespace",
            [APPEND_FUNCTION],
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_the_function_is_distributed_with_the_sessions(citus_url: str) -> None:
    with psycopg.connect(_conninfo(citus_url), autocommit=True) as conn:
        found = conn.execute(
            "SELECT p.proargnames[1:p.pronargs], "
            "ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) t), "
            "o.distribution_argument_index, o.colocationid "
            "FROM pg_proc p JOIN pg_dist_object o ON o.classid = 'pg_proc'::regclass "
            "AND o.objid = p.oid "
            "WHERE p.proname = %s AND p.pronamespace = current_schema()::regnamespace",
            [APPEND_FUNCTION],
        ).fetchall()
        expected_types = conn.execute(
            "SELECT ARRAY(SELECT format_type(t::regtype, NULL) FROM unnest(%s::text[]) t)",
            [[kind for _, kind in APPEND_ARGUMENTS]],
        ).fetchone()
        sessions_group = conn.execute(
            "SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'sessions'::regclass"
        ).fetchone()
    assert len(found) == 1, found
    names, types, argument, group = found[0]
    # The arguments the dialect passes, in its order, with their types.
    assert names == [name for name, _ in APPEND_ARGUMENTS]
    assert expected_types is not None
    assert types == expected_types[0]
    # Routed by the session id, in the sessions' shard groups.
    assert (argument, group) == (0, sessions_group[0] if sessions_group else None)
    assert _function_on_nodes(citus_url) == [1, 1, 1]


def _calls(commands: list[tuple[str, str]]) -> list[str]:
    return [command for _, command in commands if f"{APPEND_FUNCTION}(" in command]


def test_an_append_is_one_call_on_the_sessions_worker(citus_url: str) -> None:
    sid = "fn-" + uuid.uuid4().hex[:8]
    first = [Message(role="user", content="one"), Message(role="assistant", content="two")]
    with RemoteCommands() as remote, open_repository(citus_url) as repository:
        for other in range(8):  # sessions on both workers
            repository.append(f"other-{other}", [Message(role="user", content="x")])

        def conflict() -> None:
            changed = Message(
                role="user", content="other content", client_msg_uuid=first[0].client_msg_uuid
            )
            with pytest.raises(ConflictError):
                repository.append(sid, [changed], on_conflict="raise")

        def re_send_from_another_process() -> None:
            # A gateway that never saw these messages acknowledged: the store decides.
            with open_repository(citus_url) as other:
                assert other.append(sid, first).duplicates == [m.client_msg_uuid for m in first]

        paths: dict[str, Callable[[], object]] = {
            "new session": lambda: repository.append(sid, first),
            "re-send": re_send_from_another_process,
            "more": lambda: repository.append(sid, [Message(role="tool", content="3")]),
            "refused conflict": conflict,
        }
        seen = {name: remote.during(action) for name, action in paths.items()}
        # A re-send this process saw acknowledged: one routed read (its tip is stored).
        remembered = remote.during(lambda: repository.append(sid, first))
        stored = repository.load_transcript(sid)
        session = repository.get_session(sid)
    workers = {name: assert_one_worker(name, commands) for name, commands in seen.items()}
    assert len(set(workers.values())) == 1, workers
    for name, commands in seen.items():
        # Delegated whole: the call is the only command the worker gets (no BEGIN, no
        # statement of the body sent on its own, no COMMIT of a coordinated transaction).
        assert [command for _, command in commands] == _calls(commands), (name, commands)
        assert len(_calls(commands)) == 1, (name, commands)
    assert len(remembered) == 1, remembered
    assert not _calls(remembered), remembered
    assert assert_one_worker("remembered re-send", remembered) in workers.values()
    # And it did the append's work: numbered, counted, nothing of the refused batch.
    assert [(m.seq, m.content) for m in stored] == [(1, "one"), (2, "two"), (3, "3")]
    assert session.message_count == 3


def test_an_async_append_is_one_call_too(citus_url: str) -> None:
    async def appends() -> None:
        async with await open_async_repository(citus_url) as repository:
            await repository.append("async-s", [Message(role="user", content="a")])
            await repository.append("async-s", [Message(role="user", content="b")])

    with RemoteCommands() as remote:
        commands = remote.during(lambda: asyncio.run(appends()))
    assert_one_worker("async append", commands)
    assert len(_calls(commands)) == 2, commands
    assert [command for _, command in commands] == _calls(commands)


def test_a_batch_behind_parked_messages_queues_in_the_call(citus_url: str) -> None:
    """The function's parked check: with the session's messages parked in this
    database, a writer's batch (``behind_outbox``) writes nothing, in the one call."""
    with (
        RemoteCommands() as remote,
        open_repository(citus_url) as repository,
        TranscriptWriter(repository) as writer,
    ):
        repository.append("parked-s", [Message(role="user", content="first")])
        session = repository.get_session("parked-s")
        writer.outbox.park(
            "parked-s", [Message(role="user", content="parked")], session, reason="t"
        )
        batch = repository.prepare("parked-s", [Message(role="user", content="after")])

        def queued() -> None:
            with pytest.raises(QueuedBehindOutbox):
                repository.append_prepared(batch, behind_outbox=True)

        commands = remote.during(queued)
        assert [m.content for m in repository.load_transcript("parked-s")] == ["first"]
        assert writer.drain(session_id="parked-s").replayed == 1
        repository.append_prepared(batch, behind_outbox=True)  # nothing parked any more
        assert [m.content for m in repository.load_transcript("parked-s")] == [
            "first",
            "parked",
            "after",
        ]
    assert_one_worker("queued batch", commands)
    assert len(_calls(commands)) == 1, commands


def test_the_locked_path_is_routed_too(citus_url: str) -> None:
    with RemoteCommands() as remote, open_repository(citus_url) as repository:
        repository.append("locked-s", [Message(role="user", content="first")])
        dialect = repository.database.dialect
        assert isinstance(dialect, CitusDialect)
        append = DirectAppend(
            session_id="locked-s",
            rows=[message_row(Message(role="user", content="locked"), "messages[0]")],
            new_session={},
            now=datetime.now(UTC),
            enqueue=True,
            refuse_conflicts=False,
        )
        commands = remote.during(lambda: dialect.append(repository.database, append, direct=False))
        assert [m.content for m in repository.load_transcript("locked-s")] == ["first", "locked"]
    assert_one_worker("locked path", commands)
    assert not _calls(commands)
    assert len(commands) > 2  # BEGIN, its statements, COMMIT: the path this test means


def test_the_migration_round_trips_and_a_missing_function_falls_back(
    empty_citus_url: str,
) -> None:
    database = Database(empty_citus_url)
    try:
        upgrade(database)
        assert _function_on_nodes(empty_citus_url) == [1, 1, 1]
        assert _arguments(empty_citus_url) == len(APPEND_ARGUMENTS)
        # Before 0016: 0014's function, without the tombstone hash, on every node.
        downgrade(database, "0015")
        assert _function_on_nodes(empty_citus_url) == [1, 1, 1]
        assert _arguments(empty_citus_url) == len(APPEND_ARGUMENTS) - 1
        downgrade(database, "0013")
        assert _function_on_nodes(empty_citus_url) == [0, 0, 0]
        upgrade(database)
        assert _function_on_nodes(empty_citus_url) == [1, 1, 1]
        with RemoteCommands() as remote, open_repository(empty_citus_url) as repository:
            with_it = remote.during(
                lambda: repository.append("s", [Message(role="user", content="with it")])
            )
            # An operator dropped it: the locked path does the appends, nothing is lost.
            with psycopg.connect(_conninfo(empty_citus_url), autocommit=True) as conn:
                conn.execute(f"DROP FUNCTION {APPEND_FUNCTION}")
            without = remote.during(
                lambda: repository.append("s", [Message(role="user", content="without")])
            )
            assert repository.database.dialect.has_append_function is False  # type: ignore[attr-defined]
            assert [m.content for m in repository.load_transcript("s")] == ["with it", "without"]
            assert repository.get_session("s").message_count == 2
        assert len(_calls(with_it)) == 1, with_it
        assert_one_worker("append without the function", without)
    finally:
        database.dispose()


def _open_days(url: str) -> tuple[list[tuple[str, str | None, int]], list[tuple[str, str, int]]]:
    """Each session's open day and its count, and the rollup's message rows."""
    with psycopg.connect(_conninfo(url), autocommit=True) as conn:
        held = conn.execute(
            "SELECT id, rollup_day, rollup_messages FROM sessions ORDER BY id"
        ).fetchall()
        rolled = conn.execute(
            "SELECT session_id, day, messages FROM usage_rollup WHERE model = '' "
            "ORDER BY session_id, day"
        ).fetchall()
    return [tuple(row) for row in held], [tuple(row) for row in rolled]  # type: ignore[misc]


def test_the_call_counts_the_open_day_on_the_row_and_the_downgrade_moves_it(
    empty_citus_url: str,
) -> None:
    """Migration 0022's function: an append of the session's open day writes no rollup
    row (one message, and a batch: the function's two inserts), a later day moves the
    count into the rollup; its downgrade (0018's function back) moves every open day's
    count into the rollup, and the upgrade after it goes on from there."""
    database = Database(empty_citus_url)
    first = datetime(2026, 11, 2, 9, tzinfo=UTC)
    day, later = "2026-11-02", "2026-11-03"

    def messages(text: str, count: int, days_later: int = 0) -> list[Message]:
        moment = first + timedelta(days=days_later)
        return [Message(role="user", content=f"{text} {n}", timestamp=moment) for n in range(count)]

    try:
        upgrade(database)
        with RemoteCommands() as remote, open_repository(empty_citus_url) as repository:
            repository.append("open-0", messages("w", 1))  # what the store reads once
            calls = remote.during(
                lambda: (
                    repository.append("open-a", messages("a", 1)),
                    repository.append("open-a", messages("b", 1)),
                    repository.append("open-a", messages("c", 10)),
                    repository.append("open-b", messages("d", 3)),
                )
            )
            assert _open_days(empty_citus_url) == (
                [("open-0", day, 1), ("open-a", day, 12), ("open-b", day, 3)],
                [],
            )
            repository.append("open-b", messages("e", 2, days_later=1))
            assert _open_days(empty_citus_url) == (
                [("open-0", day, 1), ("open-a", day, 12), ("open-b", later, 2)],
                [("open-b", day, 3)],
            )
        assert len(_calls(calls)) == 4, calls
        assert [command for _, command in calls] == _calls(calls)
        downgrade(database, "0021")
        assert _arguments(empty_citus_url) == len(APPEND_ARGUMENTS)
        assert _open_days(empty_citus_url) == (
            [("open-0", day, 0), ("open-a", day, 0), ("open-b", later, 0)],
            [("open-0", day, 1), ("open-a", day, 12), ("open-b", day, 3), ("open-b", later, 2)],
        )
        upgrade(database)
        with open_repository(empty_citus_url) as repository:
            repository.append("open-a", messages("f", 1))
            assert repository.get_session("open-a").message_count == 13
        assert _open_days(empty_citus_url)[0][1] == ("open-a", day, 1)
    finally:
        database.dispose()
