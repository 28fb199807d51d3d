"""The contract every sessionrepo store keeps, whatever the backend.

Implementations carry only "why" comments; the guarantees are stated here once. The
contract test suite (``tests/``) holds every implementation to them, on every backend.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, Protocol

from sessionrepo.models import AppendResult, Message, Session, SessionPage, StoredMessage


class SessionStore(Protocol):
    """Conversation transcripts, stored once each, in order, with every field."""

    @property
    def backend(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        ...

    def create_session(self, session_id: str, **fields: Any) -> Session:
        """Create a session, idempotently.

        Creating a session that exists changes no value already set: it fills in the
        fields that are still empty (``None``, or source ``"unknown"``), which is how a
        session first created by :meth:`append` gets its real attributes later.

        Returns:
            The stored session.
        """
        ...

    def get_session(self, session_id: str) -> Session:
        """Raises:
        NotFound: no such session."""
        ...

    def list_sessions(
        self,
        *,
        source: str | None = None,
        user_id: str | None = None,
        status: Literal["open", "ended"] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> SessionPage:
        """Sessions, newest activity first, a page at a time (keyset cursor: a session
        created while paging never shifts or repeats the pages after it)."""
        ...

    def end_session(self, session_id: str, reason: str) -> bool:
        """End a session. The first reason wins: returns ``True`` when this call ended it,
        ``False`` (changing nothing) when it was already ended.

        Raises:
            NotFound: no such session.
        """
        ...

    def reopen_session(self, session_id: str) -> bool:
        """Undo an end: returns ``True`` when the session was ended and is now open."""
        ...

    def resolve_tip(self, session_id: str) -> Session:
        """The live end of the continuation chain ``session_id`` belongs to: follow the
        most recently active child (``parent_session_id``) until there is none."""
        ...

    def session_chain(self, session_id: str) -> list[Session]:
        """The session and its ancestors, oldest first."""
        ...

    def append(
        self,
        session_id: str,
        messages: Iterable[Message | Mapping[str, Any]],
        **session_defaults: Any,
    ) -> AppendResult:
        """Append messages to a session's transcript, atomically and idempotently.

        - The whole batch lands or none of it.
        - A message whose ``client_msg_uuid`` is already stored in the session is skipped:
          listed in ``duplicates`` when its content is the same, in ``conflicts`` when it
          differs (the stored row is never changed). Identity is the key, never content.
        - Inserted messages get the next ``seq`` numbers, in batch order. Appenders to one
          session are serialised by the database (its ``sessions`` row lock); appenders
          to different sessions do not wait for each other.
        - The session row is created (from ``session_defaults``) if it does not exist.
        - Counters move only for inserted messages.

        Raises:
            InvalidMessage: a message cannot be stored faithfully (nothing was written).
            BackendUnavailable: the database could not take the batch right now.
            WriteRejected: the database refused the data itself.
        """
        ...

    def load_transcript(
        self,
        session_id: str,
        *,
        after_seq: int | None = None,
        before_seq: int | None = None,
        limit: int | None = None,
        include_ancestors: bool = False,
    ) -> list[StoredMessage]:
        """Messages in ``seq`` order (the order they were appended, never by clock).

        ``after_seq``/``limit`` page forward; ``before_seq``/``limit`` page backward (the
        ``limit`` messages just before ``before_seq``, still in ascending order).
        ``include_ancestors`` prepends the transcripts of the session's ancestors.

        Raises:
            NotFound: no such session.
        """
        ...

    def close(self) -> None:
        """Release the connection pool. The store is unusable afterwards."""
        ...
