"""sessionrepo's repository: store chat transcripts once each, in order, on SQLite or
PostgreSQL.

Start with :func:`open_repository`; the guarantees are stated in :mod:`repo.contract`.
"""

from repo.contract import SessionStore
from repo.errors import (
    BackendUnavailable,
    ConflictError,
    InvalidMessage,
    NotFound,
    RepoError,
    SchemaOutOfDate,
    WriteRejected,
)
from repo.repository import SessionRepository, open_repository

__all__ = [
    "BackendUnavailable",
    "ConflictError",
    "InvalidMessage",
    "NotFound",
    "RepoError",
    "SchemaOutOfDate",
    "SessionRepository",
    "SessionStore",
    "WriteRejected",
    "open_repository",
]
