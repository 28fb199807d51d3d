"""Citus: the append as one function, delegated to the worker holding the session's shard

On a Citus coordinator, ``sessionrepo_append`` does a whole append (what PostgreSQL's
one-statement append does: the parked check, the session row locked or created, the
check of the row the caller remembers, the lookup of stored keys, the insert of the new
messages numbered from ``next_seq``, the counters and the activity, the search backlog's
entry) and is distributed by its ``p_session_id`` argument, co-located with ``sessions``.
Called alone (``SELECT sessionrepo_append(...)`` in autocommit), the coordinator sends
the call to the one worker holding the session's shard group, where every statement of
the body is local: one round trip to one worker, committed there in one phase.

A no-op on plain PostgreSQL and SQLite (PostgreSQL's data-modifying CTE does the same in
one statement). The body is a frozen copy: a later revision that adds a message or
session column replaces the function (``CREATE OR REPLACE`` with the new signature, after
dropping this one). The function runs with the search_path of the migration
(``SET search_path FROM CURRENT``): on the worker, the connection the coordinator opens
need not have the caller's.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqlalchemy import Connection

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_DETECT = "SELECT extversion FROM pg_extension WHERE extname = 'citus'"

#: The function's name, and the argument Citus routes its calls by.
FUNCTION = "sessionrepo_append"
DISTRIBUTION_ARG = "p_session_id"

#: The message columns an append inserts, in the order of the function's arrays, and the
#: array element type each travels in (text columns as ``text``: a ``varchar(n)`` column
#: refuses a longer value on the insert, as PostgreSQL's append does).
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
#: An outbox row that holds its session's FIFO (a parked message).
_FIFO_STATE = "state = 'pending'"

_ARGUMENTS = ",\n    ".join(
    [
        f"{DISTRIBUTION_ARG} character varying",
        *(f"p_{name} {kind}[]" for name, kind in MESSAGE_ARGS),
        "p_tool_call_total bigint[]",
        *(f"p_s_{name} {kind}" for name, kind in SESSION_ARGS),
        "p_now timestamptz",
        "p_granularity interval",
        "p_enqueue boolean",
        "p_refuse_conflicts boolean",
        "p_behind_outbox boolean",
        "p_verify_seq bigint",
        "p_verify_key uuid",
        # What it did: 'i' (inserted o_inserted rows from o_first_seq, none when
        # o_first_seq is NULL), 'q' (nothing: parked messages), 'm' (nothing: the row
        # p_verify_* names is not stored); with 'i', the keys already stored and hashes.
        "OUT o_kind text",
        "OUT o_keys uuid[]",
        "OUT o_hashes bytea[]",
        "OUT o_first_seq bigint",
        "OUT o_inserted bigint",
    ]
)
_MESSAGE_NAMES = ", ".join(f'"{name}"' for name, _ in MESSAGE_ARGS)
_MESSAGE_VALUES = ", ".join(f"p_{name}[i]" for name, _ in MESSAGE_ARGS)
_SESSION_NAMES = ", ".join(f'"{name}"' for name, _ in SESSION_ARGS)
_SESSION_VALUES = ", ".join(f"p_s_{name}" for name, _ in SESSION_ARGS)

_CREATE = f"""
CREATE OR REPLACE FUNCTION {FUNCTION}(
    {_ARGUMENTS}
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
        WHERE session_id = {DISTRIBUTION_ARG} AND {_FIFO_STATE}
    ) THEN
        o_kind := 'q';
        RETURN;
    END IF;
    -- Appenders to one session queue here; each statement after it (READ COMMITTED)
    -- sees what the appender before committed.
    SELECT next_seq INTO v_next FROM sessions WHERE id = {DISTRIBUTION_ARG} FOR UPDATE;
    IF p_verify_seq IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM messages
        WHERE session_id = {DISTRIBUTION_ARG} AND seq = p_verify_seq
            AND client_msg_uuid = p_verify_key
    ) THEN
        o_kind := 'm';
        RETURN;
    END IF;
    IF v_next IS NULL THEN
        -- A concurrent first append may create it first: its row is then locked here.
        INSERT INTO sessions (id, {_SESSION_NAMES},
            message_count, tool_call_count, next_seq, last_active_at)
        VALUES ({DISTRIBUTION_ARG}, {_SESSION_VALUES}, 0, 0, 1, p_now)
        ON CONFLICT (id) DO NOTHING;
        SELECT next_seq INTO v_next FROM sessions WHERE id = {DISTRIBUTION_ARG} FOR UPDATE;
    END IF;
    -- One probe of (session_id, client_msg_uuid) per key.
    SELECT array_agg(m.client_msg_uuid), array_agg(m.content_hash) INTO o_keys, o_hashes
    FROM messages m
    WHERE m.session_id = {DISTRIBUTION_ARG} AND m.client_msg_uuid = ANY(p_client_msg_uuid);
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
        INSERT INTO messages (session_id, seq, {_MESSAGE_NAMES})
        VALUES ({DISTRIBUTION_ARG}, v_seq, {_MESSAGE_VALUES});
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
    WHERE id = {DISTRIBUTION_ARG};
    IF p_enqueue THEN
        INSERT INTO search_backlog (session_id, first_seq, count)
        VALUES ({DISTRIBUTION_ARG}, v_next, o_inserted);
    END IF;
END
$body$
"""


def _signature() -> str:
    """The function's argument types (its identity, for DROP and for Citus)."""
    kinds = [
        "character varying",
        *(f"{kind}[]" for _, kind in MESSAGE_ARGS),
        "bigint[]",
        *(kind for _, kind in SESSION_ARGS),
        "timestamptz",
        "interval",
        "boolean",
        "boolean",
        "boolean",
        "bigint",
        "uuid",
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


def upgrade() -> None:
    if op.get_context().dialect.name != "postgresql" or op.get_context().as_sql:
        return
    connection = op.get_bind()
    if not _has_citus(connection) or not _is_distributed(connection, "sessions"):
        return
    connection.exec_driver_sql(_CREATE)
    connection.exec_driver_sql(
        "SELECT create_distributed_function(%(f)s::regprocedure, "
        "distribution_arg_name => %(arg)s, colocate_with => 'sessions')",
        {"f": _signature(), "arg": DISTRIBUTION_ARG},
    )


def downgrade() -> None:
    if op.get_context().dialect.name != "postgresql" or op.get_context().as_sql:
        return
    connection = op.get_bind()
    if _has_citus(connection):
        connection.exec_driver_sql(f"DROP FUNCTION IF EXISTS {_signature()}")
