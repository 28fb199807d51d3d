"""``load_transcript`` and ``load_openai``: a session's messages, validated or as the
wire dicts a gateway sends, and the continuation chain they may include.

Both read with the dialect's one-statement load (:meth:`DirectLoad
<sessionrepo.dialects.base.BackendDialect.load_direct>`) and fall back to a read
transaction only to tell an empty page from a missing session, or for the ancestors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from sqlalchemy import Connection, Select, select

from sessionrepo.dialects.base import DirectLoad
from sessionrepo.errors import InvalidArgument, NotFound, RepoError
from sessionrepo.models import Session, StoredMessage
from sessionrepo.models.tables import messages_table
from sessionrepo.store import codec as _codec
from sessionrepo.store.arguments import check_bool, check_limit, check_seq, check_session_id
from sessionrepo.store.database import Database
from sessionrepo.store.transaction import fetch_session
from sessionrepo.store.wire import wire_columns, wire_dicts, wire_selected

M = messages_table.c
#: A statement reading the load's columns.
_Rows = Select[*tuple[Any, ...]]

#: A continuation chain longer than this is treated as a cycle.
MAX_CHAIN: Final = 10_000


def continuation_chain(conn: Connection, sid: str) -> list[Session]:
    """Session ``sid`` and the sessions it continues, the oldest first."""
    chain = [fetch_session(conn, sid)]
    seen = {sid}
    while (parent := chain[-1].parent_session_id) is not None and len(chain) < MAX_CHAIN:
        if parent in seen:
            raise RepoError(f"session {sid!r}: continuation chain loops at {parent!r}")
        seen.add(parent)
        try:
            chain.append(fetch_session(conn, parent))
        except NotFound:
            break  # the ancestor was pruned: the chain starts here now
    chain.reverse()
    return chain


class TranscriptLoader:
    """The loads of :class:`~sessionrepo.contract.SessionStore` (arguments as its
    methods take them, checked here)."""

    def __init__(self, database: Database) -> None:
        self._db = database

    def messages(
        self,
        session_id: str,
        *,
        after_seq: int | None,
        before_seq: int | None,
        limit: int | None,
        include_ancestors: bool,
        include_retracted: bool,
    ) -> list[StoredMessage]:
        sid = check_session_id(session_id)
        after_seq = check_seq(after_seq, "after_seq")
        before_seq = check_seq(before_seq, "before_seq")
        if limit is not None:
            limit = check_limit(limit)
        include_ancestors = check_bool(include_ancestors, "include_ancestors")
        if include_ancestors and (after_seq, before_seq, limit) != (None, None, None):
            raise InvalidArgument("include_ancestors", "cannot be combined with a cursor")
        include_retracted = check_bool(include_retracted, "include_retracted")
        backwards = _backwards(after_seq, before_seq, limit)

        if not include_ancestors:
            rows = self._direct(
                _codec.LOAD_COLUMNS,
                sid,
                after_seq=after_seq,
                before_seq=before_seq,
                limit=limit,
                include_retracted=include_retracted,
            )
            if rows:
                messages = _codec.stored_messages(rows)
                if backwards:
                    messages.reverse()
                return messages
            # Nothing (or no such path): below, which tells an empty page from NotFound.

        transcript = _transcript(_codec.load_columns, include_retracted)
        query = _page(transcript.where(M.session_id == sid), after_seq, before_seq, limit)

        def work(conn: Connection) -> list[StoredMessage]:
            ancestors: list[StoredMessage] = []
            if include_ancestors:
                for session in continuation_chain(conn, sid)[:-1]:
                    ancestors += _codec.stored_messages(
                        conn.execute(transcript.where(M.session_id == session.id))
                    )
            messages = _codec.stored_messages(conn.execute(query))
            if not messages:
                fetch_session(conn, sid)  # an empty transcript, or NotFound
            if backwards:
                messages.reverse()
            return ancestors + messages

        return self._db.read(work)

    def wire(
        self,
        session_id: str,
        *,
        after_seq: int | None,
        before_seq: int | None,
        limit: int | None,
        include_key: bool,
        include_retracted: bool,
    ) -> list[dict[str, Any]]:
        sid = check_session_id(session_id)
        after_seq = check_seq(after_seq, "after_seq")
        before_seq = check_seq(before_seq, "before_seq")
        if limit is not None:
            limit = check_limit(limit)
        include_key = check_bool(include_key, "include_key")
        include_retracted = check_bool(include_retracted, "include_retracted")
        backwards = _backwards(after_seq, before_seq, limit)
        rows = self._direct(
            wire_columns(include_key=include_key),
            sid,
            after_seq=after_seq,
            before_seq=before_seq,
            limit=limit,
            include_retracted=include_retracted,
        )
        if rows:
            if backwards:
                rows.reverse()
            return wire_dicts(rows, include_key=include_key)
        query = _page(
            _transcript(wire_selected(include_key=include_key), include_retracted).where(
                M.session_id == sid
            ),
            after_seq,
            before_seq,
            limit,
        )

        def work(conn: Connection) -> list[dict[str, Any]]:
            found = list(conn.execute(query))
            if not found:
                fetch_session(conn, sid)  # an empty transcript, or NotFound
            if backwards:
                found.reverse()
            return wire_dicts(found, include_key=include_key)

        return self._db.read(work)

    def _direct(
        self,
        columns: Sequence[str],
        sid: str,
        *,
        after_seq: int | None,
        before_seq: int | None,
        limit: int | None,
        include_retracted: bool,
    ) -> list[Sequence[Any]]:
        """The page's ``columns`` by the dialect's one-statement load, in the order it read them
        (backwards for :func:`_backwards`); empty also where the session is missing or
        the dialect has no such load."""
        load = DirectLoad(
            sid,
            columns,
            after_seq,
            before_seq,
            limit,
            _backwards(after_seq, before_seq, limit),
            live_only=not include_retracted,
        )
        rows = self._db.read_direct(lambda driver: self._db.dialect.load_direct(driver, load))
        return rows or []


def _backwards(after_seq: int | None, before_seq: int | None, limit: int | None) -> bool:
    """Whether a page is the last ``limit`` rows before ``before_seq``, read backwards
    (the caller reverses them)."""
    return before_seq is not None and after_seq is None and limit is not None


def _transcript(columns: Sequence[Any], include_retracted: bool) -> _Rows:
    """``columns`` of every message of the sessions a ``where`` picks, in order."""
    transcript = select(*columns).order_by(M.seq)
    return transcript if include_retracted else transcript.where(M.superseded.is_(None))


def _page(query: _Rows, after_seq: int | None, before_seq: int | None, limit: int | None) -> _Rows:
    """``query`` cut to a page: after ``after_seq``, before ``before_seq``, at most
    ``limit`` rows; with a ``before_seq`` and a ``limit`` but no ``after_seq``, the last
    rows before it (read backwards: the caller reverses them)."""
    if after_seq is not None:
        query = query.where(M.seq > after_seq)
    if before_seq is not None:
        query = query.where(M.seq < before_seq)
    if _backwards(after_seq, before_seq, limit):
        query = query.order_by(None).order_by(M.seq.desc())
    return query.limit(limit)
