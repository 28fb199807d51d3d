"""Tombstones: what an erasure leaves so that nothing erased is ever stored again.

An erasure (:mod:`sessionrepo.store.erasure`) records, in its own transaction, the
keyed hash (HMAC-SHA-256 under the store's ``privacy_keys`` secret) of every erased
session's id and of every ``(session id, message key)`` it removed: no content, no id
in clear. Every write path consults them through :func:`screened` (appends, hence the
writer's writes and every drain of every outbox, and the async API) or
:func:`screen_rows` (a unit of work's append, hence the importers; a restore): a
message whose key was erased from its session is dropped before the insert and reported
in the result's ``erased`` (and the ``sessionrepo_messages_total{outcome="erased"}``
counter), never raised. So is, in an erased session, a message made (its ``timestamp``)
before the erasure, even with a key the store never had: a copy parked before it in an
outbox the erasure could not reach. A new message in an erased session is stored as usual.

What it costs an append: one primary-key probe of ``erased_sessions`` per batch, made
by the append's own statement under the session's lock where the dialect can
(``Capabilities.screens_erasure``: SQLite, PostgreSQL and Citus, whose delegated
append reads the reference table on its worker; :func:`session_probe` gives it the
hash), so no round trip of its own, and an erasure racing the append is wholly before
it (the batch is then screened) or wholly after it (it erases the batch). Only for a
session erased before are the message hashes read, by :func:`screened`, before the
append.

An erasure that removes an ADK user state (``adk_user_states``: a user's state shared by
their ADK sessions) leaves its keyed hash in ``erased_sessions`` too
(:func:`record_user_state`, under a prefix of its own): only a restore could bring such
a state back (no append writes it but through the ADK session service, whose events are
screened), and :mod:`sessionrepo.store.backup_state` refuses one made before it.

A limit, stated: in a session erased before, a batch screened by :func:`screened` a
moment before the session is erased again can still land after that erasure; an erase
run again removes it, and a later re-send of it is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import weakref
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Final, TypeVar
from uuid import UUID

from sqlalchemy import Connection, select

from sessionrepo.errors import SchemaOutOfDate
from sessionrepo.models import AppendResult, Message, StoredMessage
from sessionrepo.models.privacy import (
    erased_messages_table,
    erased_sessions_table,
    privacy_keys_table,
)
from sessionrepo.store.codec import PreparedBatch
from sessionrepo.store.database import Database

ES = erased_sessions_table.c
EM = erased_messages_table.c

T = TypeVar("T")

#: Keys per ``IN`` list when message hashes are looked up.
_CHUNK = 500
#: The ``erased_at`` of a session only part of which was erased (retention's old
#: retracted and compacted history): its message hashes are screened, but no rule of
#: time applies (its messages made before the erasure are live, not erased).
PARTLY_ERASED: Final = datetime(1970, 1, 1, tzinfo=UTC)
#: The conflict targets of the tombstone tables' inserts (an erasure run again).
_ERASED_KEY = ["session_hash"]
_ERASED_MESSAGE_KEY = ["session_hash", "key_hash"]
_KEYS: weakref.WeakKeyDictionary[Database, bytes] = weakref.WeakKeyDictionary()


def secret(connection: Connection, database: Database) -> bytes:
    """The store's tombstone key (read once per database object: it never changes)."""
    key = _KEYS.get(database)
    if key is None:
        row = connection.execute(
            select(privacy_keys_table.c.hmac_key).where(privacy_keys_table.c.name == "tombstone")
        ).first()
        if row is None:  # pragma: no cover - migration 0011 makes it
            raise SchemaOutOfDate("the store has no tombstone key: run `sessionrepo migrate`")
        key = bytes(row[0])
        _KEYS[database] = key
    return key


def session_probe(database: Database, session_id: str) -> bytes:
    """The session's tombstone hash, for a dialect whose append statement looks it up
    under the session's lock (``DirectAppend.erased_probe``)."""
    key = _KEYS.get(database)
    if key is None:
        key = database.read(lambda conn: secret(conn, database))
    return session_hash(key, session_id)


def session_hash(key: bytes, session_id: str) -> bytes:
    return hmac.new(key, b"s\x00" + session_id.encode(), hashlib.sha256).digest()


def message_hash(key: bytes, session_id: str, message_key: UUID | str) -> bytes:
    data = b"m\x00" + session_id.encode() + b"\x00" + str(message_key).encode()
    return hmac.new(key, data, hashlib.sha256).digest()


