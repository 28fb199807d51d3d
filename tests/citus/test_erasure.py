"""Erasure on a live Citus cluster, read where the rows are: the shards on the workers.

- An append racing an erasure of its session, each on its own connection, stores
  nothing erased: the one delegated call (migration 0016) finds the tombstone after the
  session's lock, on the session's worker, where the erasure's deletion and its
  tombstone commit as one transaction (one connection, one prepared transaction).
- Erasing a person (a ``user_id``, sessions on both workers, sync and async API) leaves
  no row of theirs and none of their words in any shard of any table it reaches, every
  tombstone on every worker, the other user's rows where they were; each deletion is
  sent to the session's own worker only.
- Retention of single messages (retracted history) removes those rows from the
  session's shard and nothing else.
- The scrub vacuums every shard of every table an erasure deletes from, on every worker.

Needs ``SESSIONREPO_TEST_CITUS_URL`` (``python tests/citus_cluster.py start`` prints
one); skipped without it (failed with ``SESSIONREPO_REQUIRE_CITUS=1``).
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from sessionrepo import (
    AppendResult,
    Message,
    SessionRepository,
    open_async_repository,
    open_repository,
)
from sessionrepo.dialects.citus.append import APPEND_FUNCTION
from sessionrepo.dialects.postgresql.erasure import ERASED_TABLES
from sessionrepo.models.message import utcnow
from sessionrepo.models.privacy import ErasureReport, RetentionPolicy

from support.citus_remote import RemoteCommands, assert_one_worker
from support.polling import eventually

pytestmark = pytest.mark.citus

#: The session-scoped tables an erasure reaches, and the column that names the session.
_SESSION_TABLES = {
    "sessions": "id",
    "messages": "session_id",
    "message_search": "session_id",
    "search_backlog": "session_id",
    "pending_outbox": "session_id",
}


def _conninfo(url: str, port: int | None = None) -> str:
    parsed = make_url(url).set(drivername="postgresql")
    if port is not None:
        parsed = parsed.set(port=port)
    return parsed.render_as_string(hide_password=False)


class Shards:
    """The shards of the URL's schema on each worker, read on that worker directly."""

    def __init__(self, url: str) -> None:
        self.url = url
        with psycopg.connect(_conninfo(url), autocommit=True) as conn:
            self.schema = str(conn.execute("SELECT current_schema()").fetchone()[0])  # type: ignore[index]
            rows = conn.execute(
                "SELECT c.relname, s.shardid, n.nodeport FROM pg_dist_shard s "
                "JOIN pg_class c ON c.oid = s.logicalrelid "
                "JOIN pg_dist_placement p USING (shardid) JOIN pg_dist_node n USING (groupid) "
                "WHERE c.relnamespace = current_schema()::regnamespace AND n.groupid > 0"
            ).fetchall()
        #: ``{table: [(worker port, shard table)]}``
        self.placements: dict[str, list[tuple[int, str]]] = {}
        for table, shard, port in rows:
            self.placements.setdefault(str(table), []).append((int(port), f"{table}_{shard}"))
        self.workers = sorted({port for places in self.placements.values() for port, _ in places})

    def rows(self, table: str, where: str = "true", params: Any = ()) -> dict[int, int]:
        """``{worker port: rows}`` of ``table``'s shards on each worker matching ``where``."""
        found: dict[int, int] = dict.fromkeys(self.workers, 0)
        for port, shard in self.placements[table]:
            with psycopg.connect(_conninfo(self.url, port), autocommit=True) as conn:
                row = conn.execute(
                    f'SELECT count(*) FROM "{self.schema}"."{shard}" WHERE {where}', params
                ).fetchone()
            found[port] += int(row[0]) if row else 0
        return found

    def worker_of(self, session_id: str) -> int:
        with psycopg.connect(_conninfo(self.url), autocommit=True) as conn:
            row = conn.execute(
                "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid) "
                "WHERE p.shardid = get_shard_id_for_distribution_column('sessions', %s::text)",
                [session_id],
            ).fetchone()
        assert row is not None
        return int(row[0])


def _port(worker: str) -> int:
    return int(worker.rsplit(":", 1)[1])


#: The deletion of a session's row, as the coordinator sends it to the shard.
_SESSION_DELETE = re.compile(r"DELETE FROM \S+\.sessions_\d+ sessions ")


def _mentions(command: str, session_id: str) -> bool:
    return f"'{session_id}'::" in command


def _one_transaction_per_worker(sent: list[tuple[str, int, str]]) -> None:
    """Every worker transaction the commands opened was committed, in two phases where
    it wrote on more than one worker: each PREPARE has its COMMIT PREPARED."""
    prepared = [c for _, _, c in sent if c.startswith("PREPARE TRANSACTION")]
    committed = [c for _, _, c in sent if c.startswith("COMMIT PREPARED")]
    assert len(prepared) == len(committed), sent


