"""Citus: the one-call append locks the session by updating its row

``sessionrepo_append`` (0022's body) ran six statements for an append of new messages
to a session that exists: the row's ``SELECT … FOR UPDATE``, the tombstone's probe, the
probe of the batch's keys, the insert, the row's update, the search backlog's entry;
each one Citus plans and runs on the worker, most of the call's time there. The same
function, same signature (``sessionrepo.dialects.citus.append`` calls it unchanged), now
first tries that common append (a session that exists, a batch of new messages of the
session's open UTC day) in a block of its own, a subtransaction:

- the row's ``UPDATE`` is the lock: it moves the counters, the activity and the open
  day's count by the whole batch, only when the row's open day is the batch's one day
  (``rollup_day = b_day``: no ``usage_rollup`` row is due), and its ``RETURNING`` gives
  the first seq. Appenders to one session queue on it as on the ``SELECT … FOR UPDATE``
  before; when the one before committed a later day, or an erasure deleted the row, it
  updates nothing (READ COMMITTED rechecks its condition on the row the other committed);
- after it, what the call asks (the parked messages, the tombstone, the row the caller
  remembers), each a statement of its own, so with a snapshot taken after the lock, as
  in 0022: an erasure that committed while the call waited is seen;
- one message inserted with ``INSERT … VALUES … ON CONFLICT DO NOTHING``, its row count
  the check that its key was not stored (no probe before); a batch probed for stored
  keys, then inserted by ``INSERT … SELECT`` from the arrays. Citus runs an ``INSERT …
  SELECT`` with ``ON CONFLICT`` through intermediate results, one without it as a copy
  into the shard (measured: an append of 10 messages 2.8 ms with it, 2.1 without);
  under the row's lock no appender adds a key between the probe and the insert;
- then the search backlog's entry.

Four statements for one message, five for a batch, where 0022 ran six. When a check
finds that the call must write nothing ('q', 'x', 'm'), or a key is stored, the block
raises ``SQLSTATE 'SR001'`` and its handler catches it: the subtransaction's writes (the
row's update) are rolled back and its row lock released. The answers that write nothing
return at once, and so does a re-send of the whole batch: the stored keys and their
hashes (read after the one row's insert skipped it, or by the batch's probe) are the
answer, as 0022's body gave it, the caller's conflict check included. For part of a
batch stored, and for what the block does not take (a new session, a batch spanning days
or opening a later one, a session stored before 0022 with no open day, an empty batch),
0022's body runs as it did (the lock, the probes, the conflict check, the numbering of
the fresh rows, the rollup). A re-send of one message costs a statement and the
rollback more than in 0022, one of a batch the rollback.

The statements keep 0022's custom plans (``plan_cache_mode = force_custom_plan``): Citus
refuses a generic plan of the batch's ``INSERT … SELECT`` from the arrays, and generic
plans elsewhere (Citus then keeps the local shard's plan across calls) did not make the
benchmark's appends faster. Every statement still names the session id (or the
tombstone's hash), so the call stays what 0014 made it: delegated whole to the worker
holding the session's shard group, one round trip, committed there in one phase (the
block's subtransaction is local to that worker). ``CREATE OR REPLACE`` keeps the
function's distribution. The downgrade puts back 0022's function (a frozen copy made
here, as this revision's is); nothing stored differs between the two, so nothing moves.
Citus only: a no-op on plain PostgreSQL and SQLite.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqlalchemy import Connection

revision: str = "0023"
down_revision: str | None = "0022"
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
#: What the common path's block raises to roll its writes back (a code of no
#: PostgreSQL condition; its handler is the only one that catches it).
_UNDO = "SR001"

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
#: One row's values (its index in the arrays ``v_row``), and those of each row of
#: ``unnest(v_fresh) AS f(i, n)`` (0022's body) or ``generate_series(…) AS f(i)``.
_ROW_VALUES = ", ".join(f"p_{name}[v_row]" for name, _ in MESSAGE_ARGS)
_FRESH_VALUES = ", ".join(f"p_{name}[f.i]" for name, _ in MESSAGE_ARGS)
_SESSION_NAMES = ", ".join(f'"{name}"' for name, _ in SESSION_ARGS)
_SESSION_VALUES = ", ".join(f"p_s_{name}" for name, _ in SESSION_ARGS)
_HEADER = f"""
CREATE OR REPLACE FUNCTION {FUNCTION}(
    {_ARGUMENTS}
) RETURNS record
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_custom_plan"""
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
#: The messages' conflict target (0018's: the key within the tenant).
_KEY = "(session_id, client_msg_uuid, tenant)"


def _rollup_upsert(day: str, count: str) -> str:
    """The upsert that adds ``count`` messages of ``day`` (SQL expressions) to the
    session's rollup: routed to its shard by the session id."""
    return (
        f"INSERT INTO usage_rollup ({_ROLLUP_COLUMNS}) "
        f"VALUES ({DISTRIBUTION_ARG}, {day}, '', {count}, {_ZEROS}) "
        "ON CONFLICT (session_id, day, model, tenant) "
        "DO UPDATE SET messages = usage_rollup.messages + excluded.messages"
    )


# 0022's variables, and its body after them: this revision's function runs it after its
# block, for every call the block does not take; the downgrade's function is it alone.
_DECLARE_0022 = """
    v_next bigint;
    v_held_day text;
    v_held_count bigint;
    v_created boolean := false;
    v_remembered boolean;
    v_total integer := coalesce(array_length(p_client_msg_uuid, 1), 0);
    v_fresh integer[] := '{}';
    v_tools bigint := 0;
    v_days text[] := '{}';
    v_counts bigint[] := '{}';
    v_day text;
    v_at integer;
    v_newest text;
    v_open text;
    v_open_count bigint := 0;
    v_row integer;"""
