"""sessionrepo's repository: store chat transcripts once each, in order, on SQLite or
PostgreSQL.

Start with :func:`open_repository` (asyncio: :func:`open_async_repository`); the
guarantees are stated in :mod:`repo.contract`.
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
from sessionrepo.outbox.table import OutboxStatus, SessionBacklog
from sessionrepo.outbox.writer import DrainReport, TranscriptWriter, WriteResult
from sessionrepo.store.repository import SessionRepository, open_repository

__all__ = [
    "AsyncSessionRepository",
    "AsyncTranscriptWriter",
    "BackendUnavailable",
    "ConflictError",
    "DrainReport",
    "InvalidMessage",
    "NotFound",
    "OutboxStatus",
    "RepoError",
    "SchemaOutOfDate",
    "SearchIndexUnavailable",
    "SessionBacklog",
    "SessionRepository",
    "SessionStore",
    "TranscriptWriter",
    "WriteRejected",
    "WriteResult",
    "open_async_repository",
    "open_repository",
]
