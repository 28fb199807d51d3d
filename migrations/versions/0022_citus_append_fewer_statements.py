"""Citus: the one-call append in fewer statements, and the open day on the session row

``sessionrepo_append`` (0014, 0016, 0017, its conflict targets 0018's) ran nine
statements for a one-message append and one insert per message, each planned and
executed by Citus on the worker: what made an append on Citus 2.4-2.7 times one on
plain PostgreSQL, and a batch of 100 nine times. The same function, same signature
(``sessionrepo.dialects.citus.append`` calls it unchanged), now:

- locks the session's row and reads its open day with it; then looks up the parked
  messages (only for a writer's batch behind an outbox) and the tombstone (only when
  the call screens erasures: ``erased_sessions``, a reference table every worker holds);
  then, in one probe of (session_id, client_msg_uuid) per key, the stored keys and the
  row the caller remembers (neither for a session the call created: a message row needs
  its session's). Each is a statement on one table naming the session id (or the
  tombstone's hash), which Citus plans on its fast path: three such statements cost less
  on the worker than the one with subqueries that does the same (measured on a loaded
  machine: 0.45 against 0.6 ms), and 0018's checks, guarded by a condition in the
  statement itself, ran even when their argument was NULL. All come after the lock:
  each statement takes its own snapshot (READ COMMITTED), so they see what the appender
  before committed, and an erasure that committed while the call waited;
- counts the messages of the session's open day on the session row, as PostgreSQL's
  and SQLite's appends do since 0020 (``sessions.rollup_day`` and ``rollup_messages``):
  an append of the session's newest UTC day writes no ``usage_rollup`` row; the first
  append of a later day moves the count into the rollup, and messages of an older day
  go there at once (``sessionrepo.store.rollup`` says what reads them);
- inserts the new messages in one statement whatever the batch: one row as
  ``INSERT … VALUES``, more as ``INSERT … SELECT`` from the arrays, which Citus on the
  worker runs there (it reads the rows and copies them into the local shard: no other
  node is contacted), where there was one statement per message;
- then the session's counters and, when the caller asks, the search backlog's entry;
- plans each statement for the call's values (``plan_cache_mode = force_custom_plan``):
  with the session id a constant, Citus plans a fast-path statement straight on the
  local shard, where the generic plan PL/pgSQL switches to after five calls has it
  prune the shards and plan the shard's statement anew at every call (measured: five
  such statements in 0.8 ms against 1.4).

Citus routes no ``INSERT`` in a data-modifying CTE (its router planner refuses INSERT
CTEs, and a CTE it does not route runs through intermediate results), so the counters
and the backlog's entry stay statements of their own. On the common path (a session
that exists, new messages of its open day, the erasure screened, the tip verified) that
is six statements, whatever the batch, where there were ten for one message and 19
for ten. Every statement names the session id (or the tombstone's hash), so the call
stays what 0014 made it: delegated whole to the worker holding the session's shard
group, where every statement is local, one round trip, committed there in one phase.

Sessions stored before this revision have no open day (0020 left the columns empty on
Citus): their counts are in the rollup already. The downgrade puts back 0018's
function, which adds every append to the rollup itself, and moves every open day's
count into the rollup (as 0020's downgrade does, with the tables' row-level security
lifted for it). Both bodies are frozen copies made here. Citus only: a no-op on plain
PostgreSQL and SQLite.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqlalchemy import Connection

revision: str = "0022"
down_revision: str | None = "0021"
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
#: An outbox row that holds its session's FIFO (a parked message).
_FIFO_STATE = "state = 'pending'"
#: usage_rollup's columns after ``messages``, zero for a count of messages (calls, the
#: five token kinds, reported_cost).
_ZEROS = "0, 0, 0, 0, 0, 0, 0"
_ROLLUP_COLUMNS = (
    "session_id, day, model, messages, calls, input_tokens, output_tokens, "
    "cache_read_tokens, cache_write_tokens, reasoning_tokens, reported_cost"
)

# The signature, unchanged since 0016.
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
#: One fresh row's values (its index in the arrays ``v_row``), and those of each row of
#: ``unnest(v_fresh) AS f(i, n)``.
_ROW_VALUES = ", ".join(f"p_{name}[v_row]" for name, _ in MESSAGE_ARGS)
_FRESH_VALUES = ", ".join(f"p_{name}[f.i]" for name, _ in MESSAGE_ARGS)
#: The same in 0018's loop (its index ``i``).
_MESSAGE_VALUES_0018 = ", ".join(f"p_{name}[i]" for name, _ in MESSAGE_ARGS)
_SESSION_NAMES = ", ".join(f'"{name}"' for name, _ in SESSION_ARGS)
_SESSION_VALUES = ", ".join(f"p_s_{name}" for name, _ in SESSION_ARGS)
_HEADER = f"""
CREATE OR REPLACE FUNCTION {FUNCTION}(
    {_ARGUMENTS}
) RETURNS record
LANGUAGE plpgsql
SET search_path FROM CURRENT"""
#: The session's activity after an append at ``p_now`` (as PostgreSQL's append writes it:
#: within the granularity only the lag, in no index, moves, so the update can stay
#: heap-only).
_ACTIVITY = """last_active_at = CASE
            WHEN p_now - last_active_at BETWEEN interval '0' AND p_granularity
            THEN last_active_at ELSE p_now END,
        last_active_lag_us = CASE
            WHEN p_now - last_active_at BETWEEN interval '0' AND p_granularity
            THEN (extract(epoch FROM p_now - last_active_at) * 1000000)::bigint
            ELSE 0 END"""


def _rollup_upsert(day: str, count: str) -> str:
    """The upsert that adds ``count`` messages of ``day`` (SQL expressions) to the
    session's rollup: routed to its shard by the session id."""
    return (
        f"INSERT INTO usage_rollup ({_ROLLUP_COLUMNS}) "
        f"VALUES ({DISTRIBUTION_ARG}, {day}, '', {count}, {_ZEROS}) "
        "ON CONFLICT (session_id, day, model, tenant) "
        "DO UPDATE SET messages = usage_rollup.messages + excluded.messages"
    )


