"""The unit of work: one transaction under one session's row lock.

:class:`SessionTransaction` is what :meth:`SessionRepository.session_transaction` returns;
the contract it keeps is :class:`sessionrepo.contract.SessionUnitOfWork`. It is the public
way for an adapter, an importer or an operator method to do several things to one session
atomically (append, supersede, its own tables) where a single call of the repository does
one.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, Literal
from uuid import UUID

from sqlalchemy import Connection, Executable, Result, select
from sqlalchemy import exc as sa_exc

import sessionrepo.observability as _observe
from sessionrepo.errors import BackendUnavailable, NotFound, RepoError
from sessionrepo.models import AppendResult, EditResult, Message, Session
from sessionrepo.models.tables import sessions_table
from sessionrepo.models.usage import UsageResult
from sessionrepo.store import bridge as _aio
from sessionrepo.store import codec as _codec
from sessionrepo.store.append import Appender
from sessionrepo.store.arguments import check_choice
from sessionrepo.store.database import Database
from sessionrepo.store.editing import SessionEditor, check_keys
from sessionrepo.store.usage import check_usage, insert_usage, usage_writes

S = sessions_table.c

#: How an edit marks what it takes out of the live transcript.
SUPERSEDED_STATES = ("retracted", "compacted")


class SessionTransaction:
    """One transaction holding one session's row lock, from ``with`` to its end.

    Made by :meth:`SessionRepository.session_transaction` (whose docstring states the
    contract); used once, as a context manager::

        with repository.session_transaction("s1") as tx:
            result = tx.append([{"role": "user", "content": "hi"}])
            tx.execute(update(my_table).where(...).values(seq=tx.next_seq - 1))

    On entry it begins a write transaction and locks the session's row (appenders, edits
    and other units of work of the session queue behind it; other sessions do not), the
    session created first when it is missing (as :meth:`~SessionRepository.append` does).
    The block's normal end commits; an exception leaving it rolls everything back and is
    raised as it was (an error of the database's, a SQLAlchemy or driver error, as the
    :class:`~sessionrepo.errors.RepoError` it means, chained).

    It cannot outlive its transaction: before ``with`` and after it every method raises
    :class:`RepoError`, and :attr:`connection` is closed. It is not thread-safe (one
    transaction is one connection).
    """

    def __init__(
        self,
        appender: Appender,
        editor: SessionEditor,
        database: Database,
        session_id: str,
        new_session: dict[str, Any] | None,
    ) -> None:
        self._appender = appender
        self._editor = editor
        self._database = database
        self._sid = session_id
        #: The row to create a missing session from; ``None``: a missing one is NotFound.
        self._new_session = new_session
        self._connection: Connection | None = None
        self._state: Literal["new", "open", "ended"] = "new"
        self._next_seq = 0
        self._created = False

    # -- what it holds ------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        return self._sid

    @property
    def created(self) -> bool:
        """Whether this transaction created the session (it did not exist on entry)."""
        self._check_open()
        return self._created

    @property
    def next_seq(self) -> int:
        """The ``seq`` the next message appended to the session gets (it moves as this
        transaction appends)."""
        self._check_open()
        return self._next_seq

    @property
    def connection(self) -> Connection:
        """The transaction's SQLAlchemy connection, for an extension's own statements on
        its own tables (:meth:`execute` runs one). Never commit, roll back or close it:
        the block's end does. Closed once the transaction has ended."""
        return self._check_open()

    def session(self) -> Session:
        """The session as it stands in this transaction (what it appended counted)."""
        connection = self._check_open()
        with _boundary(self._database):
            return fetch_session(connection, self._sid)

    # -- what it does -------------------------------------------------------------------

    def append(
        self,
        messages: Iterable[Message | Mapping[str, Any]],
        *,
        on_conflict: Literal["report", "raise"] = "report",
    ) -> AppendResult:
        """:meth:`SessionRepository.append` inside this transaction: the same
        validation (before anything is written), key-based skipping, conflict reporting,
        counters and search indexing; the messages get the next ``seq`` numbers.

        Raises:
            InvalidMessage: a message cannot be stored (nothing of the batch was written).
            ConflictError: ``on_conflict="raise"`` and a key is stored with other content
                (nothing of the batch was written; the transaction goes on unless the
                error leaves the block).
        """
        connection = self._check_open()
        check_choice(on_conflict, "on_conflict", ("report", "raise"))
        with _boundary(self._database):
            result = self._appender.append_locked(
                connection, self._sid, self._next_seq, messages, on_conflict=on_conflict
            )
        self._next_seq += len(result.inserted)
        return result

    def supersede(
        self, keys: Iterable[UUID | str], state: Literal["retracted", "compacted"] = "retracted"
    ) -> list[UUID]:
        """Take the live messages with these keys out of the live transcript, marked
        ``state`` (out of the counters and search; still stored), as the editing methods
        do; keys the session does not hold live are skipped. Returns the keys taken out,
        in ``seq`` order."""
        connection = self._check_open()
        check_choice(state, "state", SUPERSEDED_STATES)
        with _boundary(self._database):
            return self._editor.supersede_keys(connection, self._sid, keys, state)

    def retract(self, keys: Iterable[UUID | str]) -> EditResult:
        """:meth:`SessionRepository.retract` inside this transaction.

        Raises:
            NotFound: a key the session does not hold (nothing was retracted).
        """
        connection = self._check_open()
        wanted = check_keys(keys)
        with _boundary(self._database):
            return self._editor.retract_in(connection, self._sid, wanted)

    def record_usage(self, usage: Any) -> UsageResult:
        """:meth:`SessionRepository.record_usage` inside this transaction: the records
        whose key the session lacks inserted (a record needs its ``usage_id``, or a
        ``message_uuid`` to take it from), the session's token totals moved by them.

        Raises:
            InvalidMessage: a record is invalid (nothing of them was written).
        """
        connection = self._check_open()
        records = check_usage(usage, [])
        with _boundary(self._database):
            recorded = insert_usage(
                connection, usage_writes(self._database.dialect), self._sid, records
            )
        inserted = set(recorded.inserted)
        _observe.record_usage([r for r in records if r.usage_id in inserted], self._database)
        return recorded

    def execute(
        self, statement: Executable, parameters: Mapping[str, Any] | None = None
    ) -> Result[Any]:
        """Run an extension's statement (on its own tables) in this transaction. Read
        its rows before the block ends.

        Raises:
            RepoError: the database refused it or could not run it (translated, chained).
        """
        connection = self._check_open()
        with _boundary(self._database):
            return connection.execute(statement, parameters)

    # -- the transaction ----------------------------------------------------------------

    def __enter__(self) -> SessionTransaction:
        if self._state != "new":
            raise RepoError("a session transaction is used once: open another")
        self._connection, self._next_seq, self._created = _begin(
            self._appender, self._database, self._sid, self._new_session
        )
        self._state = "open"
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        connection = self._check_open()
        self._state = "ended"
        try:
            if exc_type is None:
                try:
                    connection.commit()
                except sa_exc.SQLAlchemyError as error:
                    raise translated(self._database, error) from error
                return
            with contextlib.suppress(sa_exc.SQLAlchemyError):  # a lost connection
                connection.rollback()
            if isinstance(exc, sa_exc.SQLAlchemyError):
                raise translated(self._database, exc) from exc
        finally:
            with contextlib.suppress(sa_exc.SQLAlchemyError):
                connection.close()

    def _check_open(self) -> Connection:
        if self._state != "open" or self._connection is None:
            raise RepoError(
                f"session transaction of {self._sid!r} is not open: use it inside its `with` block"
            )
        return self._connection

    def __repr__(self) -> str:
        return f"SessionTransaction({self._sid!r}, {self._state})"