def _held_by_tombstone(sent: list[tuple[str, int, str]], session_id: str, worker: int) -> None:
    """On the session's worker, its row's deletion and its tombstone went on one
    connection with no commit between them: one transaction there, so whoever waits
    for the row sees both or neither."""
    deletion = next(
        i
        for i, (_, _, command) in enumerate(sent)
        if _SESSION_DELETE.match(command) and _mentions(command, session_id)
    )
    where, connection, _ = sent[deletion]
    assert _port(where) == worker, sent[deletion]
    rest = [(c, command) for w, c, command in sent[deletion + 1 :] if w == where]
    tombstone = next(i for i, (_, command) in enumerate(rest) if "erased_sessions_" in command)
    assert rest[tombstone][0] == connection, (sent[deletion], rest[tombstone])
    between = [command for _, command in rest[:tombstone]]
    assert not any(c.startswith(("COMMIT", "PREPARE")) for c in between), between


# -- the race --------------------------------------------------------------------------


def _run(work: Callable[[], Any], into: list[Any]) -> threading.Thread:
    def target() -> None:
        try:
            into.append(work())
        except BaseException as exc:
            into.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_an_append_racing_an_erasure_stores_nothing_erased(citus_url: str) -> None:
    shards = Shards(citus_url)
    sid = "race-s"
    worker = shards.worker_of(sid)
    old = Message(role="user", content="erase me, zebrafinch")
    # Made before the erasure, never stored: a copy an outbox held back, say.
    held_back = Message(role="user", content="held back, zebrafinch")
    erased: list[Any] = []
    appended: list[Any] = []
    with (
        RemoteCommands() as remote,
        open_repository(citus_url) as repository,
        open_repository(citus_url) as other,  # a gateway that never saw ``old`` stored
    ):
        repository.append(sid, [old])
        conninfo = _conninfo(citus_url)
        with (
            psycopg.connect(conninfo, autocommit=True) as watcher,
            psycopg.connect(conninfo) as holder,
        ):
            # Another client holds the session's row on its worker; the erasure, then
            # the append, queue behind it, in that order (citus_stat_activity sees the
            # workers' backends wait on the row's lock).
            holder.execute("SELECT 1 FROM sessions WHERE id = %s FOR UPDATE", [sid])

            def waiting() -> int:
                row = watcher.execute(
                    "SELECT count(*) FROM citus_stat_activity WHERE wait_event_type = 'Lock'"
                ).fetchone()
                return int(row[0]) if row else 0

            def race() -> None:
                eraser = _run(lambda: repository.erase(session_id=sid, scrub=False), erased)
                eventually(lambda: waiting() == 1, "the erasure waits for the session")
                appender = _run(lambda: other.append(sid, [old, held_back]), appended)
                eventually(lambda: waiting() == 2, "the append waits behind the erasure")
                holder.rollback()
                eraser.join(30)
                appender.join(30)

            sent = remote.during_on(race)
        stored = repository.count_messages([sid])
    assert isinstance(erased[0], ErasureReport), erased
    assert erased[0].session_ids == [sid]
    result = appended[0]
    assert isinstance(result, AppendResult), appended
    assert result.inserted == [], result
    assert result.erased == [old.client_msg_uuid, held_back.client_msg_uuid]
    assert stored == 0
    # The append: the one call, to the session's worker, and (its batch screened after
    # the call answered 'x') nothing written anywhere.
    calls = [(w, c) for w, _, c in sent if f"{APPEND_FUNCTION}(" in c]
    assert len(calls) == 1, calls
    assert _port(assert_one_worker("the racing append", calls)) == worker
    # The erasure: the deletion and the tombstone one transaction on that worker.
    _held_by_tombstone(sent, sid, worker)
    _one_transaction_per_worker(sent)
    assert shards.rows("messages", "content LIKE '%%zebrafinch%%'") == dict.fromkeys(
        shards.workers, 0
    )
    assert shards.rows("sessions", "id = %s", [sid]) == dict.fromkeys(shards.workers, 0)


# -- a person ----------------------------------------------------------------------------


def _alice_and_bob(repository: SessionRepository, shards: Shards) -> list[str]:
    """Alice's sessions, on both workers, each with a message indexed and one in the
    backlog; Bob's beside them. Returns Alice's."""
    alice = [f"alice-{index}" for index in range(6)]
    placed = {sid: shards.worker_of(sid) for sid in alice}
    assert set(placed.values()) == set(shards.workers), placed  # both workers hold some
    for sid in alice:
        repository.append(
            sid, [Message(role="user", content=f"alpacazebra in {sid}")], user_id="alice"
        )
        repository.append(
            f"bob-{sid}", [Message(role="user", content="bob's words")], user_id="bob"
        )
    repository.catch_up_search_index()
    for sid in alice:  # one more, left in the backlog
        repository.append(sid, [Message(role="assistant", content="quinoaparrot reply")])
    return alice


def _erase(url: str, api: str, **selector: Any) -> ErasureReport:
    if api == "sync":
        with open_repository(url) as repository:
            return repository.erase(**selector)

    async def erase() -> ErasureReport:
        async with await open_async_repository(url) as repository:
            return await repository.erase(**selector)

    return asyncio.run(erase())