# This revision's function (the module's docstring says what it does, and why so).
_CREATE = f"""{_HEADER}
SET plan_cache_mode = force_custom_plan
AS $body$
DECLARE
    v_next bigint;
    v_held_day text;
    v_held_count bigint;
    v_created boolean := false;
    v_remembered boolean;
    v_total integer := coalesce(array_length(p_client_msg_uuid, 1), 0);
    v_fresh integer[] := '{{}}';
    v_tools bigint := 0;
    v_days text[] := '{{}}';
    v_counts bigint[] := '{{}}';
    v_day text;
    v_at integer;
    v_newest text;
    v_open text;
    v_open_count bigint := 0;
    v_row integer;
BEGIN
    o_kind := 'i';
    o_inserted := 0;
    -- Appenders to one session queue here; each statement after it (READ COMMITTED)
    -- sees what the appender before committed.
    SELECT next_seq, rollup_day, rollup_messages INTO v_next, v_held_day, v_held_count
    FROM sessions WHERE id = {DISTRIBUTION_ARG} FOR UPDATE;
    -- Right after the lock, what the call asks and nothing else, each a statement Citus
    -- plans on its fast path (one table, the session id or the tombstone's hash):
    -- the parked messages (a writer's batch queues behind them), the tombstone (an
    -- erasure that committed while the call waited is seen here).
    IF p_behind_outbox THEN
        PERFORM 1 FROM pending_outbox
        WHERE session_id = {DISTRIBUTION_ARG} AND {_FIFO_STATE} LIMIT 1;
        IF FOUND THEN
            o_kind := 'q';
            RETURN;
        END IF;
    END IF;
    IF p_erased_probe IS NOT NULL THEN
        PERFORM 1 FROM erased_sessions WHERE session_hash = p_erased_probe;
        IF FOUND THEN
            o_kind := 'x';
            RETURN;
        END IF;
    END IF;
    IF v_next IS NULL THEN
        IF p_verify_seq IS NOT NULL THEN
            o_kind := 'm';  -- the row the caller remembers went with its session
            RETURN;
        END IF;
        INSERT INTO sessions (id, {_SESSION_NAMES},
            message_count, tool_call_count, next_seq, last_active_at)
        VALUES ({DISTRIBUTION_ARG}, {_SESSION_VALUES}, 0, 0, 1, p_now)
        ON CONFLICT (id, tenant) DO NOTHING
        RETURNING next_seq INTO v_next;
        v_created := v_next IS NOT NULL;
        IF NOT v_created THEN
            -- A concurrent first append created it first: its row is locked here.
            SELECT next_seq, rollup_day, rollup_messages
            INTO v_next, v_held_day, v_held_count
            FROM sessions WHERE id = {DISTRIBUTION_ARG} FOR UPDATE;
        END IF;
    END IF;
    -- The batch's keys the session stores (none when this call created it: a message
    -- row needs its session's), and the row the caller remembers, in one probe of
    -- (session_id, client_msg_uuid) per key.
    IF NOT v_created THEN
        SELECT
            array_agg(client_msg_uuid) FILTER (WHERE client_msg_uuid = ANY(p_client_msg_uuid)),
            array_agg(content_hash) FILTER (WHERE client_msg_uuid = ANY(p_client_msg_uuid)),
            coalesce(bool_or(seq = p_verify_seq AND client_msg_uuid = p_verify_key), false)
        INTO o_keys, o_hashes, v_remembered
        FROM messages
        WHERE session_id = {DISTRIBUTION_ARG}
            AND client_msg_uuid = ANY(p_client_msg_uuid || p_verify_key);
        IF p_verify_seq IS NOT NULL AND NOT v_remembered THEN
            o_kind := 'm';
            RETURN;
        END IF;
    END IF;
    IF p_refuse_conflicts AND o_keys IS NOT NULL THEN
        IF EXISTS (
            SELECT 1 FROM unnest(o_keys, o_hashes) AS s(k, h)
            JOIN unnest(p_client_msg_uuid, p_content_hash) AS b(k, h) USING (k)
            WHERE s.h <> b.h
        ) THEN
            RETURN;  -- nothing written; the caller names the conflicts
        END IF;
    END IF;
    -- The fresh rows (those whose key is not stored) in batch order, their tool calls,
    -- and their count per UTC day.
    FOR i IN 1 .. v_total LOOP
        CONTINUE WHEN o_keys IS NOT NULL AND p_client_msg_uuid[i] = ANY(o_keys);
        v_fresh := v_fresh || i;
        v_tools := v_tools + coalesce(p_tool_call_total[i], 0);
        v_day := to_char(p_timestamp[i] AT TIME ZONE 'UTC', 'YYYY-MM-DD');
        v_newest := greatest(v_newest, v_day);
        v_at := array_position(v_days, v_day);
        IF v_at IS NULL THEN
            v_days := v_days || v_day;
            v_counts := v_counts || 1::bigint;
        ELSE
            v_counts[v_at] := v_counts[v_at] + 1;
        END IF;
    END LOOP;
    o_inserted := coalesce(array_length(v_fresh, 1), 0);
    IF o_inserted = 0 THEN
        RETURN;
    END IF;
    o_first_seq := v_next;
    -- Numbered from next_seq in batch order, in one statement: one row as INSERT ...
    -- VALUES (on Citus's fast path), more as INSERT ... SELECT from the arrays (Citus on
    -- the worker reads the rows and copies them into the local shard).
    IF o_inserted = 1 THEN
        v_row := v_fresh[1];
        INSERT INTO messages (session_id, seq, {_MESSAGE_NAMES})
        VALUES ({DISTRIBUTION_ARG}, v_next, {_ROW_VALUES});
    ELSE
        INSERT INTO messages (session_id, seq, {_MESSAGE_NAMES})
        SELECT {DISTRIBUTION_ARG}, v_next + f.n - 1, {_FRESH_VALUES}
        FROM unnest(v_fresh) WITH ORDINALITY AS f(i, n);
    END IF;
    -- The session's open day after this append: the newest of its open day and the new
    -- messages' days. Its new messages are counted on the session row; those of other
    -- days, and the count the row kept when a later day opens, go to the rollup.
    v_open := greatest(v_held_day, v_newest);
    FOR j IN 1 .. array_length(v_days, 1) LOOP
        IF v_days[j] = v_open THEN
            v_open_count := v_counts[j];
        ELSE
            {_rollup_upsert("v_days[j]", "v_counts[j]")};
        END IF;
    END LOOP;
    IF v_held_day <> v_open AND v_held_count > 0 THEN
        {_rollup_upsert("v_held_day", "v_held_count")};
    END IF;
    UPDATE sessions SET
        next_seq = next_seq + o_inserted,
        message_count = message_count + o_inserted,
        tool_call_count = tool_call_count + v_tools,
        {_ACTIVITY},
        rollup_day = v_open,
        rollup_messages = CASE WHEN rollup_day = v_open THEN rollup_messages ELSE 0 END
            + v_open_count
    WHERE id = {DISTRIBUTION_ARG};
    IF p_enqueue THEN
        INSERT INTO search_backlog (session_id, first_seq, count)
        VALUES ({DISTRIBUTION_ARG}, v_next, o_inserted);
    END IF;
END
$body$
"""

