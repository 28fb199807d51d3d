"""sessionrepo on a Citus coordinator: the schema distributed by session id, the hot path
routed to one shard, and the operator's commands across shards.

Needs ``SESSIONREPO_TEST_CITUS_URL`` (``python tests/citus_cluster.py start`` prints one);
without it every test here is skipped with the reason shown, and
``SESSIONREPO_REQUIRE_CITUS=1`` turns the skip into a failure. The contract suite itself
runs on Citus through the ``citus`` backend (see conftest.py).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from conftest import CitusServer
from sqlalchemy import event, text
from sqlalchemy.engine import make_url

from sessionrepo import Message, SessionRepository, TranscriptWriter, open_repository
from sessionrepo.cli import main
from sessionrepo.dialects import CitusDialect, PostgresDialect
from sessionrepo.dialects.citus import distribute_schema
from sessionrepo.outbox.table import Outbox, drainer_id
from sessionrepo.store.database import Database
from sessionrepo.store.schema import current_revision, downgrade, head_revision, upgrade

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
}


@pytest.fixture
def citus_url(citus_server: CitusServer) -> Iterator[str]:
    url = citus_server.new_schema()
    yield url
    citus_server.release(url)


@pytest.fixture
def empty_citus_url(citus_server: CitusServer) -> Iterator[str]:
    url = citus_server.new_schema(migrated=False)
    yield url
    citus_server.drop(url)


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
    on the distributed schema, and distribute_schema takes the new table in."""
    database = Database(citus_url)
    try:

        def later_revision(conn: Any) -> list[str]:
            conn.execute(text("ALTER TABLE messages ADD COLUMN edited_at TIMESTAMPTZ"))
            conn.execute(text("CREATE INDEX ix_messages_edited ON messages (edited_at)"))
            conn.execute(
                text(
                    "CREATE TABLE message_edits (session_id VARCHAR(255) NOT NULL "
                    "REFERENCES sessions (id) ON DELETE CASCADE, "
                    "seq BIGINT NOT NULL, note TEXT, PRIMARY KEY (session_id, seq))"
                )
            )
            return distribute_schema(conn)

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
        database.write(lambda conn: conn.execute(text("DROP TABLE message_edits")))
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


# -- the hot path: one shard per statement ----------------------------------------------


