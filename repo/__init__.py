"""sessionrepo: store AI-agent chat transcripts once each, in order, on SQLite or PostgreSQL.

Start with :func:`open_repository` (asyncio: :func:`open_async_repository`) and write
through a :class:`TranscriptWriter`; the guarantees are stated in
:mod:`sessionrepo.contract` (:class:`SessionStore`, :class:`ResilientWriter`), the errors
in :mod:`sessionrepo.errors`. The message and session models are re-exported here from
:mod:`sessionrepo.models`.
"""

from sessionrepo.aio.api import AsyncSessionRepository, AsyncTranscriptWriter, open_async_repository
from sessionrepo.aio.transaction import AsyncSessionTransaction
from sessionrepo.contract import ResilientWriter, SessionStore, SessionUnitOfWork, TranscriptEditor
from sessionrepo.errors import (
    ArgumentTypeError,
    BackendUnavailable,
    ConflictError,
    InvalidArgument,
    InvalidMessage,
    NotARepository,
    NotFound,
    RepoError,
    SchemaOutOfDate,
    SearchIndexUnavailable,
    SemanticSearchUnavailable,
    TenantMismatch,
    WriteRejected,
)
from sessionrepo.models import (
    AppendResult,
    Message,
    SearchHit,
    SearchResults,
    Session,
    SessionPage,
    SessionSummary,
    StoredMessage,
    ensure_key,
    new_key,
)
from sessionrepo.models.outbox import DrainReport, OutboxStatus, SessionBacklog, WriteResult
from sessionrepo.models.session import EditResult
from sessionrepo.models.transcript import TranscriptProblem, is_sendable, transcript_problems
from sessionrepo.outbox.writer import TranscriptWriter
from sessionrepo.search.embedders import CallableEmbedder, Embedder
from sessionrepo.store.repository import SessionRepository, open_repository
from sessionrepo.store.transaction import SessionTransaction

__all__ = [
    "AppendResult",
    "ArgumentTypeError",
    "AsyncSessionRepository",
    "AsyncSessionTransaction",
    "AsyncTranscriptWriter",
    "BackendUnavailable",
    "CallableEmbedder",
    "ConflictError",
    "DrainReport",
    "EditResult",
    "Embedder",
    "InvalidArgument",
    "InvalidMessage",
    "Message",
    "NotARepository",
    "NotFound",
    "OutboxStatus",
    "RepoError",
    "ResilientWriter",
    "SchemaOutOfDate",
    "SearchHit",
    "SearchIndexUnavailable",
    "SearchResults",
    "SemanticSearchUnavailable",
    "Session",
    "SessionBacklog",
    "SessionPage",
    "SessionRepository",
    "SessionStore",
    "SessionSummary",
    "SessionTransaction",
    "SessionUnitOfWork",
    "StoredMessage",
    "TenantMismatch",
    "TranscriptEditor",
    "TranscriptProblem",
    "TranscriptWriter",
    "WriteRejected",
    "WriteResult",
    "ensure_key",
    "is_sendable",
    "new_key",
    "open_async_repository",
    "open_repository",
    "transcript_problems",
]