def user_state_hash(key: bytes, app_name: str, user_id: str) -> bytes:
    """The tombstone hash of an ADK user state (``adk_user_states``), kept in
    ``erased_sessions`` beside the sessions' (its own prefix: it never equals one)."""
    data = b"u\x00" + app_name.encode() + b"\x00" + user_id.encode()
    return hmac.new(key, data, hashlib.sha256).digest()


def erased_at(connection: Connection, hashed: bytes) -> datetime | None:
    """When the erasure whose tombstone is ``hashed`` (a session's or a user state's)
    removed it whole; ``None``: none did (a session only partly erased included)."""
    found: datetime | None = connection.execute(
        select(ES.erased_at).where(ES.session_hash == hashed)
    ).scalar()
    return None if found is None or found <= PARTLY_ERASED else found


def value_hash(key: bytes, kind: str, value: str) -> str:
    """Hex of the keyed hash of a selector's value (what the audit keeps)."""
    return hmac.new(key, f"{kind}\x00{value}".encode(), hashlib.sha256).hexdigest()


def erased_keys(
    connection: Connection,
    database: Database,
    session_id: str,
    messages: Iterable[tuple[UUID, datetime]],
) -> set[UUID]:
    """The keys of ``messages`` (key, timestamp) that must not be stored in
    ``session_id``: those an erasure removed from it, and, once it was erased, those
    made before the erasure (a copy parked before it in an outbox the erasure could
    not reach, an older export's)."""
    key = secret(connection, database)
    sid_hash = session_hash(key, session_id)
    erased_at = connection.execute(select(ES.erased_at).where(ES.session_hash == sid_hash)).scalar()
    if erased_at is None:
        return set()
    wanted = dict(messages)
    found = (
        set() if erased_at <= PARTLY_ERASED else {k for k, m in wanted.items() if m <= erased_at}
    )
    by_hash = {message_hash(key, session_id, k): k for k in wanted if k not in found}
    hashes = list(by_hash)
    for start in range(0, len(hashes), _CHUNK):
        chunk = hashes[start : start + _CHUNK]
        rows = connection.execute(
            select(EM.key_hash).where(EM.session_hash == sid_hash, EM.key_hash.in_(chunk))
        )
        found.update(by_hash[bytes(row[0])] for row in rows)
    return found


def screened(
    database: Database,
    batch: PreparedBatch,
    append: Callable[[PreparedBatch], AppendResult | None],
) -> AppendResult | None:
    """``append(batch)`` without the messages an erasure removed from its session,
    which the result lists in ``erased`` (nothing is written, not even the session,
    when every message of the batch was erased), nor their usage records (the kept
    messages' and the session's own ride on)."""
    # Only what the append will send: a message the memory took as acknowledged in the
    # session (None in pending_rows) is stored under a tip the dialect verifies, and the
    # batch is screened again, whole, when that tip is gone (an erasure removes it). So
    # the memory's skipped messages are neither validated nor probed here.
    pending = [row for row in batch.pending_rows if row is not None]
    if not pending:
        return append(batch)

    def probe(rows: Sequence[dict[str, Any]]) -> set[UUID]:
        pairs = [(row["client_msg_uuid"], row["timestamp"]) for row in rows]
        return database.read(lambda conn: erased_keys(conn, database, batch.session_id, pairs))

    erased = probe(pending)
    if not erased:
        return append(batch)
    skipped = len(pending) < len(batch.pending_rows)
    batch.materialize()
    if skipped:
        # The kept rows are sent whole now, the memory's skipped ones too: probe them.
        erased = probe(batch.rows)
    kept = [i for i, row in enumerate(batch.rows) if row["client_msg_uuid"] not in erased]
    refused = _in_order(batch.rows, erased)
    if not kept:
        return AppendResult(session_id=batch.session_id, erased=refused)
    rest = PreparedBatch(
        batch.session_id,
        [batch.messages[i] for i in kept],
        [batch.rows[i] for i in kept],
        batch.session,
    )
    # The usage of the kept messages rides with them, and the session's own (no
    # message); that of an erased message goes with it.
    rest.usage = tuple(u for u in batch.usage if u.message_uuid not in erased)
    result = append(rest)
    return None if result is None else result.model_copy(update={"erased": refused})