# 0018's function (0017's body, its conflict targets with the tenant), for the
# downgrade: every statement on its own, one insert per message, the rollup's upsert per
# run of one UTC day's messages.
_CREATE_0018 = f"""{_HEADER}
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
        ON CONFLICT (id, tenant) DO NOTHING;
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
        VALUES ({DISTRIBUTION_ARG}, v_seq, {_MESSAGE_VALUES_0018});
        v_seq := v_seq + 1;
        v_tools := v_tools + coalesce(p_tool_call_total[i], 0);
        -- The rollup's messages of the day: one upsert per run of one day's messages.
        v_this_day := to_char(p_timestamp[i] AT TIME ZONE 'UTC', 'YYYY-MM-DD');
        IF v_day_count > 0 AND v_this_day <> v_day THEN
            {_rollup_upsert("v_day", "v_day_count")};
            v_day_count := 0;
        END IF;
        v_day := v_this_day;
        v_day_count := v_day_count + 1;
    END LOOP;
    IF v_day_count > 0 THEN
        {_rollup_upsert("v_day", "v_day_count")};
    END IF;
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
        {_ACTIVITY}
    WHERE id = {DISTRIBUTION_ARG};
    IF p_enqueue THEN
        INSERT INTO search_backlog (session_id, first_seq, count)
        VALUES ({DISTRIBUTION_ARG}, v_next, o_inserted);
    END IF;
END
$body$
"""

