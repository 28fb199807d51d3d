"""What the resilient write path hands back: ``write``'s and ``drain``'s results and the
outbox's health view.

They sit here, beside :class:`~sessionrepo.models.session.AppendResult`, rather than with
the writer, so that the contract (:mod:`sessionrepo.contract`), which is below the writer,
can name them.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sessionrepo.models.session import EditResult


class WriteResult(BaseModel):
    """What ``write`` did with a batch. Either way, the batch is durably committed."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    status: Literal["stored", "parked"]
    #: Keys the primary stored now (``stored`` only).
    inserted: list[uuid.UUID] = Field(default_factory=list)
    #: Keys the primary already had (``stored`` only).
    duplicates: list[uuid.UUID] = Field(default_factory=list)
    #: Keys the primary had with different content (``stored`` only).
    conflicts: list[uuid.UUID] = Field(default_factory=list)
    #: Messages of the batch now waiting in the outbox (``parked`` only); one that was
    #: already waiting there (an earlier flush of the same transcript) is not added twice.
    parked: int = 0
    #: Why the batch was parked.
    reason: str | None = None
    #: What an edit sent through the writer did (``stored`` edits only).
    edit: EditResult | None = None


class DrainReport(BaseModel):
    """What one ``drain`` did."""

    model_config = ConfigDict(frozen=True)

    #: Parked messages the primary stored now.
    replayed: int = 0
    #: Parked messages the primary already had (an earlier attempt did commit).
    duplicates: int = 0
    #: Parked messages whose key the primary had with different content (removed).
    conflicts: int = 0
    #: Parked messages an erasure removed from their session (its tombstone): removed
    #: from the outbox, not stored.
    erased: int = 0
    #: Rows whose replay failed this time (kept, retried later).
    failed: int = 0
    #: Rows set aside as dead this time (kept, see ``retry_dead``).
    dead: int = 0
    #: Pending rows left in the outbox afterwards.
    remaining: int = 0


class SessionBacklog(BaseModel):
    """The outbox's view of one session."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    pending: int
    dead: int
    oldest: datetime
    next_attempt_at: datetime | None
    last_error: str | None


class OutboxStatus(BaseModel):
    """What the outbox holds: the health view operators and ``doctor`` read."""

    model_config = ConfigDict(frozen=True)

    pending: int
    dead: int
    #: Age in seconds of the oldest pending row (0 when there is none).
    oldest_pending_age: float
    sessions: list[SessionBacklog]
