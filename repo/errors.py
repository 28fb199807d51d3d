"""sessionrepo's errors: one root, a subclass per thing a caller can act on.

SQLAlchemy and driver exceptions never leave the public API; they are translated once,
at the boundary, and chained (``raise ... from exc``) so the cause stays visible.
"""

from __future__ import annotations


class RepoError(Exception):
    """Root of every error sessionrepo raises."""


class InvalidMessage(RepoError, ValueError):
    """The input cannot be stored faithfully; nothing was written.

    Attributes:
        field: the offending field (``messages[3].content``, ``session_id``, ...).
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}" if not reason.startswith(field) else reason)
        self.field = field
        self.reason = reason


class NotFound(RepoError, LookupError):
    """The session (or other record) does not exist."""


class ConflictError(RepoError):
    """A write disagrees with what is stored (see ``AppendResult.conflicts``)."""


class BackendUnavailable(RepoError):
    """The database could not do the work for an operational reason (down, locked, full,
    read-only, timed out). Retrying later may succeed; ``TranscriptWriter`` parks the
    batch in its outbox instead of raising this.

    Attributes:
        code: the SQLSTATE (PostgreSQL) or extended result code name (SQLite), if known.
    """

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class WriteRejected(RepoError):
    """The database refused this data for what it is (not for its own state): retrying
    the same write will fail the same way, so it is never parked in the outbox.

    Attributes:
        code: the SQLSTATE (PostgreSQL) or extended result code name (SQLite), if known.
    """

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class SchemaOutOfDate(RepoError):
    """The database's schema revision is not the one this code was built for."""


class SearchIndexUnavailable(RepoError):
    """The full-text index is stale or broken, so search refuses to answer rather than
    give wrong results. Transcript writes are not affected. ``sessionrepo reindex``
    rebuilds it."""
