"""sessionrepo's repository: store chat transcripts once each, in order, on SQLite or
PostgreSQL.

Start with :func:`open_repository` (asyncio: :func:`open_async_repository`); the
guarantees are stated in :mod:`repo.contract`.
"""

from repo.aio import AsyncSessionRepository, AsyncTranscriptWriter, open_async_repository
from repo.contract import SessionStore
from repo.errors import (
    BackendUnavailable,
    ConflictError,
    InvalidMessage,
    NotFound,
    RepoError,
    SchemaOutOfDate,
    SearchIndexUnavailable,
    WriteRejected,
)
from repo.outbox import OutboxStatus, SessionBacklog
from repo.repository import SessionRepository, open_repository
from repo.writer import DrainReport, TranscriptWriter, WriteResult

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
