"""Erasure: the tables of tombstones and audit, and what an erase reports.

- ``privacy_keys``: the store's secret key for tombstone hashes (one row, ``tombstone``),
  made by migration 0011. Tombstones hold keyed hashes (HMAC-SHA-256) only, so a copy
  of the tombstone tables alone does not tell which ids were erased.
- ``erased_sessions``: one row per erased session (the keyed hash of its id, when,
  the audit record of the erasure).
- ``erased_messages``: the keyed hash of every erased ``(session id, message key)``:
  what every write path consults, so an erased message is never stored again.
- ``privacy_audit``: one content-free row per erase or retention run (when, by whom as
  given, the selector's kind and keyed hash, the counts).
- ``retention_policies``: per source, how long ended sessions, idle open sessions and
  retracted or compacted history are kept.

None has a ``session_id`` column (an erased id must not be kept in clear): on Citus they
are reference tables. Registered on :data:`sessionrepo.models.tables.Base`'s metadata,
so ``alembic check`` compares them with migration 0011.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Index, LargeBinary, PrimaryKeyConstraint, String, Table, Text
from sqlalchemy.orm import Mapped, mapped_column

from sessionrepo.models.tables import Base

__all__ = [
    "AuditEntry",
    "ErasureCounts",
    "ErasureReport",
    "RetentionPolicy",
    "RetentionReport",
    "ScrubReport",
    "SelectorKind",
]

#: Bytes of a tombstone hash (a full HMAC-SHA-256).
HASH_BYTES = 32


class PrivacyKeyRow(Base):
    """A secret of the store's (``tombstone``: the HMAC key of every tombstone hash)."""

    __tablename__ = "privacy_keys"
    __table_args__ = (PrimaryKeyConstraint("name"),)

    name: Mapped[str] = mapped_column(String(64))
    hmac_key: Mapped[bytes] = mapped_column(LargeBinary(64))


class ErasedSessionRow(Base):
    """An erased session, by the keyed hash of its id."""

    __tablename__ = "erased_sessions"
    __table_args__ = (PrimaryKeyConstraint("session_hash"),)

    session_hash: Mapped[bytes] = mapped_column(LargeBinary(HASH_BYTES))
    erased_at: Mapped[datetime]
    #: The ``privacy_audit`` row of the erasure (the latest, when erased again).
    audit_id: Mapped[uuid.UUID]


class ErasedMessageRow(Base):
    """An erased message, by the keyed hashes of its session's id and of its key."""

    __tablename__ = "erased_messages"
    __table_args__ = (PrimaryKeyConstraint("session_hash", "key_hash"),)

    session_hash: Mapped[bytes] = mapped_column(LargeBinary(HASH_BYTES))
    key_hash: Mapped[bytes] = mapped_column(LargeBinary(HASH_BYTES))


class PrivacyAuditRow(Base):
    """One erase or retention run: no content, no id in clear."""

    __tablename__ = "privacy_audit"
    __table_args__ = (
        PrimaryKeyConstraint("id"),
        Index("ix_privacy_audit_at", "at"),
    )

    id: Mapped[uuid.UUID]
    at: Mapped[datetime]
    #: ``erase`` or ``retention``.
    action: Mapped[str] = mapped_column(String(16))
    #: Who asked, as the caller said (free text, never checked).
    actor: Mapped[str | None] = mapped_column(String(255))
    #: ``session``, ``user``, ``source`` (erase) or ``policy`` (retention).
    selector_kind: Mapped[str] = mapped_column(String(16))
    #: Hex of the keyed hash of the selector's value.
    selector_hash: Mapped[str] = mapped_column(String(64))
    #: The counts per kind (JSON text).
    counts: Mapped[dict[str, Any]] = mapped_column()
    note: Mapped[str | None] = mapped_column(Text)


class RetentionPolicyRow(Base):
    """How long a source's sessions are kept (``*``: every source without its own)."""

    __tablename__ = "retention_policies"
    __table_args__ = (PrimaryKeyConstraint("source"),)

    source: Mapped[str]
    #: Ended sessions go once ended, and last active, this many days ago.
    ended_days: Mapped[int | None]
    #: Open sessions go once idle (no activity) this many days.
    idle_days: Mapped[int | None]
    #: Retracted and compacted messages go this many days after they were made.
    superseded_days: Mapped[int | None]
    updated_at: Mapped[datetime]


