"""sessionrepo's wire format: Pydantic v2 models for messages and sessions.

The SQLAlchemy tables they are stored in live in :mod:`models.tables`.
"""

from models._limits import MAX_ID_LENGTH, MAX_JSON_DEPTH, MAX_MESSAGE_BYTES
from models.message import Message, StoredMessage, ensure_key, new_key
from models.search import SearchHit
from models.session import AppendResult, Session, SessionPage, SessionSummary

__all__ = [
    "MAX_ID_LENGTH",
    "MAX_JSON_DEPTH",
    "MAX_MESSAGE_BYTES",
    "AppendResult",
    "Message",
    "SearchHit",
    "Session",
    "SessionPage",
    "SessionSummary",
    "StoredMessage",
    "ensure_key",
    "new_key",
]
