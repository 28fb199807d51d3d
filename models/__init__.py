"""sessionrepo's wire format: Pydantic v2 models for messages and sessions.

The SQLAlchemy tables they are stored in live in :mod:`sessionrepo.models.tables`.
"""

from sessionrepo.models._limits import MAX_ID_LENGTH, MAX_JSON_DEPTH, MAX_MESSAGE_BYTES
from sessionrepo.models.message import Message, StoredMessage, ensure_key, new_key
from sessionrepo.models.outbox import DrainReport, OutboxStatus, SessionBacklog, WriteResult
from sessionrepo.models.search import SearchHit
from sessionrepo.models.session import (
    AppendResult,
    EditResult,
    Session,
    SessionPage,
    SessionSummary,
)

__all__ = [
    "MAX_ID_LENGTH",
    "MAX_JSON_DEPTH",
    "MAX_MESSAGE_BYTES",
    "AppendResult",
    "DrainReport",
    "EditResult",
    "Message",
    "OutboxStatus",
    "SearchHit",
    "Session",
    "SessionBacklog",
    "SessionPage",
    "SessionSummary",
    "StoredMessage",
    "WriteResult",
    "ensure_key",
    "new_key",
]
