"""sessionrepo on a Citus coordinator: the schema distributed by session id, the hot path
routed to one shard, and the operator's commands across shards.

Needs ``SESSIONREPO_TEST_CITUS_URL`` (``python tests/citus_cluster.py start`` prints one);
without it every test here is skipped with the reason shown, and
``SESSIONREPO_REQUIRE_CITUS=1`` turns the skip into a failure. The contract suite itself
runs on Citus through the ``citus`` backend (see conftest.py).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from sqlalchemy import text
from sqlalchemy.engine import make_url

from sessionrepo import Message, SessionRepository, TranscriptWriter, open_repository
from sessionrepo.cli import main
from sessionrepo.dialects import CitusDialect, PostgresDialect
from sessionrepo.dialects.citus import distribute_schema
from sessionrepo.dialects.citus.engine import CONNECTION_SETTINGS
from sessionrepo.dialects.postgresql.append import PostgresAppend
from sessionrepo.store.codec import message_row
from sessionrepo.store.database import Database
from sessionrepo.store.schema import current_revision, downgrade, head_revision, upgrade

from support.citus_remote import RemoteCommands, assert_one_worker

pytestmark = pytest.mark.citus

#: How migration 0006 leaves the schema: (table, distribution column, co-located with
#: sessions); a reference table has no column.
EXPECTED = {
    "sessions": "id",
    "messages": "session_id",
    "search_backlog": "session_id",
    "message_search": "session_id",
    "pending_outbox": "session_id",
    "search_index_state": None,
    # Migration 0008 (sessionrepo.integrations.adk's state).
    "adk_sessions": "session_id",
    "adk_app_states": None,
    "adk_user_states": None,
    # Migration 0011 (erasure: no table of it names a session in clear).
    "privacy_keys": None,
    "erased_sessions": None,
    "erased_messages": None,
    "privacy_audit": None,
    "retention_policies": None,
    # Migration 0012 (the usage ledger and its prices).
    "usage_records": "session_id",
    "usage_prices": None,
    # Migration 0013 (search by meaning).
    "message_embeddings": "session_id",
    "semantic_index_state": None,
    # Migration 0017 (the usage report's rollup).
    "usage_rollup": "session_id",
    # Migration 0018 (tenants).
    "tenants": None,
}


def _conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def distribution(url: str) -> dict[str, tuple[str, str | None, int]]:
    """``{table: (method, column, colocation id)}`` of the URL's schema."""
    with psycopg.connect(_conninfo(url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT c.relname, p.partmethod, column_to_column_name(p.logicalrelid, p.partkey), "
            "p.colocationid FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid "
            "WHERE c.relnamespace = current_schema()::regnamespace"
        ).fetchall()
    return {str(name): (str(method), column, int(group)) for name, method, column, group in rows}


def assert_distributed(url: str) -> None:
    found = distribution(url)
    assert set(found) == set(EXPECTED)
    anchor = found["sessions"][2]
    for table, column in EXPECTED.items():
        method, found_column, group = found[table]
        if column is None:
            assert method == "n", table
        else:
            assert (method, found_column, group) == ("h", column, anchor), table


# -- the schema --------------------------------------------------------------------------


def test_migrate_distributes_every_table_by_session_id(empty_citus_url: str) -> None:
    result = CliRunner().invoke(main, ["--url", empty_citus_url, "migrate"])
    assert result.exit_code == 0, result.output
    assert_distributed(empty_citus_url)
    with open_repository(empty_citus_url) as repository:
        assert isinstance(repository.database.dialect, CitusDialect)
        # Idempotent: a second run (another process, a re-run) changes nothing.
        assert repository.database.write(distribute_schema) == []
    again = CliRunner().invoke(main, ["--url", empty_citus_url, "migrate"])
    assert again.exit_code == 0, again.output
    assert_distributed(empty_citus_url)


def test_the_migrations_round_trip_on_citus(empty_citus_url: str) -> None:
    database = Database(empty_citus_url)
    try:
        upgrade(database)
        with open_repository(empty_citus_url) as repository:
            repository.append("kept", [Message(role="user", content="survives the round trip")])
        downgrade(database, "0005")
        assert current_revision(database) == "0005"
        assert distribution(empty_citus_url) == {}  # plain tables again, rows back
        with psycopg.connect(_conninfo(empty_citus_url)) as conn:
            assert conn.execute("SELECT count(*) FROM messages").fetchone() == (1,)
        downgrade(database, "base")
        assert current_revision(database) is None
        upgrade(database)
        assert current_revision(database) == head_revision()
        assert_distributed(empty_citus_url)
    finally:
        database.dispose()


def test_later_ddl_reaches_the_distributed_tables(citus_url: str) -> None:
    """What a later revision does (a column, an index, a new session-scoped table) works
    on the distributed schema, and distribute_schema takes the new table in when the
    revision names it."""
    database = Database(citus_url)
    try:

        def later_revision(conn: Any) -> list[str]:
            conn.execute(text("ALTER TABLE messages ADD COLUMN edited_at TIMESTAMPTZ"))
            conn.execute(text("CREATE INDEX ix_messages_edited ON messages (edited_at)"))
            conn.execute(
                text(
                    # A tenant's data: its tenant column and keys as 0018 made them.
                    "CREATE TABLE message_edits (session_id VARCHAR(255) NOT NULL, "
                    "seq BIGINT NOT NULL, note TEXT, "
                    "tenant VARCHAR(63) NOT NULL DEFAULT current_user, "
                    "PRIMARY KEY (session_id, seq, tenant), "
                    "FOREIGN KEY (session_id, tenant) REFERENCES sessions (id, tenant) "
                    "ON DELETE CASCADE)"
                )
            )
            return distribute_schema(conn, also=["message_edits"])

        assert database.write(later_revision) == ["message_edits"]
        found = distribution(citus_url)
        assert found["message_edits"][0:2] == ("h", "session_id")
        assert found["message_edits"][2] == found["sessions"][2]
        with open_repository(citus_url) as repository:
            repository.append("s", [Message(role="user", content="after the new column")])
            assert repository.load_transcript("s")[0].content == "after the new column"
        database.write(
            lambda conn: conn.execute(text("INSERT INTO message_edits VALUES ('s', 1, 'n')"))
        )
    finally:
        database.write(lambda conn: conn.execute(text("DROP TABLE IF EXISTS message_edits")))
        database.write(lambda conn: conn.execute(text("DROP INDEX ix_messages_edited")))
        database.write(
            lambda conn: conn.execute(text("ALTER TABLE messages DROP COLUMN edited_at"))
        )
        database.dispose()


def test_plain_postgresql_is_left_alone(postgres_server: Any) -> None:
    name = postgres_server.new_database()
    try:
        with open_repository(postgres_server.url_for(name)) as repository:
            assert type(repository.database.dialect) is PostgresDialect
            assert repository.database.write(distribute_schema) == []
    finally:
        postgres_server.drop(name)


# -- the hot path: one worker, one-phase commit -------------------------------------------


def test_a_sessions_calls_contact_one_worker_and_commit_in_one_phase(citus_url: str) -> None:
    with (
        RemoteCommands() as remote,
        open_repository(citus_url) as repository,
        TranscriptWriter(repository) as writer,
    ):
        for other in range(8):  # other sessions, on both workers
            repository.append(f"other-{other}", [Message(role="user", content="elsewhere")])
        sid = "hot-" + uuid.uuid4().hex[:8]
        first = [
            Message(role="user", content="hello needle"),
            Message(role="assistant", content="hi"),
        ]
        more = [Message(role="user", content=f"more {i}") for i in range(3)]

        def drain_one() -> None:
            session = repository.get_session(sid)
            parked = [Message(role="user", content="parked needle")]
            writer.outbox.park(sid, parked, session, reason="test")
            assert writer.drain(session_id=sid).replayed == 1

        def re_send_from_another_process() -> None:
            # A gateway that never saw these messages acknowledged: the store decides.
            with open_repository(citus_url) as other:
                assert other.append(sid, first).duplicates == [m.client_msg_uuid for m in first]

        paths: dict[str, Callable[[], object]] = {
            "append (new session)": lambda: repository.append(sid, first, source="cli"),
            "append (re-send)": re_send_from_another_process,
            "append (more)": lambda: repository.append(sid, more),
            "writer write": lambda: writer.write(sid, [Message(role="user", content="w")]),
            "drain of one session": drain_one,
            "load": lambda: repository.load_transcript(sid),
            "load (page)": lambda: repository.load_transcript(sid, after_seq=1, limit=1),
            "session lookup": lambda: repository.get_session(sid),
            "search within the session": lambda: repository.search("needle", session_id=sid),
            "retract": lambda: repository.retract(sid, [more[0].client_msg_uuid]),
            "rewind": lambda: repository.rewind(sid, 6),
            "compact": lambda: repository.compact(
                sid, 2, Message(role="system", content="summary")
            ),
            "pop last": lambda: repository.pop_last(sid),
            "end": lambda: repository.end_session(sid, "done"),
            "clear": lambda: repository.clear_session(sid),
        }
        seen = {name: remote.during(action) for name, action in paths.items()}
        hits = repository.search("needle", session_id=sid)
    workers = {name: assert_one_worker(name, commands) for name, commands in seen.items()}
    assert len(set(workers.values())) == 1, workers  # the session's worker, every time
    # The append really ran there: the whole of it one call of the function migration
    # 0014 made, delegated to that worker (tests/citus/test_append_function.py).
    assert [c for _, c in seen["append (new session)"]] == [
        c for _, c in seen["append (new session)"] if "sessionrepo_append(" in c
    ]
    assert len(seen["append (new session)"]) == 1
    assert not hits  # cleared: nothing of the session is searchable any more


def test_a_broadcast_is_caught(citus_url: str) -> None:
    """The check above can fail: a store-wide listing contacts every worker, and
    PostgreSQL's one-statement append (a data-modifying CTE) commits in two phases."""
    with RemoteCommands() as remote, open_repository(citus_url) as repository:
        for index in range(8):
            repository.append(f"s{index}", [Message(role="user", content="x")])
        listing = remote.during(repository.list_sessions)
        with pytest.raises(AssertionError, match="contacts workers"):
            assert_one_worker("list", listing)

        def plain_postgresql_append() -> None:
            rows = [message_row(Message(role="user", content="through the CTE"), "messages[0]")]
            repository.database.write(
                lambda conn: PostgresAppend.insert_new_messages(
                    repository.database.dialect, conn, "s0", 2, rows, datetime.now(UTC)
                )
            )

        broadcast = remote.during(plain_postgresql_append)
        with pytest.raises(AssertionError, match=r"contacts workers|two phases"):
            assert_one_worker("PostgreSQL's append", broadcast)


# -- every feature across shards ---------------------------------------------------------


def _many_sessions(repository: SessionRepository, count: int) -> list[str]:
    ids = [f"chat-{index:03d}" for index in range(count)]
    for index, sid in enumerate(ids):
        repository.append(
            sid,
            [Message(role="user", content=f"needle number {index}")],
            source="discord" if index % 2 else "slack",
        )
    return ids


def test_search_catch_up_claims_per_session_across_shards(citus_url: str) -> None:
    with open_repository(citus_url) as repository:
        ids = _many_sessions(repository, 30)
        hits = repository.search("needle", limit=100)
        assert sorted(hit.session_id for hit in hits) == ids
        assert {hit.session_id for hit in repository.search("needle", source="slack")} == {
            sid for index, sid in enumerate(ids) if index % 2 == 0
        }
        # A catch-up by the writer's drainer, and the backlog is empty afterwards.
        repository.append("late", [Message(role="user", content="needle late")])
        with TranscriptWriter(repository) as writer:
            writer.drain_round(0.1)
        assert repository.search("late")[0].session_id == "late"


def test_a_searchs_planner_settings_reach_the_workers(citus_url: str) -> None:
    """The search's SET LOCALs go to every worker its statements open a transaction on
    (they choose the plan where the scans run), and each coordinator connection keeps
    its connections to the workers (``CONNECTION_SETTINGS``)."""
    with RemoteCommands() as remote, open_repository(citus_url) as repository:
        ids = _many_sessions(repository, 8)
        repository.catch_up_search_index()
        searches: dict[str, Callable[[], object]] = {
            "store-wide": lambda: repository.search("needle", limit=20),
            "one session": lambda: repository.search("needle", session_id=ids[0]),
        }
        seen = {name: remote.during(action) for name, action in searches.items()}
        with repository.database.engine.connect() as conn:
            kept = conn.exec_driver_sql("SHOW citus.max_cached_conns_per_worker").scalar()
    assert kept == CONNECTION_SETTINGS["citus.max_cached_conns_per_worker"]
    for name, commands in seen.items():
        searched = {w for w, c in commands if "message_search" in c and c.startswith("SELECT")}
        assert searched, (name, commands)
        for worker in searched:
            sent = " ".join(c for w, c in commands if w == worker)
            assert "enable_seqscan" in sent, (name, worker, sent)
    assert_one_worker("one-session search", seen["one session"])


def test_concurrent_catch_ups_share_the_backlog(citus_url: str) -> None:
    with open_repository(citus_url) as writer, open_repository(citus_url) as indexer:
        ids = _many_sessions(writer, 40)
        first = indexer._search.catch_up(limit=5)
        second = writer._search.catch_up()
        assert first + second == len(ids)
        assert indexer._search.backlog() == 0


def test_the_operators_commands_work_across_shards(citus_url: str, tmp_path: Path) -> None:
    runner = CliRunner()
    with open_repository(citus_url) as repository:
        ids = _many_sessions(repository, 12)
        for sid in ids[:4]:
            repository.end_session(sid, "done")
        long_ago = datetime.now(UTC) - timedelta(days=400)
        repository.database.write(
            lambda conn: conn.execute(
                text("UPDATE sessions SET ended_at = :t, last_active_at = :t WHERE id = ANY(:ids)"),
                {"t": long_ago, "ids": ids[:4]},
            )
        )
    exported = tmp_path / "all.jsonl"
    result = runner.invoke(main, ["--url", citus_url, "export", str(exported)])
    assert result.exit_code == 0, result.output
    assert sum(1 for line in exported.read_text().splitlines() if '"session"' in line) >= 12

    result = runner.invoke(main, ["--url", citus_url, "prune", "--older-than", "90d", "--json"])
    assert result.exit_code == 0, result.output
    assert sorted(json.loads(result.output)["session_ids"]) == ids[:4]

    result = runner.invoke(main, ["--url", citus_url, "import", str(exported), "--json"])
    assert result.exit_code == 0, result.output
    with open_repository(citus_url) as repository:
        assert {s.id for s in repository.list_sessions(limit=100).sessions} == set(ids)

    result = runner.invoke(main, ["--url", citus_url, "reindex"])
    assert result.exit_code == 0, result.output
    with open_repository(citus_url) as repository:
        assert len(repository.search("needle", limit=100)) == 12

    result = runner.invoke(main, ["--url", citus_url, "doctor", "--json"])
    assert result.exit_code == 0, result.output
    checks = {check["name"]: check for check in json.loads(result.output)["checks"]}
    distribution_check = checks["postgresql.citus.distribution"]
    assert distribution_check["status"] == "ok"
    for table in EXPECTED:
        assert table in distribution_check["detail"]
    assert "2 active workers" in checks["postgresql.citus.workers"]["detail"]


def test_migrate_leaves_an_applications_tables_alone(empty_citus_url: str) -> None:
    """A gateway's own tables in the same schema, made before sessionrepo's (one with a
    session_id column, one without), stay plain tables; doctor does not count them."""
    with psycopg.connect(_conninfo(empty_citus_url), autocommit=True) as conn:
        conn.execute("CREATE TABLE app_audit (session_id TEXT, what TEXT)")
        conn.execute("CREATE TABLE app_settings (name TEXT PRIMARY KEY, value TEXT)")
        conn.execute(
            "INSERT INTO app_audit VALUES ('s', 'kept'); INSERT INTO app_settings VALUES ('a', 'b')"
        )
    result = CliRunner().invoke(main, ["--url", empty_citus_url, "migrate"])
    assert result.exit_code == 0, result.output
    assert_distributed(empty_citus_url)  # sessionrepo's tables only
    with psycopg.connect(_conninfo(empty_citus_url), autocommit=True) as conn:
        assert conn.execute("SELECT what FROM app_audit").fetchall() == [("kept",)]
        assert conn.execute("SELECT value FROM app_settings").fetchall() == [("b",)]
    result = CliRunner().invoke(main, ["--url", empty_citus_url, "doctor", "--json"])
    checks = {check["name"]: check for check in json.loads(result.output)["checks"]}
    assert checks["postgresql.citus.distribution"]["status"] == "ok", result.output
    assert "app_audit" not in checks["postgresql.citus.distribution"]["detail"]


def test_doctor_reports_a_table_left_undistributed(citus_url: str) -> None:
    database = Database(citus_url)
    try:
        database.write(
            lambda conn: conn.execute(text("SELECT undistribute_table('search_index_state')"))
        )
        result = CliRunner().invoke(main, ["--url", citus_url, "doctor", "--json"])
        checks = {check["name"]: check for check in json.loads(result.output)["checks"]}
        assert result.exit_code == 1
        assert checks["postgresql.citus.distribution"]["status"] == "fail"
        detail = checks["postgresql.citus.distribution"]["detail"]
        assert "search_index_state: not distributed" in detail
    finally:
        assert database.write(distribute_schema) == ["search_index_state"]
        database.dispose()


def _workers(url: str) -> list[str]:
    """The workers' ``postgres`` databases, as URLs."""
    with psycopg.connect(_conninfo(url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT node_name, node_port FROM citus_get_active_worker_nodes() ORDER BY node_port"
        ).fetchall()
    return [f"postgresql://postgres@{host}:{port}/postgres" for host, port in rows]


def test_doctor_checks_every_workers_durability(citus_url: str) -> None:
    """A worker with fsync off, and synchronous_commit off for the gateways' role there,
    fails doctor, naming the worker; the coordinator's own settings are fine."""
    worker = _workers(citus_url)[0]
    role = make_url(citus_url).username
    where = worker.split("@")[1].split("/")[0]
    with psycopg.connect(worker, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET fsync = off")
        conn.execute("SELECT pg_reload_conf()")
        conn.execute(f'ALTER ROLE "{role}" SET synchronous_commit = off')
    try:
        result = CliRunner().invoke(main, ["--url", citus_url, "doctor", "--json"])
        checks = {check["name"]: check for check in json.loads(result.output)["checks"]}
        assert result.exit_code == 1, result.output
        assert checks["postgresql.fsync"]["status"] == "ok"  # the coordinator's
        durability = checks["postgresql.citus.worker_durability"]
        assert durability["status"] == "fail"
        assert f"{where}: fsync = off" in durability["detail"]
        assert f"{where}: synchronous_commit = off" in durability["detail"]
        assert checks["postgresql.citus.worker_versions"]["status"] == "ok"
    finally:
        with psycopg.connect(worker, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET fsync")
            conn.execute("SELECT pg_reload_conf()")
            conn.execute(f'ALTER ROLE "{role}" RESET synchronous_commit')
    result = CliRunner().invoke(main, ["--url", citus_url, "doctor", "--json"])
    checks = {check["name"]: check for check in json.loads(result.output)["checks"]}
    assert checks["postgresql.citus.worker_durability"]["status"] == "ok", result.output
