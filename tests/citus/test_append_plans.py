"""Migration 0024: the append function's statements keep their plans between calls.

The function runs with ``plan_cache_mode = auto`` on every node, so after five calls on
a worker connection PL/pgSQL reuses each statement's generic plan, which Citus prunes to
the shard of the session each call names. What these tests hold it to:

- the setting is the function's own, on the coordinator and on every worker;
- with plans reused, every message lands in its own session's shard: many sessions,
  over every shard, each appended to well past five times, one message and batches,
  re-sends included; each session's routed transcript is what was appended, and a scan
  of every shard finds each message under its own session (a message put in another
  session's shard would be found by the scan and missed by the routed read);
- a role set to ``force_generic_plan`` does not reach the function: the statements
  Citus cannot plan without their values (a batch's ``INSERT … SELECT``) still get a
  plan of their own each call, where under that mode they fail;
- the downgrade puts the forced custom plans back on every node.

Needs ``SESSIONREPO_TEST_CITUS_URL`` (``python tests/citus_cluster.py start`` prints
one); skipped without it (failed with ``SESSIONREPO_REQUIRE_CITUS=1``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from sqlalchemy.engine import make_url

from sessionrepo import Message, open_repository
from sessionrepo.dialects.citus.append import APPEND_FUNCTION
from sessionrepo.store.database import Database
from sessionrepo.store.schema import downgrade, upgrade

from support.sql import conninfo, query

pytestmark = pytest.mark.citus


def _plan_modes(url: str) -> dict[str, str | None]:
    """The function's own ``plan_cache_mode`` on each node (``None``: not set)."""
    nodes = query(
        url,
        "SELECT nodename, nodeport FROM pg_dist_node WHERE noderole = 'primary' "
        "AND isactive ORDER BY nodeport",
    )
    schema = make_url(url).username
    modes: dict[str, str | None] = {}
    for host, port in [("coordinator", None), *nodes]:
        node = make_url(url) if port is None else make_url(url).set(host=host, port=port)
        (config,) = query(
            node.render_as_string(hide_password=False),
            "SELECT proconfig FROM pg_proc WHERE proname = %s AND pronamespace = %s::regnamespace",
            [APPEND_FUNCTION, schema],
        )
        settings = dict(item.split("=", 1) for item in config[0] or ())
        modes[f"{host}:{port}" if port else host] = settings.get("plan_cache_mode")
    return modes


def _shards(url: str) -> int:
    ((count,),) = query(
        url,
        "SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = %s::regclass",
        [f"{make_url(url).username}.messages"],
    )
    return int(count)


@contextmanager
def _role_setting(url: str, name: str, value: str) -> Iterator[None]:
    """The test's role with ``name`` set to ``value`` (on every node: Citus propagates
    it) for the connections opened inside."""
    role = make_url(url).username
    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        conn.execute(f'ALTER ROLE "{role}" SET {name} = {value}')
    try:
        yield
    finally:
        with psycopg.connect(conninfo(url), autocommit=True) as conn:
            conn.execute(f'ALTER ROLE "{role}" RESET {name}')


def test_the_function_names_its_own_plan_mode_on_every_node(citus_url: str) -> None:
    modes = _plan_modes(citus_url)
    assert len(modes) >= 3, modes  # the coordinator and the workers
    assert set(modes.values()) == {"auto"}, modes


def test_with_plans_reused_every_message_lands_in_its_own_sessions_shard(
    citus_url: str,
) -> None:
    sessions = [f"pl-{uuid.uuid4().hex[:8]}-{n}" for n in range(2 * _shards(citus_url))]
    sent: dict[str, list[str]] = {sid: [] for sid in sessions}
    # One pool connection: one coordinator backend, so one connection to each worker,
    # whose plans every call after its fifth reuses.
    with open_repository(citus_url, pool_size=1) as repository:
        for turn in range(7):
            for sid in sessions:
                size = (1, 3)[turn % 2]
                batch = [
                    Message(role="user", content=f"{sid} turn {turn} part {n}") for n in range(size)
                ]
                repository.append(sid, batch)
                if turn == 5:
                    repository.append(sid, batch)  # a re-send: nothing stored twice
                sent[sid].extend(str(m.client_msg_uuid) for m in batch)
        routed = {
            sid: [str(m.client_msg_uuid) for m in repository.load_transcript(sid)]
            for sid in sessions
        }
    assert routed == sent
    scanned = dict(
        query(
            citus_url,
            "SELECT session_id, count(*) FROM messages WHERE session_id LIKE %s "
            "GROUP BY session_id",
            ["pl-%"],
        )
    )
    assert scanned == {sid: len(keys) for sid, keys in sent.items()}


def test_a_role_forcing_generic_plans_does_not_reach_the_function(citus_url: str) -> None:
    sid = "fg-" + uuid.uuid4().hex[:8]
    with (
        _role_setting(citus_url, "plan_cache_mode", "force_generic_plan"),
        open_repository(citus_url) as repository,
    ):
        (mode,) = repository.database.read(
            lambda conn: conn.exec_driver_sql("SHOW plan_cache_mode").one()
        )
        assert mode == "force_generic_plan"  # the role's setting is in force
        for turn in range(3):
            batch = [Message(role="user", content=f"turn {turn} part {n}") for n in range(4)]
            repository.append(sid, batch)
        stored = repository.load_transcript(sid)
    assert [m.seq for m in stored] == list(range(1, 13))


def test_the_downgrade_forces_custom_plans_again(empty_citus_url: str) -> None:
    database = Database(empty_citus_url)
    try:
        upgrade(database)
        assert set(_plan_modes(empty_citus_url).values()) == {"auto"}
        downgrade(database, "0023")
        assert set(_plan_modes(empty_citus_url).values()) == {"force_custom_plan"}
        upgrade(database)
        assert set(_plan_modes(empty_citus_url).values()) == {"auto"}
    finally:
        database.dispose()