privacy_keys_table: Table = PrivacyKeyRow.__table__  # type: ignore[assignment]
erased_sessions_table: Table = ErasedSessionRow.__table__  # type: ignore[assignment]
erased_messages_table: Table = ErasedMessageRow.__table__  # type: ignore[assignment]
privacy_audit_table: Table = PrivacyAuditRow.__table__  # type: ignore[assignment]
retention_policies_table: Table = RetentionPolicyRow.__table__  # type: ignore[assignment]

SelectorKind = Literal["session", "user", "source"]


class ErasureCounts(BaseModel):
    """What one erasure removed (a dry run: would remove), per kind."""

    model_config = ConfigDict(frozen=True)

    sessions: int = 0
    #: Sessions reached through another one: forks made from it, continuations of it.
    derived_sessions: int = 0
    live_messages: int = 0
    retracted_messages: int = 0
    compacted_messages: int = 0
    search_backlog: int = 0
    adk_sessions: int = 0
    adk_user_states: int = 0
    outbox_rows: int = 0

    @property
    def messages(self) -> int:
        return self.live_messages + self.retracted_messages + self.compacted_messages

    def __add__(self, other: ErasureCounts) -> ErasureCounts:
        mine, theirs = self.model_dump(), other.model_dump()
        return ErasureCounts(**{name: mine[name] + theirs[name] for name in mine})


class ScrubReport(BaseModel):
    """What was done after the erasure so the erased bytes leave the files (where the
    backend allows it; see the README's "Privacy and retention")."""

    model_config = ConfigDict(frozen=True)

    #: What ran, in order (``secure_delete``, ``fts_optimize``, ``wal_checkpoint``,
    #: ``vacuum …``): the backend's own words.
    steps: list[str] = Field(default_factory=list)
    #: False when a step could not complete (a reader held the WAL: it is checkpointed
    #: later; ``verify-erased`` tells).
    complete: bool = True
    seconds: float = 0.0


class ErasureReport(BaseModel):
    """What one ``erase`` removed (or, with ``dry_run``, would remove)."""

    model_config = ConfigDict(frozen=True)

    selector_kind: SelectorKind
    dry_run: bool
    #: The sessions erased (dry run: that would be), by id: the caller's own selector's
    #: answer, never stored.
    session_ids: list[str] = Field(default_factory=list)
    counts: ErasureCounts = Field(default_factory=ErasureCounts)
    #: The audit record (``None`` for a dry run).
    audit_id: uuid.UUID | None = None
    scrub: ScrubReport | None = None


class AuditEntry(BaseModel):
    """One row of the privacy audit (content-free)."""

    model_config = ConfigDict(frozen=True)

    id: uuid.UUID
    at: datetime
    action: str
    actor: str | None
    selector_kind: str
    selector_hash: str
    counts: dict[str, Any]
    note: str | None = None


class RetentionPolicy(BaseModel):
    """A source's retention (``source="*"``: the default for every other source); a
    ``None`` period keeps that kind forever."""

    model_config = ConfigDict(frozen=True)

    source: str
    ended_days: int | None = Field(default=None, ge=1)
    idle_days: int | None = Field(default=None, ge=1)
    superseded_days: int | None = Field(default=None, ge=1)


class RetentionReport(BaseModel):
    """What one retention run erased (a dry run: would erase), per policy."""

    model_config = ConfigDict(frozen=True)

    dry_run: bool
    #: Sessions erased (dry run: that would be) because ended or idle, by id.
    session_ids: list[str] = Field(default_factory=list)
    #: Retracted or compacted messages erased from sessions that stay.
    superseded_messages: int = 0
    counts: ErasureCounts = Field(default_factory=ErasureCounts)
    #: Sessions listed but kept: written to (or reopened) since they were listed.
    kept: list[str] = Field(default_factory=list)
    audit_id: uuid.UUID | None = None
