"""sessionrepo's errors: one root, a subclass per thing a caller can act on.

SQLAlchemy and driver exceptions never leave the public API; they are translated once,
at the boundary, and chained (``raise ... from exc``) so the cause stays visible.

Arguments are checked before any SQL runs, identically on every backend::

    RepoError
    ├── InvalidArgument (also a ValueError)    a malformed or out-of-range argument
    │   ├── ArgumentTypeError (also a TypeError)   an argument of the wrong type
    │   └── InvalidMessage                     data that cannot be stored faithfully
    ├── NotFound (also a LookupError)
    ├── ConflictError
    ├── BackendUnavailable
    ├── WriteRejected                          (writes only: reads never raise it)
    ├── SchemaOutOfDate
    ├── NotARepository                         a file that is not a sessionrepo store
    ├── SearchIndexUnavailable
    └── SemanticSearchUnavailable

Whatever the flavour, an argument error means that nothing was read or written, so one
``except InvalidArgument`` covers every way a call can be asked wrongly, while code that
follows Python's conventions (``except ValueError``, ``except TypeError``) keeps working.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence


class RepoError(Exception):
    """Root of every error sessionrepo raises."""


class InvalidArgument(RepoError, ValueError):
    """An argument is malformed or out of range (a cursor, a limit, a filter, an option);
    nothing was read or written.

    Attributes:
        field: the offending argument (``after_seq``, ``limit``, ``options.pool_size``...).
        reason: what is wrong with it.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}" if not reason.startswith(field) else reason)
        self.field = field
        self.reason = reason


class ArgumentTypeError(InvalidArgument, TypeError):
    """An argument has the wrong type (``after_seq="x"``, ``end_session(id, None)``);
    nothing was read or written. Both a ``TypeError`` and an :class:`InvalidArgument`."""


class InvalidMessage(InvalidArgument):
    """What was given to store (a message, a session's fields) cannot be stored
    faithfully, or may not be set by a caller; nothing was written.

    Attributes:
        field: the offending field (``messages[3].content``, ``session_id``,
            ``session_defaults.message_count``...).
    """


class NotFound(RepoError, LookupError):
    """The session (or other record) does not exist."""


class ConflictError(RepoError):
    """A strict append (``append(..., on_conflict="raise")``) met messages whose key is
    stored with different content; the whole batch was rolled back (nothing written).

    Without ``on_conflict="raise"`` such messages are skipped and listed in
    ``AppendResult.conflicts`` instead.

    Attributes:
        session_id: the session appended to.
        conflicts: the keys (``client_msg_uuid``) stored with different content.
    """

    def __init__(self, message: str, *, session_id: str, conflicts: Sequence[uuid.UUID]) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.conflicts = list(conflicts)


class BackendUnavailable(RepoError):
    """The database could not do the work for an operational reason (down, locked, full,
    read-only, timed out). Retrying later may succeed; ``TranscriptWriter`` parks the
    batch in its outbox instead of raising this.

    Attributes:
        code: the SQLSTATE (PostgreSQL) or extended result code name (SQLite), if known.
        node: on a distributed database (Citus), the one node (``host:port``) that
            could not be reached while the database itself answered: only the sessions
            whose rows live there are unavailable. ``None``: the database as a whole.
    """

    def __init__(self, message: str, *, code: str | None = None, node: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.node = node


class WriteRejected(RepoError):
    """The database refused this data for what it is (not for its own state): retrying
    the same write will fail the same way, so it is never parked in the outbox. Raised
    by writes only: a read the database refuses raises a plain :class:`RepoError`.

    Attributes:
        code: the SQLSTATE (PostgreSQL) or extended result code name (SQLite), if known.
    """

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class SchemaOutOfDate(RepoError):
    """The database's schema revision is not the one this code was built for."""


class TenantMismatch(RepoError):
    """The store was opened for a tenant it does not serve to this connection: on
    PostgreSQL the role logged in as is not that tenant (nor may act as it); a SQLite
    file belongs to another tenant. Nothing was read or written."""


class NotARepository(RepoError):
    """The URL names a SQLite file that is not a sessionrepo store (another application's
    database, or not SQLite at all), or, opened read-only, no file at all. Nothing was
    read or written: sessionrepo never adds its tables to, or changes the journal mode
    of, a file holding tables of its own.

    Attributes:
        path: the file.
    """

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class SearchIndexUnavailable(RepoError):
    """The full-text index is stale or broken, so search refuses to answer rather than
    give wrong results. Transcript writes are not affected. ``sessionrepo reindex``
    rebuilds it."""


class SemanticSearchUnavailable(RepoError):
    """Search by meaning cannot answer: no embedder (the ``semantic`` extra is not
    installed, or the repository was opened with ``embedder=False``), or the store's
    vectors are of another model than the embedder's (``sessionrepo reindex --semantic``
    re-embeds them). Keyword search is not affected."""


class QueuedBehindOutbox(Exception):
    """Raised by ``append_prepared(..., behind_outbox=True)``: nothing was written, the
    session has parked messages and the batch must queue behind them."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} has parked messages")
        self.session_id = session_id
