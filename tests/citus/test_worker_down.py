"""One worker of three stopped: the sessions whose shards live on the other two keep
working (append, load, lookup, search, the writer's writes), and the writer parks only
the sessions it cannot reach, until the worker is back.

A cluster of its own (the test stops one of its workers), started from the installed
``citus`` extension by ``tests/citus_cluster.py``; skipped without it (failed with
``SESSIONREPO_REQUIRE_CITUS=1``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from citus_cluster import CitusCluster, CitusUnavailable, check_available

from sessionrepo import BackendUnavailable, Message, TranscriptWriter, open_repository
from sessionrepo.cli import main

pytestmark = pytest.mark.citus


@pytest.fixture(scope="module")
def cluster() -> Iterator[CitusCluster]:
    try:
        check_available()
    except CitusUnavailable as exc:
        if os.environ.get("SESSIONREPO_REQUIRE_CITUS") == "1":
            pytest.fail(f"SESSIONREPO_REQUIRE_CITUS=1 but: {exc}")
        pytest.skip(str(exc))
    made = CitusCluster(workers=3)
    try:
        yield made
    finally:
        made.destroy()


def _worker_of(conn: psycopg.Connection[tuple[object, ...]], session_id: str) -> int:
    """The port of the worker that holds the session's shard of ``sessions``."""
    row = conn.execute(
        "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid) "
        "WHERE p.shardid = get_shard_id_for_distribution_column('sessions', %s::text)",
        [session_id],
    ).fetchone()
    assert row is not None
    return int(str(row[0]))


def test_a_stopped_worker_takes_only_its_own_sessions_down(
    cluster: CitusCluster, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    url = cluster.url
    migrated = CliRunner().invoke(main, ["--url", url, "migrate"])
    assert migrated.exit_code == 0, migrated.output
    ids = [f"chat-{index:02d}" for index in range(24)]
    with psycopg.connect(cluster.coordinator.conninfo(), autocommit=True) as conn:
        placed = {sid: _worker_of(conn, sid) for sid in ids}
    stopped = cluster.workers[0]
    down = [sid for sid in ids if placed[sid] == stopped.port]
    up = [sid for sid in ids if placed[sid] != stopped.port]
    assert down, placed  # 4 shards on 3 workers: some sessions on each side
    assert up, placed

    outbox = f"sqlite:///{tmp_path / 'outbox.db'}"  # beside the gateway, as for outages
    with (
        open_repository(url) as repository,
        TranscriptWriter(repository, outbox_url=outbox, deadline=10.0) as writer,
    ):
        for sid in ids:
            repository.append(sid, [Message(role="user", content=f"needle before {sid}")])
        stopped.stop()
        try:
            # Interleaved: a write that parks must not make the next one park too.
            for sid in sorted(ids, key=lambda s: (s not in down, s)):
                result = writer.write(sid, [Message(role="user", content=f"during {sid}")])
                assert result.status == ("parked" if sid in down else "stored"), sid
            for sid in up:
                appended = repository.append(sid, [Message(role="assistant", content="ok")])
                assert len(appended.inserted) == 1
                assert [m.content for m in repository.load_transcript(sid)] == [
                    f"needle before {sid}",
                    f"during {sid}",
                    "ok",
                ]
                assert repository.get_session(sid).message_count == 3
                assert [hit.session_id for hit in repository.search("needle", session_id=sid)] == [
                    sid
                ]
            with pytest.raises(BackendUnavailable) as caught:
                repository.append(down[0], [Message(role="user", content="direct")])
            assert caught.value.node == f"127.0.0.1:{stopped.port}"
            assert writer.primary_down is None  # the writer never took the database as down
            assert writer.pending() == len(down)
        finally:
            stopped.start()
        report = writer.drain(ignore_backoff=True)
        assert (report.replayed, report.remaining) == (len(down), 0)
        for sid in down:
            assert [m.content for m in repository.load_transcript(sid)] == [
                f"needle before {sid}",
                f"during {sid}",
            ]