class StatementLog:
    """Every statement a repository's engines send, with its parameters."""

    def __init__(self, *databases: Database) -> None:
        self.statements: list[tuple[str, Any]] = []
        self.recording = False
        for database in databases:
            event.listen(database.engine, "before_cursor_execute", self._record)

    def _record(self, conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        if not self.recording:
            return
        executemany = rest[-1]
        if executemany and isinstance(parameters, list | tuple):
            parameters = parameters[0]
        self.statements.append((statement, parameters))

    def during(self, action: Callable[[], object]) -> list[tuple[str, Any]]:
        start = len(self.statements)
        self.recording = True
        try:
            action()
        finally:
            self.recording = False
        return self.statements[start:]


_TRANSACTION_CONTROL = re.compile(r"^\s*(SET|BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE)\b", re.I)


def shard_groups(url: str, statement: str, parameters: Any) -> tuple[list[int], set[str]]:
    """``EXPLAIN`` of ``statement``: the task count of each of its Citus scans, and the
    shard groups (a hash range's lower bound) of the distributed shards its tasks read
    or write (reference tables' shards left out)."""
    with psycopg.connect(_conninfo(url), autocommit=True) as conn:
        plan = "\n".join(
            str(row[0]) for row in conn.execute("EXPLAIN " + statement, parameters or None)
        )
        shards = {int(found) for found in re.findall(r"\b[a-z_]+_(\d{6,})\b", plan)}
        groups: set[str] = set()
        if shards:
            rows = conn.execute(
                "SELECT shardminvalue FROM pg_dist_shard s JOIN pg_dist_partition p "
                "USING (logicalrelid) WHERE shardid = ANY(%s) AND p.partmethod = 'h'",
                [sorted(shards)],
            ).fetchall()
            groups = {str(row[0]) for row in rows}
    return [int(count) for count in re.findall(r"Task Count: (\d+)", plan)], groups


def assert_single_shard(url: str, statements: list[tuple[str, Any]]) -> int:
    """Every statement on a distributed table runs as tasks of one shard group only;
    returns how many statements touched Citus tables."""
    routed = 0
    for statement, parameters in statements:
        if _TRANSACTION_CONTROL.match(statement) or "pg_advisory_xact_lock" in statement:
            continue
        tasks, groups = shard_groups(url, statement, parameters)
        if not tasks:
            continue  # no distributed or reference table in it
        routed += 1
        assert all(count == 1 for count in tasks), f"fans out ({tasks} tasks): {statement}"
        assert len(groups) <= 1, f"touches shard groups {groups}: {statement}"
    return routed


def test_every_hot_path_statement_touches_one_shard(citus_url: str) -> None:
    with open_repository(citus_url) as repository, TranscriptWriter(repository) as writer:
        outbox: Outbox = writer.outbox
        # White-box: the writer writes through a pool of its own (its deadline set on
        # the connections: Database.bounded), which the log must hear too.
        bounded = list(repository.database._bounded.values())
        log = StatementLog(repository.database, outbox.database, *bounded)
        for other in range(8):  # other sessions on other shards
            repository.append(f"other-{other}", [Message(role="user", content="elsewhere")])
        sid = "hot-" + uuid.uuid4().hex[:8]
        first = [Message(role="user", content="hello"), Message(role="assistant", content="hi")]
        paths: dict[str, Callable[[], object]] = {
            "append (new session)": lambda: repository.append(sid, first, source="cli"),
            "append (re-send)": lambda: repository.append(sid, first),
            "append (more)": lambda: repository.append(sid, [Message(role="user", content="more")]),
            "load": lambda: repository.load_transcript(sid),
            "load (page)": lambda: repository.load_transcript(sid, after_seq=1, limit=1),
            "session lookup": lambda: repository.get_session(sid),
            "writer write": lambda: writer.write(sid, [Message(role="user", content="w")]),
            "park": lambda: outbox.park(
                sid,
                [Message(role="user", content="parked")],
                repository.get_session(sid),
                reason="test",
            ),
            "drain claim": lambda: outbox.claim(drainer_id(), limit=10, lease=30.0, session_id=sid),
        }
        routed = {}
        for name, action in paths.items():
            statements = log.during(action)
            assert statements, name
            routed[name] = assert_single_shard(citus_url, statements)
            assert routed[name] >= 1, name
        claimed = outbox.claim(drainer_id(), limit=10, lease=30.0, session_id=sid)
        assert claimed is None  # leased by the claim above: the claim really ran
        assert outbox.count(sid) == 1


def test_a_fan_out_is_caught(citus_url: str) -> None:
    """The check above can fail: a statement across sessions is seen fanning out."""
    with open_repository(citus_url) as repository:
        for index in range(8):
            repository.append(f"s{index}", [Message(role="user", content="x")])
        log = StatementLog(repository.database)
        statements = log.during(repository.list_sessions)
    with pytest.raises(AssertionError, match="fans out"):
        assert_single_shard(citus_url, statements)


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


def test_doctor_reports_a_table_left_undistributed(citus_url: str) -> None:
    database = Database(citus_url)
    try:
        database.write(
            lambda conn: conn.execute(text("CREATE TABLE stray (session_id TEXT, x INT)"))
        )
        result = CliRunner().invoke(main, ["--url", citus_url, "doctor", "--json"])
        checks = {check["name"]: check for check in json.loads(result.output)["checks"]}
        assert result.exit_code == 1
        assert checks["postgresql.citus.distribution"]["status"] == "fail"
        assert "stray: not distributed" in checks["postgresql.citus.distribution"]["detail"]
    finally:
        database.write(lambda conn: conn.execute(text("DROP TABLE stray")))
        database.dispose()
