"""Citus: the one-call append screens erasures, under the session's lock

``sessionrepo_append`` (migration 0014) gains an argument, ``p_erased_probe``: the
session's tombstone hash (``sessionrepo.store.tombstones.session_hash``), or NULL for
not checked. Right after it locks the session's row (or finds none: an erasure deletes
the row it locked and commits its tombstone with the deletion), the function looks the
hash up in ``erased_sessions`` and, when it is there, writes nothing and answers ``'x'``,
as PostgreSQL's append statement does (its ``erased`` and ``visible`` guards). The
function's statements each take their own snapshot (READ COMMITTED), so the look-up
after the lock sees an erasure that committed while the call waited for it.
``erased_sessions`` is a reference table: every worker has all of it, so the look-up is
local to the worker the call runs on (no coordinator read before the append, no other
worker contacted).

A new argument is a new signature: the 0014 function is dropped and this one created and
distributed (by ``p_session_id``, co-located with ``sessions``) in its place; the
downgrade puts 0014's back. Both bodies are frozen copies made here. Citus only: a no-op
on plain PostgreSQL and SQLite.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqlalchemy import Connection

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_DETECT = "SELECT extversion FROM pg_extension WHERE extname = 'citus'"

#: The function's name, and the argument Citus routes its calls by.
FUNCTION = "sessionrepo_append"
DISTRIBUTION_ARG = "p_session_id"

#: The message columns an append inserts, in the order of the function's arrays, and the
#: array element type each travels in (as in 0014).
MESSAGE_ARGS: tuple[tuple[str, str], ...] = (
    ("client_msg_uuid", "uuid"),
    ("role", "text"),
    ("content", "text"),
    ("tool_calls", "text"),
    ("tool_call_id", "text"),
    ("tool_name", "text"),
    ("reasoning", "text"),
    ("finish_reason", "text"),
    ("token_count", "bigint"),
    ("timestamp", "timestamptz"),
    ("platform_message_id", "text"),
    ("extra", "text"),
    ("openai_keys", "text"),
    ("content_hash", "bytea"),
)
#: A new session's columns (but its id) and their types, in argument order.
SESSION_ARGS: tuple[tuple[str, str], ...] = (
    ("source", "text"),
    ("user_id", "text"),
    ("title", "text"),
    ("model", "text"),
    ("model_settings", "text"),
    ("system_prompt", "text"),
    ("parent_session_id", "text"),
    ("started_at", "timestamptz"),
    ("ended_at", "timestamptz"),
    ("end_reason", "text"),
    ("input_tokens", "bigint"),
    ("output_tokens", "bigint"),
    ("metadata", "text"),
    ("forked_from_session_id", "text"),
    ("forked_from_seq", "bigint"),
)
#: The append's options, in argument order (0016 adds the last).
OPTION_ARGS: tuple[tuple[str, str], ...] = (
    ("now", "timestamptz"),
    ("granularity", "interval"),
    ("enqueue", "boolean"),
    ("refuse_conflicts", "boolean"),
    ("behind_outbox", "boolean"),
    ("verify_seq", "bigint"),
    ("verify_key", "uuid"),
)
ERASURE_ARG: tuple[str, str] = ("erased_probe", "bytea")

#: The keys the function's statements name: the row a session is found and locked by
#: (the conflict target of its creation), the columns a message's key is unique in, and
#: a tombstone's key; and the value the call gives each column that names its session.
#: In one place, so that a key that gains a column (a tenant) changes here only.
SESSION_KEY: tuple[str, ...] = ("id",)
MESSAGE_KEY: tuple[str, ...] = ("session_id", "client_msg_uuid")
TOMBSTONE_KEY: tuple[str, ...] = ("session_hash",)
KEY_VALUES: dict[str, str] = {"id": DISTRIBUTION_ARG, "session_id": DISTRIBUTION_ARG}

#: An outbox row that holds its session's FIFO (a parked message).
_FIFO_STATE = "state = 'pending'"


def _options(erasure: bool) -> tuple[tuple[str, str], ...]:
    return (*OPTION_ARGS, ERASURE_ARG) if erasure else OPTION_ARGS


def _arguments(erasure: bool) -> str:
    return ",\n    ".join(
        [
            f"{DISTRIBUTION_ARG} character varying",
            *(f"p_{name} {kind}[]" for name, kind in MESSAGE_ARGS),
            "p_tool_call_total bigint[]",
            *(f"p_s_{name} {kind}" for name, kind in SESSION_ARGS),
            *(f"p_{name} {kind}" for name, kind in _options(erasure)),
            # What it did: 'i' (inserted o_inserted rows from o_first_seq, none when
            # o_first_seq is NULL), 'q' (nothing: parked messages), 'm' (nothing: the
            # row p_verify_* names is not stored), 'x' (nothing: the session was
            # erased; 0016); with 'i', the keys already stored and their hashes.
            "OUT o_kind text",
            "OUT o_keys uuid[]",
            "OUT o_hashes bytea[]",
            "OUT o_first_seq bigint",
            "OUT o_inserted bigint",
        ]
    )


def _session_row() -> str:
    """The condition that names the call's session's row (:data:`SESSION_KEY`)."""
    return " AND ".join(f"{column} = {KEY_VALUES[column]}" for column in SESSION_KEY)


def _messages_of_session(alias: str = "") -> str:
    """The condition that names the call's session's messages (:data:`MESSAGE_KEY` but
    the message's own key)."""
    return " AND ".join(
        f"{alias}{column} = {KEY_VALUES[column]}" for column in MESSAGE_KEY if column in KEY_VALUES
    )


#: Right after the lock: an erasure that committed while the call waited is seen here.
_SCREEN = f"""
    IF p_erased_probe IS NOT NULL AND EXISTS (
        SELECT 1 FROM erased_sessions
        WHERE {" AND ".join(f"{column} = p_erased_probe" for column in TOMBSTONE_KEY)}
    ) THEN
        o_kind := 'x';
        RETURN;
    END IF;"""


def _create(erasure: bool) -> str:
    """The function: 0014's body, and with ``erasure`` the tombstone look-up after the
    session's lock."""
    message_names = ", ".join(f'"{name}"' for name, _ in MESSAGE_ARGS)
    message_values = ", ".join(f"p_{name}[i]" for name, _ in MESSAGE_ARGS)
    session_names = ", ".join(f'"{name}"' for name, _ in SESSION_ARGS)
    session_values = ", ".join(f"p_s_{name}" for name, _ in SESSION_ARGS)
    session = _session_row()
    messages = _messages_of_session()
    screen = _SCREEN if erasure else ""
    return f"""
CREATE OR REPLACE FUNCTION {FUNCTION}(
    {_arguments(erasure)}
) RETURNS record
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $body$
DECLARE
    v_next bigint;
    v_seq bigint;
    v_tools bigint := 0;
BEGIN
    o_kind := 'i';
    o_inserted := 0;
    -- A writer's batch queues behind the session's parked messages.
    IF p_behind_outbox AND EXISTS (
        SELECT 1 FROM pending_outbox
        WHERE {messages} AND {_FIFO_STATE}
    ) THEN
        o_kind := 'q';
        RETURN;
    END IF;
    -- Appenders to one session queue here; each statement after it (READ COMMITTED)
    -- sees what the appender before committed.
    SELECT next_seq INTO v_next FROM sessions WHERE {session} FOR UPDATE;{screen}
    IF p_verify_seq IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM messages
        WHERE {messages} AND seq = p_verify_seq
            AND client_msg_uuid = p_verify_key
    ) THEN
        o_kind := 'm';
        RETURN;
    END IF;
    IF v_next IS NULL THEN
        -- A concurrent first append may create it first: its row is then locked here.
        INSERT INTO sessions (id, {session_names},
            message_count, tool_call_count, next_seq, last_active_at)
        VALUES ({DISTRIBUTION_ARG}, {session_values}, 0, 0, 1, p_now)
        ON CONFLICT ({", ".join(SESSION_KEY)}) DO NOTHING;
        SELECT next_seq INTO v_next FROM sessions WHERE {session} FOR UPDATE;
    END IF;
    -- One probe of the message key per key.
    SELECT array_agg(m.client_msg_uuid), array_agg(m.content_hash) INTO o_keys, o_hashes
    FROM messages m
    WHERE {_messages_of_session("m.")} AND m.client_msg_uuid = ANY(p_client_msg_uuid);
    IF p_refuse_conflicts AND EXISTS (
        SELECT 1 FROM unnest(o_keys, o_hashes) AS s(k, h)
        JOIN unnest(p_client_msg_uuid, p_content_hash) AS b(k, h) USING (k)
        WHERE s.h <> b.h
    ) THEN
        RETURN;  -- nothing written; the caller names the conflicts
    END IF;
    -- Row by row: each an INSERT ... VALUES Citus routes to the local shard.
    v_seq := v_next;
    FOR i IN 1 .. coalesce(array_length(p_client_msg_uuid, 1), 0) LOOP
        CONTINUE WHEN o_keys IS NOT NULL AND p_client_msg_uuid[i] = ANY(o_keys);
        INSERT INTO messages (session_id, seq, {message_names})
        VALUES ({DISTRIBUTION_ARG}, v_seq, {message_values});
        v_seq := v_seq + 1;
        v_tools := v_tools + coalesce(p_tool_call_total[i], 0);
    END LOOP;
    o_inserted := v_seq - v_next;
    IF o_inserted = 0 THEN
        RETURN;
    END IF;
    o_first_seq := v_next;
    -- Within the granularity after last_active_at only the lag (in no index) moves, so
    -- the update can stay heap-only.
    UPDATE sessions SET
        next_seq = next_seq + o_inserted,
        message_count = message_count + o_inserted,
        tool_call_count = tool_call_count + v_tools,
        last_active_at = CASE
            WHEN p_now - last_active_at BETWEEN interval '0' AND p_granularity
            THEN last_active_at ELSE p_now END,
        last_active_lag_us = CASE
            WHEN p_now - last_active_at BETWEEN interval '0' AND p_granularity
            THEN (extract(epoch FROM p_now - last_active_at) * 1000000)::bigint
            ELSE 0 END
    WHERE {session};
    IF p_enqueue THEN
        INSERT INTO search_backlog (session_id, first_seq, count)
        VALUES ({DISTRIBUTION_ARG}, v_next, o_inserted);
    END IF;
END
$body$
"""


def _signature(erasure: bool) -> str:
    """The function's argument types (its identity, for DROP and for Citus)."""
    kinds = [
        "character varying",
        *(f"{kind}[]" for _, kind in MESSAGE_ARGS),
        "bigint[]",
        *(kind for _, kind in SESSION_ARGS),
        *(kind for _, kind in _options(erasure)),
    ]
    return f"{FUNCTION}({', '.join(kinds)})"


def _has_citus(connection: Connection) -> bool:
    return connection.exec_driver_sql(_DETECT).first() is not None


def _is_distributed(connection: Connection, table: str) -> bool:
    return (
        connection.exec_driver_sql(
            "SELECT 1 FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid "
            "WHERE c.relname = %(t)s AND c.relnamespace = current_schema()::regnamespace",
            {"t": table},
        ).first()
        is not None
    )


def _replace(connection: Connection, erasure: bool) -> None:
    """Drop the other revision's function, create and distribute this one."""
    connection.exec_driver_sql(f"DROP FUNCTION IF EXISTS {_signature(not erasure)}")
    connection.exec_driver_sql(_create(erasure))
    connection.exec_driver_sql(
        "SELECT create_distributed_function(%(f)s::regprocedure, "
        "distribution_arg_name => %(arg)s, colocate_with => 'sessions')",
        {"f": _signature(erasure), "arg": DISTRIBUTION_ARG},
    )


def _applies() -> Connection | None:
    """The connection, on a Citus coordinator whose schema is distributed; else None."""
    if op.get_context().dialect.name != "postgresql" or op.get_context().as_sql:
        return None
    connection = op.get_bind()
    if not _has_citus(connection) or not _is_distributed(connection, "sessions"):
        return None
    return connection


def upgrade() -> None:
    connection = _applies()
    if connection is not None:
        _replace(connection, erasure=True)


def downgrade() -> None:
    connection = _applies()
    if connection is not None:
        _replace(connection, erasure=False)