_BODY_0022 = f"""
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
    END IF;"""

# This revision's block (the module's docstring says what it does, and why so). Its own
# variables: 0022's body after it starts from theirs as 0022's function did.
_DECLARE_BLOCK = """
    b_day text;
    b_tools bigint := 0;
    b_first bigint;
    b_stored integer;"""
_BLOCK = f"""
    o_kind := 'i';
    o_inserted := 0;
    -- The batch's one UTC day (NULL when it spans days, or is empty) and its tool calls.
    IF v_total > 0 THEN
        b_day := to_char(p_timestamp[1] AT TIME ZONE 'UTC', 'YYYY-MM-DD');
    END IF;
    FOR i IN 1 .. v_total LOOP
        b_tools := b_tools + coalesce(p_tool_call_total[i], 0);
        IF i > 1 AND to_char(p_timestamp[i] AT TIME ZONE 'UTC', 'YYYY-MM-DD') <> b_day THEN
            b_day := NULL;
            EXIT;
        END IF;
    END LOOP;
    IF b_day IS NOT NULL THEN
        BEGIN
            -- The lock: appenders to one session queue here, each statement after it
            -- (READ COMMITTED) sees what the appender before committed.
            UPDATE sessions SET
                next_seq = next_seq + v_total,
                message_count = message_count + v_total,
                tool_call_count = tool_call_count + b_tools,
                {_ACTIVITY},
                rollup_messages = rollup_messages + v_total
            WHERE id = {DISTRIBUTION_ARG} AND rollup_day = b_day
            RETURNING next_seq - v_total INTO b_first;
            IF FOUND THEN
                IF p_behind_outbox THEN
                    PERFORM 1 FROM pending_outbox
                    WHERE session_id = {DISTRIBUTION_ARG} AND {_FIFO_STATE} LIMIT 1;
                    IF FOUND THEN
                        o_kind := 'q';
                        RAISE SQLSTATE '{_UNDO}';
                    END IF;
                END IF;
                IF p_erased_probe IS NOT NULL THEN
                    PERFORM 1 FROM erased_sessions WHERE session_hash = p_erased_probe;
                    IF FOUND THEN
                        o_kind := 'x';
                        RAISE SQLSTATE '{_UNDO}';
                    END IF;
                END IF;
                IF p_verify_seq IS NOT NULL THEN
                    PERFORM 1 FROM messages
                    WHERE session_id = {DISTRIBUTION_ARG} AND seq = p_verify_seq
                        AND client_msg_uuid = p_verify_key;
                    IF NOT FOUND THEN
                        o_kind := 'm';
                        RAISE SQLSTATE '{_UNDO}';
                    END IF;
                END IF;
                -- The batch numbered from the first seq. A stored key undoes the
                -- block: the stored keys and their hashes are the answer when the whole
                -- batch is stored (a re-send), else 0022's body below numbers the rest.
                IF v_total = 1 THEN
                    v_row := 1;
                    INSERT INTO messages (session_id, seq, {_MESSAGE_NAMES})
                    VALUES ({DISTRIBUTION_ARG}, b_first, {_ROW_VALUES})
                    ON CONFLICT {_KEY} DO NOTHING;
                    GET DIAGNOSTICS b_stored = ROW_COUNT;
                    IF b_stored = 0 THEN
                        SELECT array_agg(client_msg_uuid), array_agg(content_hash)
                        INTO o_keys, o_hashes
                        FROM messages
                        WHERE session_id = {DISTRIBUTION_ARG}
                            AND client_msg_uuid = p_client_msg_uuid[1];
                        RAISE SQLSTATE '{_UNDO}';
                    END IF;
                ELSE
                    -- Under the row's lock no appender adds a key between the probe and
                    -- the insert; Citus runs an INSERT ... SELECT with ON CONFLICT
                    -- through intermediate results, one without it as a copy into the
                    -- shard.
                    SELECT array_agg(client_msg_uuid), array_agg(content_hash)
                    INTO o_keys, o_hashes
                    FROM messages
                    WHERE session_id = {DISTRIBUTION_ARG}
                        AND client_msg_uuid = ANY(p_client_msg_uuid);
                    IF o_keys IS NOT NULL THEN
                        RAISE SQLSTATE '{_UNDO}';
                    END IF;
                    INSERT INTO messages (session_id, seq, {_MESSAGE_NAMES})
                    SELECT {DISTRIBUTION_ARG}, b_first + f.i - 1, {_FRESH_VALUES}
                    FROM generate_series(1, v_total) AS f(i);
                END IF;
                IF p_enqueue THEN
                    INSERT INTO search_backlog (session_id, first_seq, count)
                    VALUES ({DISTRIBUTION_ARG}, b_first, v_total);
                END IF;
                o_first_seq := b_first;
                o_inserted := v_total;
                RETURN;
            END IF;
        EXCEPTION WHEN SQLSTATE '{_UNDO}' THEN
            -- Rolled back to the block's start (its variables keep their values):
            -- nothing written ('q', 'x', 'm', or every key stored), or 0022's body.
            IF o_kind <> 'i' OR array_length(o_keys, 1) = v_total THEN
                RETURN;
            END IF;
            o_keys := NULL;
            o_hashes := NULL;
        END;
    END IF;"""

_CREATE = f"""{_HEADER}
AS $body$
DECLARE{_DECLARE_0022}{_DECLARE_BLOCK}
BEGIN{_BLOCK}{_BODY_0022}
END
$body$
"""

# 0022's function, for the downgrade.
_CREATE_0022 = f"""{_HEADER}
AS $body$
DECLARE{_DECLARE_0022}
BEGIN{_BODY_0022}
END
$body$
"""


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
    if connection is not None:
        connection.exec_driver_sql(_CREATE_0022)