#: The open days' counts moved into the rollup (every tenant's: the downgrade lifts the
#: tables' row-level security for it, as 0020's does), then emptied on the session rows.
_CLOSE_OPEN_DAYS = (
    f"INSERT INTO usage_rollup ({_ROLLUP_COLUMNS}, tenant) "
    f"SELECT s.id, s.rollup_day, '', s.rollup_messages, {_ZEROS}, s.tenant "
    "FROM sessions s WHERE s.rollup_day IS NOT NULL AND s.rollup_messages > 0 "
    "ON CONFLICT (session_id, day, model, tenant) "
    "DO UPDATE SET messages = usage_rollup.messages + excluded.messages",
    "UPDATE sessions SET rollup_messages = 0 WHERE rollup_messages <> 0",
)


def _applies() -> Connection | None:
    """The migration's connection on a Citus coordinator whose ``sessions`` is
    distributed (where the function is), else ``None``."""
    if op.get_context().dialect.name != "postgresql" or op.get_context().as_sql:
        return None
    connection = op.get_bind()
    if connection.exec_driver_sql(_DETECT).first() is None:
        return None
    distributed = connection.exec_driver_sql(
        "SELECT 1 FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid "
        "WHERE c.relname = 'sessions' AND c.relnamespace = current_schema()::regnamespace"
    ).first()
    return connection if distributed is not None else None


def upgrade() -> None:
    connection = _applies()
    if connection is not None:
        connection.exec_driver_sql(_CREATE)  # replaced: stays distributed


def downgrade() -> None:
    connection = _applies()
    if connection is None:
        return
    connection.exec_driver_sql(_CREATE_0018)
    for table in ("sessions", "usage_rollup"):
        connection.exec_driver_sql(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY")
    for statement in _CLOSE_OPEN_DAYS:
        connection.exec_driver_sql(statement)
    for table in ("sessions", "usage_rollup"):
        connection.exec_driver_sql(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
