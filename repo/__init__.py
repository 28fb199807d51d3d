"""sessionrepo: store AI-agent chat transcripts once each, in order, on SQLite or PostgreSQL.

Start with :func:`open_repository` (asyncio: :func:`open_async_repository`) and, in a gateway,
a :class:`TranscriptWriter`; the guarantees are stated in :mod:`sessionrepo.contract`. The
message and session models are re-exported here from :mod:`sessionrepo.models`.
"""

from sessionrepo.aio.api import AsyncSessionRepository, AsyncTranscriptWriter, open_async_repository
from sessionrepo.contract import SessionStore
from sessionrepo.errors import (
    BackendUnavailable,
    ConflictError,
    InvalidMessage,
    NotFound,
    RepoError,
    SchemaOutOfDate,
    SearchIndexUnavailable,
    WriteRejected,
)
from sessionrepo.models import (
    AppendResult,
    Message,
    SearchHit,
    Session,
    SessionPage,
    SessionSummary,
    StoredMessage,
    ensure_key,
    new_key,
)
from sessionrepo.outbox.table import OutboxStatus, SessionBacklog
from sessionrepo.outbox.writer import DrainReport, TranscriptWriter, WriteResult
from sessionrepo.store.repository import SessionRepository, open_repository

__all__ = [
    "AppendResult",
    "AsyncSessionRepository",
    "AsyncTranscriptWriter",
    "BackendUnavailable",
    "ConflictError",
    "DrainReport",
    "InvalidMessage",
    "Message",
    "NotFound",
    "OutboxStatus",
    "RepoError",
    "SchemaOutOfDate",
    "SearchHit",
    "SearchIndexUnavailable",
    "Session",
    "SessionBacklog",
    "SessionPage",
    "SessionRepository",
    "SessionStore",
    "SessionSummary",
    "StoredMessage",
    "TranscriptWriter",
    "WriteRejected",
    "WriteResult",
    "ensure_key",
    "new_key",
    "open_async_repository",
    "open_repository",
]
