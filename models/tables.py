"""The SQLAlchemy tables behind the models.

The record is stored so that it reads back exactly, the same on SQLite and PostgreSQL:

- JSON fields are compact JSON *text* (PostgreSQL ``jsonb`` would reorder keys and
  rewrite numbers); cast to ``jsonb`` in queries when you need operators.
- Free text (``content``, ``reasoning``, ``title``, ``system_prompt``) is stored as is,
  except a string holding NUL (which PostgreSQL text cannot hold), a string starting with
  U+FDD0, and non-string content (a list of parts, a dict): those are stored as U+FDD0
  followed by their JSON. U+FDD0 is a Unicode noncharacter, so readers can tell.
- Times are timezone-aware UTC on both backends (SQLite keeps them as UTC text).

Alembic migrations are the schema's only source; these classes must match them
(``alembic check`` proves it).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Final

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from sessionrepo.models.outbox_protocol import STATE_CHECK_SQL

#: Marks a stored text value that is JSON (see the module docstring).
ENCODED_MARK: Final = "\ufdd0"

NAMING_CONVENTION: Final = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ID_LENGTH: Final = 255
#: A tenant is a PostgreSQL role name (NAMEDATALEN - 1 bytes).
TENANT_LENGTH: Final = 63
#: How far behind an append's time the indexed ``sessions.last_active_at`` may stay: an
#: append rewrites it (and the listing's four indexes with it) only when it is further
#: behind than this, else it records ``last_active_lag_us``, in no index. The same for every
#: process on a database (the listing reads the index this much wider than its page), so
#: it is fixed here, not an option.
ACTIVITY_GRANULARITY: Final = timedelta(seconds=1)


def dump_json(value: Any) -> str:
    """Compact JSON text that reads back to an equal value with the same key order."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


#: dump_json of a key layout (a tuple of str, immutable): few layouts recur endlessly.
_LAYOUTS: dict[tuple[str, ...], str] = {}


def dump_layout(keys: tuple[str, ...]) -> str:
    """``dump_json(list(keys))`` for a tuple of strings, remembered."""
    text = _LAYOUTS.get(keys)
    if text is None:
        text = dump_json(list(keys))
        if len(_LAYOUTS) >= 1024:
            _LAYOUTS.clear()
        _LAYOUTS[keys] = text
    return text


def encode_text(value: Any) -> str:
    """Free text as stored: plain when that is safe, else the mark followed by JSON."""
    if type(value) is str and "\x00" not in value and not value.startswith(ENCODED_MARK):
        return value
    return ENCODED_MARK + dump_json(value)


def decode_text(stored: str) -> Any:
    if stored.startswith(ENCODED_MARK):
        return json.loads(stored[len(ENCODED_MARK) :])
    return stored


class JSONText(TypeDecorator[Any]):
    """JSON kept as text, so it comes back with the same key order and numbers."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else dump_json(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else json.loads(value)


class LosslessText(TypeDecorator[Any]):
    """Text that may hold NUL, or a JSON value (content parts); see the module docstring."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else encode_text(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else decode_text(value)