@pytest.mark.parametrize("api", ["sync", "async"])
def test_erasing_a_person_empties_their_rows_in_every_shard(citus_url: str, api: str) -> None:
    shards = Shards(citus_url)
    with open_repository(citus_url) as repository:
        alice = _alice_and_bob(repository, shards)
    mine = "%s = ANY(%%s)"
    before = {
        table: sum(shards.rows(table, mine % column, [alice]).values())
        for table, column in _SESSION_TABLES.items()
    }
    assert before["messages"] == 12, before
    assert before["message_search"] == 6, before
    with RemoteCommands() as remote:
        sent = remote.during_on(lambda: _erase(citus_url, api, user_id="alice", scrub=False))
    for table, column in _SESSION_TABLES.items():
        assert shards.rows(table, mine % column, [alice]) == dict.fromkeys(shards.workers, 0), table
    for words in ("alpacazebra", "quinoaparrot"):
        assert shards.rows("messages", "content LIKE %s", [f"%{words}%"]) == dict.fromkeys(
            shards.workers, 0
        )
    # Bob's rows are where they were; every worker holds all of Alice's tombstones.
    assert sum(shards.rows("messages", "content = 'bob''s words'").values()) == len(alice)
    assert shards.rows("erased_sessions") == dict.fromkeys(shards.workers, len(alice))
    assert shards.rows("erased_messages") == dict.fromkeys(shards.workers, 2 * len(alice))
    # Workers reached: each session's deletions went to its own worker only; the
    # tombstones, rows of reference tables, to every worker.
    for sid in alice:
        worker = shards.worker_of(sid)
        deletions = [w for w, _, c in sent if c.startswith("DELETE FROM") and _mentions(c, sid)]
        assert len(deletions) >= len(_SESSION_TABLES), (sid, deletions)
        assert {_port(w) for w in deletions} == {worker}, (sid, deletions)
        _held_by_tombstone(sent, sid, worker)
    tombstoned = {_port(w) for w, _, c in sent if "erased_sessions_" in c}
    assert tombstoned == set(shards.workers)
    _one_transaction_per_worker(sent)


# -- single messages ---------------------------------------------------------------------


def test_retention_of_single_messages_removes_only_them_from_the_shard(citus_url: str) -> None:
    shards = Shards(citus_url)
    sid = "single-s"
    worker = shards.worker_of(sid)
    now = utcnow()
    old = now - timedelta(days=20)
    sent = [
        Message(role="user", content="old retracted mangosteen", timestamp=old),
        Message(role="user", content="old but live", timestamp=old),
    ]
    with RemoteCommands() as remote, open_repository(citus_url) as repository:
        repository.append(sid, sent, source="slack")
        repository.retract(sid, [sent[0].client_msg_uuid])
        repository.set_retention_policy(RetentionPolicy(source="slack", superseded_days=10))
        commands = remote.during_on(lambda: repository.apply_retention(now=now))
        kept = [m.content for m in repository.load_transcript(sid, include_retracted=True)]
    assert kept == ["old but live"]
    here = "session_id = %s"
    assert shards.rows("messages", here, [sid]) == {
        port: (1 if port == worker else 0) for port in shards.workers
    }
    assert shards.rows("messages", "content LIKE '%%mangosteen%%'") == dict.fromkeys(
        shards.workers, 0
    )
    assert shards.rows("erased_messages") == dict.fromkeys(shards.workers, 1)
    deletions = [w for w, _, c in commands if c.startswith("DELETE FROM") and _mentions(c, sid)]
    assert deletions, commands
    assert {_port(w) for w in deletions} == {worker}, deletions
    _one_transaction_per_worker(commands)


# -- the scrub ---------------------------------------------------------------------------


def test_the_scrub_vacuums_every_shard_on_every_worker(citus_url: str) -> None:
    shards = Shards(citus_url)
    with RemoteCommands() as remote, open_repository(citus_url) as repository:
        _alice_and_bob(repository, shards)
        repository.erase(user_id="alice", scrub=False)
        sent = remote.during_on(repository.scrub_erased)
    vacuumed = {
        (_port(w), found.group(1))
        for w, _, c in sent
        if (found := re.match(r'VACUUM (?:\S+\.)?"?(\w+_\d+)"?', c))
    }
    expected = {
        (port, shard) for table in ERASED_TABLES for port, shard in shards.placements.get(table, [])
    }
    assert expected, shards.placements
    assert expected <= vacuumed, sorted(expected - vacuumed)
    # And the dead rows are gone from the shards the erasure deleted from.
    for port, shard in shards.placements["messages"]:
        with psycopg.connect(_conninfo(citus_url, port), autocommit=True) as conn:
            row = conn.execute(
                "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = %s", [shard]
            ).fetchone()
        assert row is None or int(row[0]) == 0, (port, shard, row)