def _begin(
    appender: Appender,
    database: Database,
    sid: str,
    new_session: dict[str, Any] | None,
) -> tuple[Connection, int, bool]:
    """A connection in a write transaction holding ``sid``'s row lock, the session's
    ``next_seq`` and whether it was created. Only this part of a unit of work is rerun
    on a lost lock race (nothing of the caller's has run yet), as ``Database.write``
    reruns a whole transaction."""
    if database.read_only:
        raise RepoError(f"{database.display_url} was opened read-only; this call would write")
    if not database.checked:
        database.read(lambda connection: None)  # the deferred schema check runs first
    attempt = 0
    reconnected = False
    while True:
        attempt += 1
        connection: Connection | None = None
        try:
            connection = database.engine.connect()
            connection.begin()
            next_seq, created = appender.lock(connection, sid, new_session)
            if next_seq is None:
                raise NotFound(f"no session {sid!r}")
            return connection, next_seq, created
        except BaseException as exc:
            if connection is not None:
                with contextlib.suppress(sa_exc.SQLAlchemyError):
                    connection.close()  # rolls back
            if not isinstance(exc, sa_exc.SQLAlchemyError):
                raise
            if isinstance(exc, sa_exc.DBAPIError):
                if exc.connection_invalidated and not reconnected and database.may_rerun():
                    reconnected = True
                    continue
                # The database's own bound: a writer's deadline pool on SQLite reruns
                # nothing (its busy error comes after the whole bound: see Database).
                if attempt < database._attempts and database.dialect.is_retryable(exc):
                    _pause(database, random.uniform(0, min(1.0, 0.01 * 2**attempt)))
                    continue
            raise translated(database, exc) from exc


def fetch_session(connection: Connection, session_id: str) -> Session:
    """The stored session, read on ``connection``.

    Raises:
        NotFound: no such session.
    """
    row = connection.execute(select(sessions_table).where(S.id == session_id)).first()
    if row is None:
        raise NotFound(f"no session {session_id!r}")
    return Session.model_construct(**_codec.session_from_row(row))


@contextlib.contextmanager
def _boundary(database: Database) -> Iterator[None]:
    """The error boundary around the store's own work inside a unit of work, as
    ``Database.write`` holds it: what escapes is a :class:`RepoError`, chained."""
    try:
        yield
    except RepoError:
        raise
    except sa_exc.SQLAlchemyError as exc:
        raise translated(database, exc) from exc
    except Exception as exc:
        # By its class: its text may hold a value (a driver that cannot bind one).
        raise RepoError(f"unexpected {type(exc).__name__} in a transaction") from exc


def _pause(database: Database, seconds: float) -> None:
    if database.asynchronous:
        _aio.sleep(seconds)
    else:
        time.sleep(seconds)


def translated(database: Database, exc: sa_exc.SQLAlchemyError) -> RepoError:
    """The :class:`RepoError` a SQLAlchemy error in a unit of work means, as
    ``Database.write`` translates it (by error code: see ``BackendDialect.translate``)."""
    if isinstance(exc, sa_exc.DBAPIError):
        return database.dialect.translate(exc)
    if isinstance(exc, sa_exc.PendingRollbackError):
        return BackendUnavailable(f"the connection was lost mid-transaction: {exc}")
    if isinstance(exc, sa_exc.TimeoutError):
        return BackendUnavailable(f"no database connection free: {exc}")
    # By its class only: SQLAlchemy's text has the statement and its parameters.
    return RepoError(f"SQLAlchemy {type(exc).__name__} in a transaction")