class UTCDateTime(TypeDecorator[datetime]):
    """An aware datetime stored as UTC and read back as aware UTC, on every backend."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime reached the database layer")
        # SQLite's DATETIME writes the wall time without an offset, so UTC's, and reads it
        # back naive (below); PostgreSQL's timestamptz keeps the instant.
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        str: String(ID_LENGTH),
        int: BigInteger(),
        datetime: UTCDateTime(),
        uuid.UUID: Uuid(),
        dict[str, Any]: JSONText(),
        list[Any]: JSONText(),
    }


class SessionRow(Base):
    __tablename__ = "sessions"
    __table_args__ = (
        PrimaryKeyConstraint("id"),
        Index("ix_sessions_last_active_at_id", "last_active_at", "id"),
        Index("ix_sessions_source_last_active_at_id", "source", "last_active_at", "id"),
        Index("ix_sessions_user_id_last_active_at_id", "user_id", "last_active_at", "id"),
        Index(
            "ix_sessions_open_last_active_at_id",
            "last_active_at",
            "id",
            sqlite_where=text("ended_at IS NULL"),
            postgresql_where=text("ended_at IS NULL"),
        ),
        Index("ix_sessions_parent_session_id", "parent_session_id"),
        Index("ix_sessions_ended_at", "ended_at"),
        Index("ix_sessions_rollup_day", "rollup_day"),
        # Room on each page for a heap-only (HOT) update of the row (migration 0010).
        {"postgresql_with": {"fillfactor": 80}},
    )

    id: Mapped[str]
    source: Mapped[str]
    user_id: Mapped[str | None]
    title: Mapped[str | None] = mapped_column(LosslessText())
    model: Mapped[str | None]
    model_settings: Mapped[dict[str, Any] | None]
    system_prompt: Mapped[str | None] = mapped_column(LosslessText())
    # No foreign key: a parent may be pruned or not imported yet, and a self-reference
    # would keep the table from being distributed by session id.
    parent_session_id: Mapped[str | None]
    started_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]
    end_reason: Mapped[str | None] = mapped_column(String(1024))
    message_count: Mapped[int] = mapped_column(server_default=text("0"))
    tool_call_count: Mapped[int] = mapped_column(server_default=text("0"))
    input_tokens: Mapped[int] = mapped_column(server_default=text("0"))
    output_tokens: Mapped[int] = mapped_column(server_default=text("0"))
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata")
    #: The ``seq`` the next inserted message gets; moved under the session's row lock.
    next_seq: Mapped[int] = mapped_column(server_default=text("1"))
    #: Indexed (the listing's orders): moved by an append only past ACTIVITY_GRANULARITY.
    last_active_at: Mapped[datetime]
    #: Microseconds of activity after ``last_active_at`` (in no index: an append that
    #: sets it alone touches no index page); the session's activity is their sum.
    last_active_lag_us: Mapped[int] = mapped_column(server_default=text("0"))
    #: The newest UTC day (``YYYY-MM-DD``) the session had messages on, and how many live
    #: messages of that day the usage rollup (``usage_rollup``) does not hold yet: the
    #: open day's count lives on the row every append rewrites anyway, in no index but
    #: ``rollup_day``'s (which moves once a day), so an append writes no rollup page.
    #: When a later day comes, the count goes to the rollup (migration 0020).
    rollup_day: Mapped[str | None] = mapped_column(String(10))
    rollup_messages: Mapped[int] = mapped_column(server_default=text("0"))
    #: Set by ``fork_session``: the session and ``seq`` this one's transcript was copied
    #: from (no foreign key, like ``parent_session_id``).
    forked_from_session_id: Mapped[str | None]
    forked_from_seq: Mapped[int | None]


#: ``info`` of a message column whose value is part of the message's content: hashed
#: into ``content_hash``, which tells a plain re-send (same key, same content) from a
#: conflict. The key, the timestamp and the key order of the wire dict are not content.
CONTENT: Final = {"hashed": True}
#: ``info`` of a content column that ``Message.from_openai`` takes from an OpenAI-format
#: dict by name (every other key of the dict goes to ``extra``).
WIRE: Final = {"hashed": True, "wire": True}


class MessageRow(Base):
    """One stored message: the declaration of its columns.

    Every column but the message's place (``session_id``, ``seq``) and ``content_hash``
    is a field of :class:`sessionrepo.models.Message` of the same name, in the same
    order; the codec, both backends' append statements and the wire field list derive
    from the columns declared here (see :data:`MESSAGE_COLUMNS`).
    """

    __tablename__ = "messages"
    __table_args__ = (
        PrimaryKeyConstraint("session_id", "seq"),
        UniqueConstraint("session_id", "client_msg_uuid"),
        # NULL: an OpenAI Responses item without a role (its type is in ``extra``).
        CheckConstraint(
            "role IN ('system', 'developer', 'user', 'assistant', 'tool', 'function')",
            name="role",
        ),
        CheckConstraint("superseded IN ('retracted', 'compacted')", name="superseded"),
    )

    session_id: Mapped[str] = mapped_column(
        ForeignKey("sessions.id", ondelete="CASCADE"),
    )
    seq: Mapped[int]
    client_msg_uuid: Mapped[uuid.UUID]
    role: Mapped[str | None] = mapped_column(String(16), info=WIRE)
    content: Mapped[Any | None] = mapped_column(LosslessText(), info=WIRE)
    tool_calls: Mapped[list[Any] | None] = mapped_column(info=WIRE)
    tool_call_id: Mapped[str | None] = mapped_column(info=WIRE)
    tool_name: Mapped[str | None] = mapped_column(info=WIRE)
    reasoning: Mapped[str | None] = mapped_column(LosslessText(), info=WIRE)
    finish_reason: Mapped[str | None] = mapped_column(info=WIRE)
    token_count: Mapped[int | None] = mapped_column(info=WIRE)
    timestamp: Mapped[datetime]
    platform_message_id: Mapped[str | None] = mapped_column(info=WIRE)
    extra: Mapped[dict[str, Any] | None] = mapped_column(info=CONTENT)
    openai_keys: Mapped[list[Any] | None]
    #: 16 bytes of SHA-256 over the message's content columns (not its key or
    #: timestamp): how a re-sent key with different content is told from a plain re-send.
    content_hash: Mapped[bytes] = mapped_column(LargeBinary(16))
    #: NULL while the message is in the live transcript; ``retracted`` or ``compacted``
    #: once an edit took it out (it stays stored: see ``sessionrepo.store.editing``).
    #: Not a field of ``Message``: the store's, like the message's place.
    superseded: Mapped[str | None] = mapped_column(String(16))


class OutboxRow(Base):
    """A message the primary store could not take yet (see :mod:`sessionrepo.outbox`)."""

    __tablename__ = "pending_outbox"
    __table_args__ = (
        PrimaryKeyConstraint("session_id", "position"),
        UniqueConstraint("session_id", "client_msg_uuid"),
        Index("ix_pending_outbox_state_next_attempt_at", "state", "next_attempt_at"),
        CheckConstraint(STATE_CHECK_SQL, name="state"),
    )

    session_id: Mapped[str]
    #: Per-session FIFO position: replay order.
    position: Mapped[int]
    client_msg_uuid: Mapped[uuid.UUID]
    #: The message exactly as validated (``Message.model_dump(mode="json")``).
    message: Mapped[dict[str, Any]]
    #: What ``append`` needs to create the session if it does not exist yet.
    session_defaults: Mapped[dict[str, Any] | None]
    #: The usage records (``Usage.model_dump(mode="json")``) that came with the message,
    #: replayed with it; NULL for none (and in rows parked before migration 0012).
    usage: Mapped[list[Any] | None]
    reason: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))
    #: Replays tried (any failure); drives the backoff.
    attempts: Mapped[int] = mapped_column(server_default=text("0"))
    #: Replays the primary refused for the message itself; ``max_attempts`` of them
    #: make the row dead. Outages never count here.
    rejections: Mapped[int] = mapped_column(server_default=text("0"))
    last_error: Mapped[str | None] = mapped_column(Text)
    #: SQLSTATE (PostgreSQL), SQLite error name, or ``deadline``.
    last_error_code: Mapped[str | None] = mapped_column(String(32))
    next_attempt_at: Mapped[datetime]
    claimed_by: Mapped[str | None] = mapped_column(String(128))
    claimed_until: Mapped[datetime | None]
    created_at: Mapped[datetime]


class SearchIndexStateRow(Base):
    """Whether the full-text index can be trusted (``ok``) or must be rebuilt
    (``stale``, with the reason). The index itself (FTS5 on SQLite, a tsvector table on
    PostgreSQL) is made by raw DDL, not modelled here: its statements live in the
    dialects (``BackendDialect.search_index_ddl``)."""

    __tablename__ = "search_index_state"
    __table_args__ = (PrimaryKeyConstraint("name"),)

    name: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime]


class SearchBacklogRow(Base):
    """Messages appended but not indexed yet: one row per append (its session, first
    ``seq`` and how many consecutive messages it inserted), written in the append's own
    transaction and deleted by the catch-up that indexes them
    (:mod:`sessionrepo.store.search_index`)."""

    __tablename__ = "search_backlog"
    # On SQLite the row lives in its key's b-tree: one page an append, not two (0010).
    __table_args__ = (PrimaryKeyConstraint("session_id", "first_seq"), {"sqlite_with_rowid": False})

    # Goes with its session: a pruned session leaves no backlog behind.
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    first_seq: Mapped[int]
    count: Mapped[int]


class MessageEmbeddingRow(Base):
    """A message's vector for search by meaning (:mod:`sessionrepo.store.semantic`):
    one row per message the semantic catch-up has looked at, keyed like the message.
    ``vector`` is int8 bytes of the model :class:`SemanticIndexStateRow` names (NULL:
    nothing worth embedding, or out of the live transcript); ``content_hash`` is the
    message's when it was embedded (a vector whose hash is not the message's is stale)."""

    __tablename__ = "message_embeddings"
    __table_args__ = (
        PrimaryKeyConstraint("session_id", "seq"),
        Index("ix_message_embeddings_generation", "generation"),
    )

    # Goes with its session; erasing single messages deletes the same (session_id, seq).
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    seq: Mapped[int]
    content_hash: Mapped[bytes] = mapped_column(LargeBinary(16))
    vector: Mapped[bytes | None] = mapped_column(LargeBinary())
    #: The catch-up transaction that wrote the row (``semantic_index_state.generation``;
    #: NULL: written before revision 0015).
    generation: Mapped[int | None]


class SemanticIndexStateRow(Base):
    """The model whose vectors the store holds (a store never mixes two) and the
    semantic catch-up's watermark: sessions active before it have been looked at."""

    __tablename__ = "semantic_index_state"
    __table_args__ = (PrimaryKeyConstraint("name"),)

    name: Mapped[str] = mapped_column(String(64))
    model: Mapped[str | None]
    dimension: Mapped[int | None]
    watermark: Mapped[datetime | None]
    updated_at: Mapped[datetime]
    #: Incremented by every transaction that writes vectors; ``cleared``: the generation
    #: at which all were last dropped (see :mod:`sessionrepo.store.semantic`).
    generation: Mapped[int] = mapped_column(server_default=text("0"))
    cleared: Mapped[int] = mapped_column(server_default=text("0"))


