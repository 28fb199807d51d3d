"""sessionrepo's wire format: Pydantic v2 models for messages and sessions.

The SQLAlchemy tables they are stored in live in :mod:`sessionrepo.models.tables`.
``check_text``, ``check_identifier`` and ``check_json`` are the checks every stored value
passes (each raises ``ValueError`` naming the field), for code that fits a value before it
builds a message (an importer).
"""

from sessionrepo.models._limits import (
    MAX_ID_LENGTH,
    MAX_JSON_DEPTH,
    MAX_MESSAGE_BYTES,
    check_identifier,
    check_json,
    check_text,
)
from sessionrepo.models.message import Message, StoredMessage, ensure_key, new_key
from sessionrepo.models.outbox import DrainReport, OutboxStatus, SessionBacklog, WriteResult
from sessionrepo.models.search import SearchHit, SearchResults
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
    "SearchResults",
    "Session",
    "SessionBacklog",
    "SessionPage",
    "SessionSummary",
    "StoredMessage",
    "WriteResult",
    "check_identifier",
    "check_json",
    "check_text",
    "ensure_key",
    "new_key",
]