def screen_rows(
    connection: Connection,
    database: Database,
    session_id: str,
    items: Sequence[T],
    key_of: Callable[[T], tuple[UUID, datetime]],
) -> tuple[list[T], list[UUID]]:
    """``items`` (messages or rows of ``session_id``) without those an erasure removed,
    and the keys of those, in order; on the caller's transaction."""
    if not items:
        return list(items), []
    erased = erased_keys(connection, database, session_id, [key_of(item) for item in items])
    if not erased:
        return list(items), []
    kept = [item for item in items if key_of(item)[0] not in erased]
    refused = list(dict.fromkeys(key_of(i)[0] for i in items if key_of(i)[0] in erased))
    return kept, refused


def screen_stored(
    database: Database, session_id: str, messages: Sequence[StoredMessage]
) -> tuple[list[StoredMessage], list[UUID]]:
    """Messages of an export or backup to restore into ``session_id``, without those an
    erasure removed from it, and the keys of those."""
    return database.read(
        lambda conn: screen_rows(conn, database, session_id, messages, _message_key)
    )


def screen_locked(
    connection: Connection,
    database: Database,
    session_id: str,
    messages: Sequence[Message],
    rows: Sequence[dict[str, Any]],
) -> tuple[list[Message], list[dict[str, Any]], list[UUID]]:
    """A unit of work's batch (``messages`` and their encoded ``rows``, aligned)
    without what an erasure removed from ``session_id``, and the keys of those."""
    pairs, erased = screen_rows(
        connection, database, session_id, list(zip(messages, rows, strict=True)), _pair_key
    )
    return [m for m, _ in pairs], [r for _, r in pairs], erased


def record(
    connection: Connection,
    database: Database,
    session_id: str,
    message_keys: Iterable[UUID],
    *,
    when: datetime,
    audit_id: UUID,
    whole: bool = True,
) -> None:
    """Leave the tombstone of ``session_id`` and its erased ``message_keys`` (idempotent:
    an erasure run again refreshes its time and audit row). ``whole=False``: only those
    messages were erased, the session lives on; it is marked :data:`PARTLY_ERASED`
    (unless a whole erasure marked it before), so that its appends screen the message
    hashes without refusing what was made before."""
    key = secret(connection, database)
    sid_hash = session_hash(key, session_id)
    dialect = database.dialect
    if whole:
        _mark(connection, database, sid_hash, when, audit_id)
    else:
        connection.execute(
            dialect.insert_ignoring(erased_sessions_table, _ERASED_KEY).values(
                session_hash=sid_hash, erased_at=PARTLY_ERASED, audit_id=audit_id
            )
        )
    rows = [
        {"session_hash": sid_hash, "key_hash": message_hash(key, session_id, k)}
        for k in dict.fromkeys(message_keys)
    ]
    insert = dialect.insert_ignoring(erased_messages_table, _ERASED_MESSAGE_KEY)
    for start in range(0, len(rows), _CHUNK):
        connection.execute(insert, rows[start : start + _CHUNK])


def record_user_state(
    connection: Connection,
    database: Database,
    app_name: str,
    user_id: str,
    *,
    when: datetime,
    audit_id: UUID,
) -> None:
    """Leave the tombstone of an erased ADK user state: a restore of a backup taken
    before ``when`` does not bring it back."""
    key = secret(connection, database)
    _mark(connection, database, user_state_hash(key, app_name, user_id), when, audit_id)


def _mark(
    connection: Connection, database: Database, hashed: bytes, when: datetime, audit_id: UUID
) -> None:
    """``erased_sessions`` holds ``hashed`` as erased at ``when`` (an erasure run again
    refreshes its time and audit row)."""
    connection.execute(
        database.dialect.insert_ignoring(erased_sessions_table, _ERASED_KEY).values(
            session_hash=hashed, erased_at=when, audit_id=audit_id
        )
    )
    connection.execute(
        erased_sessions_table.update()
        .where(ES.session_hash == hashed)
        .values(erased_at=when, audit_id=audit_id)
    )


def _pair_key(pair: tuple[Message, dict[str, Any]]) -> tuple[UUID, datetime]:
    key: UUID = pair[1]["client_msg_uuid"]
    return key, pair[0].timestamp


def _message_key(message: StoredMessage) -> tuple[UUID, datetime]:
    return message.client_msg_uuid, message.timestamp


def _in_order(rows: Sequence[dict[str, Any]], erased: set[UUID]) -> list[UUID]:
    return list(dict.fromkeys(r["client_msg_uuid"] for r in rows if r["client_msg_uuid"] in erased))
