"""usage_rollup: what the insights report counts, per session, UTC day and model

- ``usage_rollup``: ``PRIMARY KEY (session_id, day, model)``; per row the live messages
  of the session's day (on the row of model ``''``), and the day's model calls of the
  model with their token sums and their reported cost (calls without a model on the
  ``''`` row). Kept in the same transaction as the rows it sums, by the library's write
  paths (no trigger: Citus has none across shards); ``ON DELETE CASCADE`` with its
  session; on Citus distributed by ``session_id``, co-located with ``sessions``, so each
  upsert is routed to the shard that holds the session's messages.
- The backfill: the rollup of every stored message and usage record (one
  ``INSERT ... SELECT``, grouped by session: on Citus pushed down to the shards).
- On Citus, ``sessionrepo_append`` (0016's, same signature) is replaced by the same
  function that also adds its messages to the rollup (one routed upsert per run of one
  UTC day's messages).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_DETECT = "SELECT extversion FROM pg_extension WHERE extname = 'citus'"
_TOKEN_KINDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)
#: The rollup's key (the upsert's conflict target) and its columns, in order.
_ROLLUP_KEY = ("session_id", "day", "model")
_ROLLUP_COLUMNS = (*_ROLLUP_KEY, "messages", "calls", *_TOKEN_KINDS, "reported_cost")

# The backfill, per backend (the UTC day of a stored time as the library computes it:
# SQLite keeps UTC text, PostgreSQL timestamptz). Live messages on the '' row of their
# day, calls on their model's row ('' for none).
_BACKFILL = """
INSERT INTO usage_rollup ({columns})
SELECT session_id, day, model, sum(messages), sum(calls), {summed}, sum(reported_cost)
FROM (
    SELECT session_id, {message_day} AS day, '' AS model, count(*) AS messages,
        0 AS calls, {zeros}, 0.0 AS reported_cost
    FROM messages WHERE superseded IS NULL
    GROUP BY session_id, {message_day}
    UNION ALL
    SELECT session_id, {usage_day}, coalesce(model, ''), 0, count(*), {sums},
        coalesce(sum(reported_cost), 0.0)
    FROM usage_records
    GROUP BY session_id, {usage_day}, coalesce(model, '')
) counted
GROUP BY session_id, day, model
"""


def _backfill(dialect: str) -> str:
    def day(column: str) -> str:
        if dialect == "sqlite":
            return f"substr({column}, 1, 10)"
        return f"to_char(timezone('UTC', {column}), 'YYYY-MM-DD')"

    return _BACKFILL.format(
        columns=", ".join(_ROLLUP_COLUMNS),
        summed=", ".join(f"sum({kind})" for kind in _TOKEN_KINDS),
        zeros=", ".join(f"0 AS {kind}" for kind in _TOKEN_KINDS),
        sums=", ".join(f"sum({kind})" for kind in _TOKEN_KINDS),
        message_day=day('"timestamp"'),
        usage_day=day("occurred_at"),
    )


# A frozen copy of 0016's function (as of that revision) with the rollup's upsert.
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
        "p_erased_probe bytea",
        # What it did: 'i' (inserted o_inserted rows from o_first_seq, none when
        # o_first_seq is NULL), 'q' (nothing: parked messages), 'm' (nothing: the row
        # p_verify_* names is not stored), 'x' (nothing: the session was erased); with
        # 'i', the keys already stored and their hashes.
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
_ROLLUP_UPSERT = (
    f"INSERT INTO usage_rollup ({', '.join(_ROLLUP_COLUMNS)}) "
    f"VALUES ({DISTRIBUTION_ARG}, v_day, '', v_day_count, {', '.join(['0'] * 7)}) "
    f"ON CONFLICT ({', '.join(_ROLLUP_KEY)}) "
    "DO UPDATE SET messages = usage_rollup.messages + excluded.messages"
)

_CREATE_TEMPLATE = f"""
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
    v_day text;
    v_day_count bigint := 0;
    v_this_day text;
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
    -- Right after the lock: an erasure that committed while the call waited is seen here.
    IF p_erased_probe IS NOT NULL AND EXISTS (
        SELECT 1 FROM erased_sessions WHERE session_hash = p_erased_probe
    ) THEN
        o_kind := 'x';
        RETURN;
    END IF;
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
{{in_loop}}
    END LOOP;{{after_loop}}
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


_IN_LOOP = f"""
        -- The rollup's messages of the day: one upsert per run of one day's messages.
        v_this_day := to_char(p_timestamp[i] AT TIME ZONE 'UTC', 'YYYY-MM-DD');
        IF v_day_count > 0 AND v_this_day <> v_day THEN
            {_ROLLUP_UPSERT};
            v_day_count := 0;
        END IF;
        v_day := v_this_day;
        v_day_count := v_day_count + 1;"""
_AFTER_LOOP = f"""
    IF v_day_count > 0 THEN
        {_ROLLUP_UPSERT};
    END IF;"""


def _create(*, rollup: bool) -> str:
    """The function's ``CREATE OR REPLACE``: with the rollup's upsert (this revision), or
    as 0016 made it (its downgrade)."""
    return _CREATE_TEMPLATE.replace("{in_loop}", _IN_LOOP if rollup else "").replace(
        "{after_loop}", _AFTER_LOOP if rollup else ""
    )


def _has_citus(connection: sa.Connection) -> bool:
    return connection.exec_driver_sql(_DETECT).first() is not None


def _is_distributed(connection: sa.Connection, table: str) -> bool:
    return (
        connection.exec_driver_sql(
            "SELECT 1 FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid "
            "WHERE c.relname = %(t)s AND c.relnamespace = current_schema()::regnamespace",
            {"t": table},
        ).first()
        is not None
    )


def upgrade() -> None:
    ident = sa.String(255)
    op.create_table(
        "usage_rollup",
        sa.Column("session_id", ident, nullable=False),
        sa.Column("day", sa.String(10), nullable=False),
        sa.Column("model", ident, nullable=False),
        sa.Column("messages", sa.BigInteger(), nullable=False),
        sa.Column("calls", sa.BigInteger(), nullable=False),
        *(sa.Column(kind, sa.BigInteger(), nullable=False) for kind in _TOKEN_KINDS),
        sa.Column("reported_cost", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name="fk_usage_rollup_session_id_sessions",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(*_ROLLUP_KEY, name="pk_usage_rollup"),
    )
    op.create_index("ix_usage_rollup_day", "usage_rollup", ["day"])
    context = op.get_context()
    if context.as_sql:
        return
    connection = op.get_bind()
    citus = context.dialect.name == "postgresql" and _has_citus(connection)
    if citus and _is_distributed(connection, "sessions"):
        # Distributed before the backfill, so that it runs on the shards.
        connection.execute(
            sa.text("SELECT create_distributed_table(:t, :c, colocate_with => :a)"),
            {"t": "usage_rollup", "c": "session_id", "a": "sessions"},
        )
    connection.exec_driver_sql(_backfill(context.dialect.name))
    if citus and _is_distributed(connection, "sessions"):
        connection.exec_driver_sql(_create(rollup=True))  # replaced: stays distributed


def downgrade() -> None:
    context = op.get_context()
    if context.dialect.name == "postgresql" and not context.as_sql:
        connection = op.get_bind()
        if _has_citus(connection) and _is_distributed(connection, "sessions"):
            connection.exec_driver_sql(_create(rollup=False))
    op.drop_index("ix_usage_rollup_day", table_name="usage_rollup")
    op.drop_table("usage_rollup")