class TenantRow(Base):
    """A tenant of the store (migration 0018). On PostgreSQL the tenant is the role a
    connection logs in as, and every table holding a tenant's data carries it in a
    ``tenant`` column that the database fills (``DEFAULT current_user``) and filters
    (row-level security): the application never names that column, so it is in no model
    here. This table lists the tenant roles ``sessionrepo tenants create`` made. On
    SQLite, where the file is the boundary, it holds at most one row: the file's tenant."""

    __tablename__ = "tenants"
    __table_args__ = (PrimaryKeyConstraint("tenant"),)

    tenant: Mapped[str] = mapped_column(String(TENANT_LENGTH))
    created_at: Mapped[datetime]


sessions_table: Table = SessionRow.__table__  # type: ignore[assignment]
messages_table: Table = MessageRow.__table__  # type: ignore[assignment]
outbox_table: Table = OutboxRow.__table__  # type: ignore[assignment]
search_state_table: Table = SearchIndexStateRow.__table__  # type: ignore[assignment]
search_backlog_table: Table = SearchBacklogRow.__table__  # type: ignore[assignment]
embeddings_table: Table = MessageEmbeddingRow.__table__  # type: ignore[assignment]
semantic_state_table: Table = SemanticIndexStateRow.__table__  # type: ignore[assignment]
tenants_table: Table = TenantRow.__table__  # type: ignore[assignment]

#: Where a message sits: the columns of ``messages`` that are not the message's own.
MESSAGE_PLACE: Final = ("session_id", "seq")
#: Columns of ``messages`` that say what became of a stored message (an edit's), not
#: what it is: read back (``StoredMessage.superseded``), never written by an append.
MESSAGE_STATE: Final = ("superseded",)
#: The columns of one stored message, without its place, in table order: what the codec
#: encodes (``codec.message_row``) and decodes, and what both backends' append statements
#: insert. Declared once, by :class:`MessageRow`.
MESSAGE_COLUMNS: Final = tuple(
    column.name
    for column in messages_table.columns
    if column.name not in MESSAGE_PLACE and column.name not in MESSAGE_STATE
)
#: The content columns (:data:`CONTENT`), hashed into ``content_hash`` in this order.
HASHED_COLUMNS: Final = tuple(
    column.name for column in messages_table.columns if column.info.get("hashed")
)
#: The fields ``Message.from_openai`` takes from a dict by name (:data:`WIRE`), in order.
WIRE_FIELDS: Final = tuple(
    column.name for column in messages_table.columns if column.info.get("wire")
)
