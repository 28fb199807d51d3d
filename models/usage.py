"""The usage ledger: what each model call cost, and the operator's prices.

- :class:`Usage` (the wire format): one model call's tokens (input, output, cached-read,
  cache-write, reasoning), latency, the provider's own reported cost when it gives one,
  and the message it produced when known. Its key, ``usage_id``, makes a retried or
  re-flushed record a no-op, like a message's ``client_msg_uuid``: given with a message
  and without a key, the record takes that message's key (so a re-flush of the same
  message with the same usage never counts twice).
- ``usage_records``: one row per model call, ``PRIMARY KEY (session_id, usage_id)``,
  erased with its session (``ON DELETE CASCADE``); distributed with ``sessions`` on Citus.
- ``usage_prices``: the price list the operator provides, per model and token kind,
  valid from a day (UTC) on: cost is computed at report time, so a price change is a new
  row, never a rewrite. A global (reference) table on Citus.

Registered on :data:`sessionrepo.models.tables.Base`'s metadata, so ``alembic check``
compares them with migration 0012.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from datetime import date, datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Date,
    Double,
    ForeignKey,
    Index,
    PrimaryKeyConstraint,
    String,
    Table,
)
from sqlalchemy.orm import Mapped, mapped_column

from sessionrepo.models._limits import check_identifier, check_json
from sessionrepo.models.message import to_utc, utcnow
from sessionrepo.models.tables import Base

#: The token kinds of a model call, as columns of ``usage_records`` and as the
#: ``token_kind`` of a price.
TOKEN_KINDS: Final = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)
TokenKind = Literal[
    "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens"
]
#: The most tokens one call may report (a sanity bound, far above any model's window).
MAX_TOKENS: Final = 10**12


class Usage(BaseModel):
    """One model call's usage, as a framework or provider reported it.

    Token counts are what the provider reports: ``input_tokens`` includes the cached
    part (``cache_read_tokens``) as OpenAI and Google count it; ``output_tokens``
    includes ``reasoning_tokens``. Prices apply per kind as given (see
    :mod:`sessionrepo.ops.insights`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    #: The record's key; ``None``: the key of the message it comes with.
    usage_id: uuid.UUID | None = None
    #: The message the call produced (``None``: not known, or the one it comes with).
    message_uuid: uuid.UUID | None = None
    model: str | None = None
    provider: str | None = None
    input_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    output_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    cache_read_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    cache_write_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    reasoning_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    #: Seconds the call took, when known.
    latency: float | None = Field(default=None, ge=0)
    #: The provider's own figure for the call's cost (in ``currency``), when it gives one.
    reported_cost: float | None = Field(default=None, ge=0)
    currency: str = "USD"
    #: When the call finished.
    occurred_at: datetime = Field(default_factory=utcnow)
    #: Whatever else the framework reported (kept as is).
    extra: dict[str, Any] | None = None

    @field_validator("model", "provider", "currency")
    @classmethod
    def _identifier(cls, value: str | None, info: Any) -> str | None:
        return None if value is None else check_identifier(value, str(info.field_name))

    @field_validator("occurred_at", mode="before")
    @classmethod
    def _time(cls, value: Any) -> Any:
        return to_utc(value, "occurred_at")

    @field_validator("occurred_at")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            raise ValueError("occurred_at: a naive datetime is ambiguous; give a timezone")
        return value

    @field_validator("latency", "reported_cost")
    @classmethod
    def _finite(cls, value: float | None, info: Any) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError(f"{info.field_name}: {value!r} is not a number")
        return value

    @field_validator("extra")
    @classmethod
    def _json(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            check_json(value, "extra")
        return value

    @property
    def total_tokens(self) -> int:
        """Input plus output (the cached and reasoning parts are inside those)."""
        return self.input_tokens + self.output_tokens


class UsageResult(BaseModel):
    """What recording usage did: the keys inserted, those already stored, and (a
    restore) those an erasure removed, not stored again."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    inserted: list[uuid.UUID] = Field(default_factory=list)
    duplicates: list[uuid.UUID] = Field(default_factory=list)
    erased: list[uuid.UUID] = Field(default_factory=list)


class Price(BaseModel):
    """The price of one token kind of one model, from ``valid_from`` (a UTC day) on,
    per million tokens, until a later price of the same model and kind."""

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    model: str
    token_kind: TokenKind
    valid_from: date
    per_million: float = Field(ge=0)
    currency: str = "USD"

    @field_validator("model", "currency")
    @classmethod
    def _identifier(cls, value: str, info: Any) -> str:
        return check_identifier(value, str(info.field_name))

    @field_validator("per_million")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"per_million: {value!r} is not a number")
        return value


class UsageRow(Base):
    """One model call of a session (see :class:`Usage`)."""

    __tablename__ = "usage_records"
    __table_args__ = (
        PrimaryKeyConstraint("session_id", "usage_id"),
        # The report's range scans: by time, then by model.
        Index("ix_usage_records_occurred_at", "occurred_at"),
        # Its latencies by the session's source or user: the join's reads, all in the
        # index (SQLite would look every call's row up again through the primary key).
        Index("ix_usage_records_session_id_occurred_at", "session_id", "occurred_at", "latency"),
    )

    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    usage_id: Mapped[uuid.UUID]
    message_uuid: Mapped[uuid.UUID | None]
    model: Mapped[str | None]
    provider: Mapped[str | None]
    input_tokens: Mapped[int] = mapped_column(BigInteger())
    output_tokens: Mapped[int] = mapped_column(BigInteger())
    cache_read_tokens: Mapped[int] = mapped_column(BigInteger())
    cache_write_tokens: Mapped[int] = mapped_column(BigInteger())
    reasoning_tokens: Mapped[int] = mapped_column(BigInteger())
    latency: Mapped[float | None] = mapped_column(Double())
    reported_cost: Mapped[float | None] = mapped_column(Double())
    currency: Mapped[str] = mapped_column(String(16))
    occurred_at: Mapped[datetime]
    extra: Mapped[dict[str, Any] | None]


class PriceRow(Base):
    """A price (see :class:`Price`)."""

    __tablename__ = "usage_prices"
    __table_args__ = (
        PrimaryKeyConstraint("model", "token_kind", "valid_from"),
        CheckConstraint(
            "token_kind IN (" + ", ".join(f"'{kind}'" for kind in TOKEN_KINDS) + ")",
            name="token_kind",
        ),
    )

    model: Mapped[str]
    token_kind: Mapped[str] = mapped_column(String(32))
    valid_from: Mapped[date] = mapped_column(Date())
    per_million: Mapped[float] = mapped_column(Double())
    currency: Mapped[str] = mapped_column(String(16))


#: The rollup's key: one row per session, UTC day and model (``ROLLUP_NO_MODEL`` for
#: the session's messages and for calls without a model). Every upsert of the rollup
#: names its conflict target from here.
ROLLUP_KEY: Final = ("session_id", "day", "model")
#: The rollup's ``model`` for "none": a model name is never empty (``check_identifier``).
ROLLUP_NO_MODEL: Final = ""
#: The rollup's counters, each the sum of its rows (``messages``: the live messages of
#: the day, on the ``ROLLUP_NO_MODEL`` row; the others: the day's calls of the model).
ROLLUP_COUNTS: Final = ("messages", "calls", *TOKEN_KINDS)
#: The columns an upsert adds to a stored row's.
ROLLUP_SUMS: Final = (*ROLLUP_COUNTS, "reported_cost")
#: The rollup's columns, key first.
ROLLUP_COLUMNS: Final = (*ROLLUP_KEY, *ROLLUP_SUMS)


def rollup_messages(key: Sequence[str] = ROLLUP_KEY) -> tuple[str, str]:
    """The append statements' upsert of a session's new messages, one row per UTC day: a
    dialect puts its rows (``session_id, day, messages``, then zeros) between the two
    halves, and names the rollup's unique key as its backend has it (``key``)."""
    return (
        f"INSERT INTO usage_rollup ({', '.join(ROLLUP_COLUMNS)}) ",
        f" ON CONFLICT ({', '.join(key)}) "
        "DO UPDATE SET messages = usage_rollup.messages + excluded.messages",
    )


#: The values of the other columns of a messages' row: zero calls, tokens and cost.
ROLLUP_MESSAGES_ZEROS: Final = ", ".join(["0"] * (len(ROLLUP_SUMS) - 1))


class RollupRow(Base):
    """What the report counts, summed per session, UTC day and model (see
    :mod:`sessionrepo.store.rollup`): kept with the rows it sums, in their transaction."""

    __tablename__ = "usage_rollup"
    __table_args__ = (
        PrimaryKeyConstraint(*ROLLUP_KEY),
        # The report's range scans: by day.
        Index("ix_usage_rollup_day", "day"),
    )

    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    #: ``YYYY-MM-DD`` (UTC), as the dialects' ``utc_day`` gives it: compared as text.
    day: Mapped[str] = mapped_column(String(10))
    model: Mapped[str]
    messages: Mapped[int] = mapped_column(BigInteger())
    calls: Mapped[int] = mapped_column(BigInteger())
    input_tokens: Mapped[int] = mapped_column(BigInteger())
    output_tokens: Mapped[int] = mapped_column(BigInteger())
    cache_read_tokens: Mapped[int] = mapped_column(BigInteger())
    cache_write_tokens: Mapped[int] = mapped_column(BigInteger())
    reasoning_tokens: Mapped[int] = mapped_column(BigInteger())
    #: The sum of the calls' ``reported_cost`` (0 when none reported one).
    reported_cost: Mapped[float] = mapped_column(Double())


usage_table: Table = UsageRow.__table__  # type: ignore[assignment]
prices_table: Table = PriceRow.__table__  # type: ignore[assignment]
rollup_table: Table = RollupRow.__table__  # type: ignore[assignment]
