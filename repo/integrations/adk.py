"""A Google ADK session service on sessionrepo: ``SessionRepoSessionService``.

```python
from sessionrepo.integrations.adk import SessionRepoSessionService

runner = Runner(agent=agent, app_name="weather", session_service=SessionRepoSessionService())
```

What goes where:

- An ADK session (``app_name``, ``user_id``, ``session_id``) is the sessionrepo session
  ``adk:<app>:<user>:<session>`` (``%`` and ``:`` in a part written ``%25`` and ``%3A``,
  so the id is unambiguous), with ``source="adk:<app>"`` and the ADK ``user_id``: the
  console, ``sessionrepo sessions list --source adk:<app>``, export and prune see it.
- An event is a message: the event itself, every field, in ``extra["adk_event"]``
  (``Event.model_dump(mode="json", exclude_none=True)``, read back with
  ``Event.model_validate``); its text parts in ``content`` (so ``search`` finds them);
  ``role`` ``user`` for the user's events, ``tool`` for function responses,
  ``assistant`` for the rest. Its key is ``uuid5`` of the session and ``Event.id``, so a
  retried ``append_event`` is a no-op (ADK's ``DatabaseSessionService`` raises an
  ``IntegrityError``), and a *different* event under a stored id raises
  :class:`~sessionrepo.ConflictError` (as ADK's database services refuse it; nothing is
  dropped silently).
- Session ids are trimmed, as ADK's services trim them: ``" s1 "`` is the session
  ``"s1"``, and a blank id gets a generated one (a padded id stored before is still
  found under its padded form).
- State values JSON cannot encode (a callable, NaN) are stored in their string form
  (NaN as ``null``) with a warning, as ADK's services store them.
- State: ``app:`` and ``user:`` keys in ``adk_app_states`` / ``adk_user_states``, the
  session's own in ``adk_sessions`` (migration 0008); ``temp:`` keys are never stored.

``append_event`` is one transaction under the session's row lock: the stale-session
check (a session object loaded before another append raises ADK's
``StaleSessionError``, as ``DatabaseSessionService`` does), the event, the three state
deltas, ``last_update_time`` and, for a rewind event (``Runner.rewind_async``),
sessionrepo's rewind: the events it undoes leave sessionrepo's live transcript (search,
counters, the console) and stay stored. ``get_session`` returns every stored event, the
rewound ones and the rewind event included, as ADK's own services do: ADK itself decides
what a rewind hides.

With ``outbox=`` the events take sessionrepo's write path instead
(:class:`~sessionrepo.AsyncTranscriptWriter`): an event the primary cannot take now
(down, frozen, locked) is parked in the outbox and replayed later, in order, and the turn
goes on. State then follows the events: ``adk_sessions.applied_seq`` records the newest
event whose delta the states hold, and the deltas of events stored after it (replayed
from an outbox, by this process or another) are applied by the next ``get_session`` or
``append_event`` of the session, in ``seq`` order, exactly once. On that path the stale
check is a read before the write (skipped while the session has events parked, or the
primary does not answer), so two copies of one session racing each other can both pass.

``list_sessions`` lists every session of the app in one statement (ADK's order), or, with
``page_size`` / ``page_token``, a page of sessionrepo's keyset-paged listing (a page
costs the same at any depth).

The transactions that do several things at once use the store's own building blocks
(the append under the session lock, the editing primitive), which the public API only
offers one call at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, Final, TypeVar

try:  # the framework comes with the extra: say which, not just "No module named"
    import google.adk  # noqa: F401
except ImportError as exc:
    raise ImportError(f"{__name__} needs Google ADK: pip install 'sessionrepo[adk]'") from exc
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.platform import time as platform_time
from google.adk.platform import uuid as platform_uuid
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session as AdkSession
from google.adk.sessions.state import State
from pydantic_core import to_jsonable_python
from sqlalchemy import Connection, Table, and_, delete, select, update
from typing_extensions import override

from sessionrepo.aio.api import AsyncSessionRepository, AsyncTranscriptWriter, open_async_repository
from sessionrepo.errors import (
    ArgumentTypeError,
    BackendUnavailable,
    ConflictError,
    InvalidArgument,
    InvalidMessage,
    NotFound,
    RepoError,
)
from sessionrepo.integrations.adk_compat import set_update_marker, update_marker
from sessionrepo.integrations.reported import reported_usage
from sessionrepo.models import Message, StoredMessage
from sessionrepo.models.adk import adk_app_states_table, adk_sessions_table, adk_user_states_table
from sessionrepo.models.tables import dump_json, messages_table, sessions_table
from sessionrepo.models.usage import Usage
from sessionrepo.store import codec as _codec
from sessionrepo.store.arguments import check_seconds
from sessionrepo.store.codec import check_session_id
from sessionrepo.store.repository import PreparedBatch, SessionRepository
from sessionrepo.store.transaction import SessionTransaction

__all__ = [
    "SessionRepoListSessionsResponse",
    "SessionRepoSessionService",
    "event_key",
    "event_message",
    "session_key",
    "stored_event",
]

T = TypeVar("T")

log = logging.getLogger("sessionrepo")

#: The namespace of the event keys: ``uuid5(EVENT_KEYS, f"{session}\n{event id}")``.
EVENT_KEYS: Final = uuid.UUID("5b0c6a0e-7d1f-5d43-9a4e-0a6b1d2c3e4f")
#: The key of ``Message.extra`` that holds the event.
EVENT_FIELD: Final = "adk_event"
#: How far back ``get_session`` reads at a time looking for ``after_timestamp``.
_BACKWARD_PAGE: Final = 200
#: ``delete_session`` prunes the session it has just ended: any later instant will do.
_FAR_FUTURE: Final = datetime(9999, 1, 1, tzinfo=UTC)
_STALE: Final = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)

A = adk_sessions_table.c
M = messages_table.c
S = sessions_table.c


def _quote(part: str) -> str:
    return part.replace("%", "%25").replace(":", "%3A")


def session_key(app_name: str, user_id: str, session_id: str) -> str:
    """The sessionrepo session id of an ADK session."""
    return f"adk:{_quote(app_name)}:{_quote(user_id)}:{_quote(session_id)}"


def event_key(session: str, event_id: str) -> uuid.UUID:
    """The message key of an ADK event of the sessionrepo session ``session``."""
    return uuid.uuid5(EVENT_KEYS, f"{session}\n{event_id}")


def _json_state(value: Mapping[str, Any], field: str) -> dict[str, Any]:
    """State as JSON data, checked before anything is written. Values that are not JSON
    are converted as ADK's own services convert them: a datetime (a Pydantic model...)
    faithfully; one nothing can encode (a callable, NaN) to its string form (NaN and
    infinities to ``null``, as in the event's own JSON), with a warning, and stored."""
    try:
        converted = to_jsonable_python(dict(value))
        dump_json(converted)
    except (TypeError, ValueError):
        log.warning(
            "ADK %s holds values JSON cannot encode: they are stored in their string form",
            field,
            exc_info=True,
        )
        try:
            converted = to_jsonable_python(dict(value), serialize_unknown=True, inf_nan_mode="null")
            dump_json(converted)
        except (TypeError, ValueError) as exc:
            raise InvalidMessage(field, f"state cannot be stored as JSON: {exc}") from exc
    if not isinstance(converted, dict):  # pragma: no cover - a dict converts to a dict
        raise InvalidMessage(field, "state must be a JSON object")
    return converted


@dataclass(frozen=True)
class _Deltas:
    app: dict[str, Any]
    user: dict[str, Any]
    session: dict[str, Any]

    @classmethod
    def of(cls, state: Mapping[str, Any] | None, field: str) -> _Deltas:
        app: dict[str, Any] = {}
        user: dict[str, Any] = {}
        own: dict[str, Any] = {}
        for key, value in (state or {}).items():
            if key.startswith(State.APP_PREFIX):
                app[key.removeprefix(State.APP_PREFIX)] = value
            elif key.startswith(State.USER_PREFIX):
                user[key.removeprefix(State.USER_PREFIX)] = value
            elif not key.startswith(State.TEMP_PREFIX):
                own[key] = value
        return cls(_json_state(app, field), _json_state(user, field), _json_state(own, field))


def _merged(
    app: Mapping[str, Any], user: Mapping[str, Any], own: Mapping[str, Any]
) -> dict[str, Any]:
    state = dict(own)
    state.update({State.APP_PREFIX + key: value for key, value in app.items()})
    state.update({State.USER_PREFIX + key: value for key, value in user.items()})
    return state


def _role(event: Event) -> str:
    parts = event.content.parts if event.content and event.content.parts else []
    if any(part.function_response is not None for part in parts):
        return "tool"
    return "user" if event.author == "user" else "assistant"


def event_message(session: str, event: Event) -> Message:
    """The message an event is stored as (see the module's docstring)."""
    parts = event.content.parts if event.content and event.content.parts else []
    text = "\n".join(part.text for part in parts if part.text and not part.thought)
    return Message(
        client_msg_uuid=event_key(session, event.id),
        role=_role(event),
        content=text or None,
        timestamp=event.timestamp,
        extra={EVENT_FIELD: event.model_dump(mode="json", exclude_none=True)},
    )


def stored_event(message: StoredMessage) -> Event | None:
    """The event a message holds (``None``: a message appended to the session by other
    means than this service, which ADK is not shown)."""
    extra = message.extra
    if not isinstance(extra, dict) or not isinstance(extra.get(EVENT_FIELD), dict):
        return None
    return Event.model_validate(extra[EVENT_FIELD])


class SessionRepoListSessionsResponse(ListSessionsResponse):
    """ADK's ``ListSessionsResponse`` with the token of the next page (``None``: the
    last page, or a listing that was not paged)."""

    next_page_token: str | None = None


@dataclass(frozen=True)
class _Loaded:
    update_time: float
    state: dict[str, Any]
    next_seq: int
    applied_seq: int


class SessionRepoSessionService(BaseSessionService):
    """ADK's ``BaseSessionService`` on sessionrepo (see the module's docstring).

    Args:
        url: a database URL (PostgreSQL or SQLite); ``None``: ``SESSIONREPO_DATABASE_URL``,
            else the embedded SQLite default, as :func:`sessionrepo.open_repository`.
            Opened on first use and closed by :meth:`close`.
        repository: an opened :class:`~sessionrepo.AsyncSessionRepository` instead
            (it stays the caller's: :meth:`close` leaves it open).
        outbox: write events through an :class:`~sessionrepo.AsyncTranscriptWriter`
            (see the module's docstring): a SQLite URL for its outbox file (what the
            README recommends), or ``True`` for ``SESSIONREPO_OUTBOX_URL``, else a table
            in the primary. Its drainer runs while the service is open (:attr:`writer`).
        deadline: with ``outbox``, the seconds an append may wait for the primary
            before its event is parked (the writer's ``deadline``).

    Raises:
        InvalidArgument: both ``url`` and ``repository`` given.
        ArgumentTypeError: ``repository`` is not an ``AsyncSessionRepository``.
    """

    def __init__(
        self,
        *,
        url: str | None = None,
        repository: AsyncSessionRepository | None = None,
        outbox: bool | str = False,
        deadline: float = 5.0,
    ) -> None:
        if url is not None and repository is not None:
            raise InvalidArgument("repository", "give a url or a repository, not both")
        if url is not None and not isinstance(url, str):
            raise ArgumentTypeError("url", f"must be a string, got {type(url).__name__}")
        if repository is not None and not isinstance(repository, AsyncSessionRepository):
            raise ArgumentTypeError(
                "repository",
                "must be an AsyncSessionRepository (open_async_repository()): ADK is asyncio",
            )
        if not isinstance(outbox, bool | str):
            raise ArgumentTypeError(
                "outbox", f"must be a bool or a URL, got {type(outbox).__name__}"
            )
        self._url = url
        self._repository = repository
        self._owns_repository = repository is None
        self._outbox = outbox
        self._deadline = check_seconds(deadline, "deadline")
        self._writer: AsyncTranscriptWriter | None = None
        self._opening = asyncio.Lock()
        self._closed = False

    # -- plumbing -----------------------------------------------------------------

    async def _repo(self) -> AsyncSessionRepository:
        if self._closed:
            raise RepoError("this SessionRepoSessionService is closed")
        if self._repository is None or (self._outbox is not False and self._writer is None):
            async with self._opening:
                if self._repository is None:
                    # An outbox is for starting while the primary is down, too.
                    self._repository = await open_async_repository(
                        self._url, require_connection=self._outbox is False
                    )
                if self._outbox is not False and self._writer is None:
                    outbox_url = self._outbox if isinstance(self._outbox, str) else None
                    writer = AsyncTranscriptWriter(
                        self._repository, outbox_url=outbox_url, deadline=self._deadline
                    )
                    writer.start()  # startup recovery first: what an earlier run parked
                    self._writer = writer
        return self._repository

    @property
    def writer(self) -> AsyncTranscriptWriter | None:
        """The write path events take with ``outbox`` (its ``drain``, ``pending``,
        ``status``); ``None`` without, or before first use."""
        return self._writer

    async def _run(self, work: Callable[[SessionRepository], T]) -> T:
        """``work(repository)`` with the sync repository's database waits awaited,
        on the async repository's task pool (its ``close`` waits for it)."""
        repo = await self._repo()
        # One transaction of our own for what the public API cannot do in one: the
        # stale check, the event, the state and a rewind together, as ADK's
        # DatabaseSessionService does them.
        return await repo.run_sync(work)

    async def close(self) -> None:
        """Stop the outbox's drainer and close the repository this service opened (one
        handed in stays open). The service is unusable afterwards."""
        self._closed = True
        writer, self._writer = self._writer, None
        if writer is not None:
            await writer.close()
        repository, self._repository = self._repository, None
        if repository is not None and self._owns_repository:
            await repository.close()

    async def __aenter__(self) -> SessionRepoSessionService:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- sessions -----------------------------------------------------------------

    @override
    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> AdkSession:
        if session_id:
            session_id = await self._resolved_id(app_name, user_id, session_id)
        session_id = session_id or platform_uuid.new_uuid()  # blank: generated, as ADK does
        sid = session_key(app_name, user_id, session_id)
        deltas = _Deltas.of(state, "state")
        now = platform_time.get_time()
        # Checked before anything is written (an id sessionrepo cannot store raises).
        check_session_id(sid)
        row = _codec.session_row(
            _codec.build_session(sid, {"source": f"adk:{app_name}", "user_id": user_id}, "session")
        )

        def work(sync: SessionRepository) -> tuple[dict[str, Any], int] | None:
            def created(conn: Connection) -> tuple[dict[str, Any], int] | None:
                dialect = sync.database.dialect
                # The sessionrepo session, if new (as create_session makes it), in the
                # same transaction as its ADK row: one commit for both.
                conn.execute(dialect.insert_ignoring(sessions_table, ["id"]).values(**row))
                next_seq = conn.execute(select(S.next_seq).where(S.id == sid)).scalar_one()
                inserted = conn.execute(
                    dialect.insert_ignoring(adk_sessions_table, ["session_id"])
                    .values(
                        session_id=sid,
                        app_name=app_name,
                        user_id=user_id,
                        adk_session_id=session_id,
                        state=deltas.session,
                        update_time=now,
                        applied_seq=next_seq - 1,
                    )
                    .returning(A.session_id)
                ).first()
                if inserted is None:
                    return None
                app = _merge_state(conn, sync, _app_scope(app_name), deltas.app, now)
                user = _merge_state(conn, sync, _user_scope(app_name, user_id), deltas.user, now)
                return _merged(app, user, deltas.session), int(next_seq)

            return sync.database.write(created)

        made = await self._run(work)
        if made is None:
            raise AlreadyExistsError(f"Session with id {session_id} already exists.")
        merged, next_seq = made
        session = AdkSession(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=merged,
            last_update_time=now,
        )
        set_update_marker(session, str(next_seq))
        return session

    @override
    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> AdkSession | None:
        session_id = await self._resolved_id(app_name, user_id, session_id)
        sid = session_key(app_name, user_id, session_id)
        loaded = await self._load(sid, app_name, user_id)
        if loaded is not None and loaded.applied_seq < loaded.next_seq - 1:
            # Events replayed from an outbox since: their deltas first, then read again.
            await self._run(partial(_catch_up, sid))
            loaded = await self._load(sid, app_name, user_id)
        if loaded is None:
            return None
        events = await self._events(sid, loaded.next_seq, config or GetSessionConfig())
        session = AdkSession(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=loaded.state,
            events=events,
            last_update_time=loaded.update_time,
        )
        set_update_marker(session, str(loaded.next_seq))
        return session

    async def _resolved_id(self, app_name: str, user_id: str, session_id: str) -> str:
        """``session_id`` trimmed, as ADK's services trim it, unless a session is stored
        under its padded form (one made before ids were trimmed: found as it was)."""
        if not isinstance(session_id, str) or session_id == session_id.strip():
            return session_id  # nothing to trim (a wrong type is refused further on)
        padded = session_key(app_name, user_id, session_id)

        def work(sync: SessionRepository) -> bool:
            return sync.database.read(
                lambda conn: (
                    conn.execute(select(A.session_id).where(A.session_id == padded)).first()
                    is not None
                )
            )

        return session_id if await self._run(work) else session_id.strip()

    async def _load(
        self, sid: str, app_name: str, user_id: str, *, bounded: bool = False
    ) -> _Loaded | None:
        def work(sync: SessionRepository) -> _Loaded | None:
            def read(conn: Connection) -> _Loaded | None:
                row = conn.execute(
                    select(A.state, A.update_time, A.applied_seq, S.next_seq)
                    .join(sessions_table, S.id == A.session_id)
                    .where(A.session_id == sid)
                ).first()
                if row is None:
                    return None
                app = _read_state(conn, _app_scope(app_name))
                user = _read_state(conn, _user_scope(app_name, user_id))
                return _Loaded(
                    row.update_time,
                    _merged(app, user, row.state),
                    int(row.next_seq),
                    int(row.applied_seq),
                )

            database = sync.bounded_database(self._deadline) if bounded else sync.database
            return database.read(read)

        return await self._run(work)

    async def _events(self, sid: str, next_seq: int, config: GetSessionConfig) -> list[Event]:
        """The session's events stored before ``next_seq`` (what the state read saw),
        in the order they were appended, as ``config`` limits them."""
        limit = config.num_recent_events
        after = config.after_timestamp
        if limit == 0 or next_seq <= 1:
            return []
        repo = await self._repo()
        if after is None:
            # The events straight from the stored columns (each message's wire dict
            # carries its extra, the event), no StoredMessage built.
            wires = await repo.load_openai(
                sid, before_seq=next_seq, limit=limit, include_retracted=True
            )
            return [
                Event.model_validate(wire[EVENT_FIELD])
                for wire in wires
                if isinstance(wire.get(EVENT_FIELD), dict)
            ]
        # Newest first until an event older than after_timestamp: the suffix of events
        # at or after it (as the in-memory service cuts it), read a page at a time.
        newest_first: list[Event] = []
        before = next_seq
        while before > 1 and (limit is None or len(newest_first) < limit):
            page = await repo.load_transcript(
                sid, before_seq=before, limit=_BACKWARD_PAGE, include_retracted=True
            )
            if not page:
                break
            for message in reversed(page):
                event = stored_event(message)
                if event is None:
                    continue
                if event.timestamp < after or (limit is not None and len(newest_first) >= limit):
                    before = 0
                    break
                newest_first.append(event)
            else:
                before = page[0].seq
        newest_first.reverse()
        return newest_first

    @override
    async def list_sessions(
        self,
        *,
        app_name: str,
        user_id: str | None = None,
        page_size: int | None = None,
        page_token: str | None = None,
    ) -> SessionRepoListSessionsResponse:
        """The app's sessions (a user's, with ``user_id``), without events, with state.

        Without ``page_size``: every session, oldest update first, as ADK's services
        list them (one statement on ``adk_sessions``, by its ``(app_name, user_id)``
        index). With ``page_size`` (1 to 1000): one page of sessionrepo's keyset-paged
        listing, *newest* activity first (a page costs the same at any depth), and
        ``next_page_token`` for the next (``page_token``); ``None`` on the last page.
        """
        if page_size is None:
            if page_token is not None:
                raise InvalidArgument("page_token", "is given with page_size")
            return SessionRepoListSessionsResponse(sessions=await self._list_all(app_name, user_id))
        repo = await self._repo()
        page = await repo.list_sessions(
            source=f"adk:{app_name}", user_id=user_id, limit=page_size, cursor=page_token
        )
        sessions = await self._listed(app_name, [summary.id for summary in page.sessions])
        return SessionRepoListSessionsResponse(sessions=sessions, next_page_token=page.next_cursor)

    async def _list_all(self, app_name: str, user_id: str | None) -> list[AdkSession]:
        def work(sync: SessionRepository) -> list[AdkSession]:
            def read(conn: Connection) -> list[AdkSession]:
                query = select(A.user_id, A.adk_session_id, A.state, A.update_time).where(
                    A.app_name == app_name
                )
                users = select(adk_user_states_table).where(
                    adk_user_states_table.c.app_name == app_name
                )
                if user_id is not None:
                    query = query.where(A.user_id == user_id)
                    users = users.where(adk_user_states_table.c.user_id == user_id)
                rows = conn.execute(query).all()
                app = _read_state(conn, _app_scope(app_name))
                user_states = {row.user_id: row.state for row in conn.execute(users)}
                listed = [
                    AdkSession(
                        id=row.adk_session_id,
                        app_name=app_name,
                        user_id=row.user_id,
                        state=_merged(app, user_states.get(row.user_id, {}), row.state),
                        last_update_time=row.update_time,
                    )
                    for row in rows
                ]
                listed.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
                return listed

            return sync.database.read(read)

        return await self._run(work)

    async def _listed(self, app_name: str, sids: list[str]) -> list[AdkSession]:
        if not sids:
            return []

        def work(sync: SessionRepository) -> list[AdkSession]:
            def read(conn: Connection) -> list[AdkSession]:
                rows = conn.execute(
                    select(A.session_id, A.user_id, A.adk_session_id, A.state, A.update_time).where(
                        A.session_id.in_(sids), A.app_name == app_name
                    )
                ).all()
                app = _read_state(conn, _app_scope(app_name))
                users = {row.user_id for row in rows}
                user_states = {
                    row.user_id: row.state
                    for row in conn.execute(
                        select(adk_user_states_table).where(
                            adk_user_states_table.c.app_name == app_name,
                            adk_user_states_table.c.user_id.in_(sorted(users)),
                        )
                    )
                }
                by_sid = {row.session_id: row for row in rows}
                listed = []
                for sid in sids:  # in the listing's order
                    row = by_sid.get(sid)
                    if row is None:
                        continue  # a sessionrepo session that is not (or no longer) ADK's
                    session = AdkSession(
                        id=row.adk_session_id,
                        app_name=app_name,
                        user_id=row.user_id,
                        state=_merged(app, user_states.get(row.user_id, {}), row.state),
                        last_update_time=row.update_time,
                    )
                    listed.append(session)
                return listed

            return sync.database.read(read)

        return await self._run(work)

    @override
    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete the session, its events and its state for real (sessionrepo's prune:
        ended, then deleted). A session that does not exist: nothing happens. Events of
        it still parked in an outbox are kept (they are the only copy)."""
        session_id = await self._resolved_id(app_name, user_id, session_id)
        sid = session_key(app_name, user_id, session_id)
        repo = await self._repo()
        try:
            await repo.end_session(sid, "adk:delete_session")
        except NotFound:
            return
        await repo.delete_ended_sessions([sid], cutoff=_FAR_FUTURE)

        def work(sync: SessionRepository) -> None:
            # The foreign key's cascade took it; explicit for a connection without one.
            sync.database.write(
                lambda conn: conn.execute(delete(adk_sessions_table).where(A.session_id == sid))
            )

        await self._run(work)

    @override
    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        def work(sync: SessionRepository) -> dict[str, Any]:
            return sync.database.read(
                lambda conn: _read_state(conn, _user_scope(app_name, user_id))
            )

        return await self._run(work)

    # -- events -------------------------------------------------------------------

    @override
    async def append_event(self, session: AdkSession, event: Event) -> Event:
        """Store the event and apply its state delta, in one transaction (see the
        module's docstring). Appending an event that is stored already (a retry whose
        first attempt committed) is a no-op: nothing is written, the delta is not
        applied twice, and the event is added to ``session`` only if it is not there.

        With ``outbox``, the event takes the write path instead: stored, or parked while
        the primary cannot take it (then its state delta is applied once it is
        replayed, by the next ``get_session`` or ``append_event`` of the session).

        Raises:
            SessionNotFoundError: no such session.
            StaleSessionError: the session was appended to since ``session`` was loaded.
            ConflictError: another event with this event's id is stored (nothing was
                written), as ADK's database services refuse it.
            InvalidMessage: the event or its state cannot be stored (nothing was).
        """
        if event.partial:
            return event
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        sid = session_key(session.app_name, session.user_id, session.id)
        repo = await self._repo()
        pending = _Pending(
            sid=sid,
            session=session,
            event=event,
            deltas=_Deltas.of(event.actions.state_delta if event.actions else None, "state_delta"),
            batch=repo.prepare(sid, [event_message(sid, event)], usage=event_usage(event)),
            rewound=_rewound_keys(sid, session, event),
        )
        outcome: int | str | _Duplicate | None
        if self._writer is None:
            outcome = await self._run(partial(_append_event, pending))
        else:
            outcome = await self._write_through(self._writer, pending)
        if outcome == "missing":
            raise SessionNotFoundError(f"Session {session.id} not found.")
        if outcome == "stale":
            raise StaleSessionError(_STALE)
        if outcome == "conflict":
            # As ADK's database services refuse it (an IntegrityError there): the
            # stored event stays, this one is not stored, and nothing is silently lost.
            raise ConflictError(
                f"Session {session.id} holds another event with id {event.id!r}: "
                "an event id is stored once (a retry of the same event is a no-op)",
                session_id=sid,
                conflicts=[pending.key],
            )
        duplicate = isinstance(outcome, _Duplicate)
        seq = outcome.next_seq if isinstance(outcome, _Duplicate) else outcome
        set_update_marker(session, None if seq is None else str(seq))
        session.last_update_time = event.timestamp
        if duplicate and any(known.id == event.id for known in reversed(session.events)):
            return event  # a retry of what this object holds already
        return self._commit_event_to_session(session, event)

    async def _write_through(
        self, writer: AsyncTranscriptWriter, pending: _Pending
    ) -> int | str | _Duplicate | None:
        """``append_event`` on the write path: the stale check where the primary
        answers (a read, so it is not atomic with the write), the event through the
        writer, then the state deltas of what is stored (a transaction of its own, which
        the next read repeats if it fails now: nothing is applied twice)."""
        sid, session = pending.sid, pending.session
        marker = update_marker(session)
        known = marker is not None and marker.isdigit()
        expected = int(marker) + 1 if marker is not None and known else None
        try:
            # With messages of the session queued, the primary's view is behind them:
            # nothing to check against until they are replayed.
            if await writer.pending(sid) == 0:
                loaded = await self._load(sid, session.app_name, session.user_id, bounded=True)
                if loaded is None:
                    return "missing"
                if known and marker != str(loaded.next_seq):
                    stored = await self._run(
                        lambda sync: sync.bounded_database(self._deadline).read(
                            partial(_as_stored, pending, next_seq=loaded.next_seq)
                        )
                    )
                    return stored or "stale"  # a retry: the writer has it
        except BackendUnavailable:
            pass  # the primary is away: the writer parks, behind what it parked before
        result = await writer.write(
            sid, pending.batch.messages, usage=list(pending.batch.usage) or None
        )
        if result.conflicts:
            return "conflict"
        if result.duplicates:
            # Stored already (a retry), or parked already with the same key: a no-op.
            return _Duplicate(None if expected is None else expected - 1)
        if result.status == "parked" and result.parked == 0:
            return _Duplicate(None if expected is None else expected - 1)
        if pending.rewound:
            await writer.retract(sid, pending.rewound)
        if result.status == "stored":
            with contextlib.suppress(BackendUnavailable):
                await self._run(partial(_catch_up, sid, timeout=self._deadline))
        return expected


@dataclass(frozen=True)
class _Duplicate:
    """``append_event``'s outcome for an event stored already: nothing written."""

    next_seq: int | None


@dataclass(frozen=True)
class _Pending:
    """An event on its way into the store."""

    sid: str
    session: AdkSession
    event: Event
    deltas: _Deltas
    batch: PreparedBatch
    rewound: list[uuid.UUID]

    @property
    def key(self) -> uuid.UUID:
        return event_key(self.sid, self.event.id)

    @property
    def content_hash(self) -> bytes:
        return bytes(self.batch.rows[0]["content_hash"])


def event_usage(event: Event) -> list[Usage] | None:
    """The usage ADK reported on the event (``usage_metadata``: Gemini's counts, the
    thoughts counted as output and as reasoning; the model from ``model_version``),
    keyed by the event's message; ``None`` when it reported none."""
    reported = getattr(event, "usage_metadata", None)
    if reported is None:
        return None
    thoughts = reported.thoughts_token_count or 0
    model = getattr(event, "model_version", None)
    record = reported_usage(
        f"ADK event {getattr(event, 'id', None)!r}",
        model=model if isinstance(model, str) and model else None,
        provider="google",
        input_tokens=reported.prompt_token_count or 0,
        output_tokens=(reported.candidates_token_count or 0) + thoughts,
        cache_read_tokens=reported.cached_content_token_count or 0,
        reasoning_tokens=thoughts,
    )
    return None if record is None else [record]


def _stored_hash(sid: str, key: uuid.UUID, conn: Connection) -> bytes | None:
    """The content hash of the message stored under ``key`` (``None``: none is)."""
    found = conn.execute(
        select(M.content_hash).where(M.session_id == sid, M.client_msg_uuid == key)
    )
    return found.scalar()


def _as_stored(pending: _Pending, conn: Connection, next_seq: int) -> _Duplicate | str | None:
    """What the event's key holds already: this very event (a retry: ``_Duplicate``),
    another event under the same id (``"conflict"``), or nothing (``None``)."""
    stored = _stored_hash(pending.sid, pending.key, conn)
    if stored is None:
        return None
    return _Duplicate(next_seq) if stored == pending.content_hash else "conflict"


def _append_event(pending: _Pending, sync: SessionRepository) -> int | str | _Duplicate:
    """``append_event``'s unit of work (see :func:`_append_in`)."""
    try:
        with sync.session_transaction(pending.sid, create=False) as tx:
            return _append_in(sync, pending, tx)
    except NotFound:  # on entry: no such session, nothing written
        return "missing"
    except RepoError:
        raise
    except Exception as exc:  # this code's own failure: rolled back, in the one error root
        raise RepoError(f"unexpected {type(exc).__name__} in append_event") from exc


def _append_in(
    sync: SessionRepository, pending: _Pending, tx: SessionTransaction
) -> int | str | _Duplicate:
    """``append_event``'s transaction, under the session's lock: the stale check, the
    event, the states, a rewind; the ``next_seq`` after it, or ``"missing"`` /
    ``"stale"`` (nothing written)."""
    sid, session, event = pending.sid, pending.session, pending.event
    conn, next_seq = tx.connection, tx.next_seq
    row = conn.execute(
        select(A.update_time, A.applied_seq, A.state).where(A.session_id == sid).with_for_update()
    ).first()
    if row is None:
        return "missing"
    marker = update_marker(session)
    if marker is not None and marker != str(next_seq):
        # Appended to since this object was loaded: by this very event (a retry whose
        # first attempt committed: a no-op), or by someone else (stale).
        return _as_stored(pending, conn, next_seq) or "stale"
    if marker is None and row.update_time > session.last_update_time:
        # A session object without a marker (made by hand): stale unless what is
        # stored last is what it holds last, as ADK's DatabaseSessionService decides.
        stored = _as_stored(pending, conn, next_seq)
        if stored is not None:
            return stored
        last = conn.execute(
            select(M.client_msg_uuid).where(M.session_id == sid, M.seq == next_seq - 1)
        ).scalar()
        known = event_key(sid, session.events[-1].id) if session.events else None
        if last != known:
            return "stale"
    current = None
    if row.applied_seq < next_seq - 1:
        _catch_up_in(sync, tx)  # events replayed from an outbox first
    else:
        current = (dict(row.state), row.update_time)
    result = tx.append(pending.batch.messages)
    if not result.inserted:
        # Stored before this object was loaded: this event (a retry), or another one
        # under its id.
        return "conflict" if result.conflicts else _Duplicate(next_seq)
    if pending.batch.usage:
        tx.record_usage(pending.batch.usage)
    _apply(
        conn,
        sync,
        sid,
        app_name=session.app_name,
        user_id=session.user_id,
        events=[event],
        through_seq=next_seq,
        current=current,
    )
    if pending.rewound:
        tx.supersede(pending.rewound, "retracted")
    return next_seq + 1


def _catch_up(sid: str, sync: SessionRepository, *, timeout: float | None = None) -> None:
    """:func:`_catch_up_in` in a unit of work of its own (none without the session)."""
    with (
        contextlib.suppress(NotFound),  # on entry: no such session, nothing written
        sync.session_transaction(sid, create=False, timeout=timeout) as tx,
    ):
        _catch_up_in(sync, tx)


def _catch_up_in(sync: SessionRepository, tx: SessionTransaction) -> None:
    """Apply the state deltas of the session's events stored after ``applied_seq``
    (replayed from an outbox), in ``seq`` order, under the session's lock."""
    sid, conn = tx.session_id, tx.connection
    row = conn.execute(
        select(A.app_name, A.user_id, A.applied_seq).where(A.session_id == sid).with_for_update()
    ).first()
    if row is None:
        return
    stored = conn.execute(
        select(M.seq, M.extra).where(M.session_id == sid, M.seq > row.applied_seq).order_by(M.seq)
    ).all()
    if not stored:
        return
    events = [
        Event.model_validate(message.extra[EVENT_FIELD])
        for message in stored
        if isinstance(message.extra, dict) and EVENT_FIELD in message.extra
    ]
    _apply(
        conn,
        sync,
        sid,
        app_name=row.app_name,
        user_id=row.user_id,
        events=events,
        through_seq=int(stored[-1].seq),
    )


def _apply(
    conn: Connection,
    sync: SessionRepository,
    sid: str,
    *,
    app_name: str,
    user_id: str,
    events: Sequence[Event],
    through_seq: int,
    current: tuple[dict[str, Any], float] | None = None,
) -> None:
    """Merge the events' state deltas into the three states, in order, and record that
    the session's state holds every delta up to ``through_seq``. ``current``: the
    session's state and update time as the caller read them under the lock."""
    if current is None:
        own = conn.execute(select(A.state, A.update_time).where(A.session_id == sid)).one()
        current = (dict(own.state), own.update_time)
    state, update_time = current
    for event in events:
        deltas = _Deltas.of(event.actions.state_delta if event.actions else None, "state_delta")
        # Only what changes is touched: an event without app or user keys takes no lock
        # on the rows every session of the app (or the user) shares.
        if deltas.app:
            _merge_state(conn, sync, _app_scope(app_name), deltas.app, event.timestamp)
        if deltas.user:
            _merge_state(conn, sync, _user_scope(app_name, user_id), deltas.user, event.timestamp)
        state.update(deltas.session)
        update_time = event.timestamp
    conn.execute(
        update(adk_sessions_table)
        .where(A.session_id == sid)
        .values(state=state, update_time=update_time, applied_seq=through_seq)
    )


def _rewound_keys(sid: str, session: AdkSession, event: Event) -> list[uuid.UUID]:
    """For a rewind event: the keys of the events it undoes (from the first event of
    the invocation it rewinds to, on) and its own, which ADK does not show either."""
    target = event.actions.rewind_before_invocation_id if event.actions else None
    if not target:
        return []
    for index, known in enumerate(session.events):
        if known.invocation_id == target:
            undone = [event_key(sid, e.id) for e in session.events[index:]]
            return [*undone, event_key(sid, event.id)]
    return []


# -- state ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scope:
    table: Table
    keys: dict[str, str]

    @property
    def where(self) -> Any:
        return and_(*(self.table.c[name] == value for name, value in self.keys.items()))


def _app_scope(app_name: str) -> _Scope:
    return _Scope(adk_app_states_table, {"app_name": app_name})


def _user_scope(app_name: str, user_id: str) -> _Scope:
    return _Scope(adk_user_states_table, {"app_name": app_name, "user_id": user_id})


def _read_state(conn: Connection, scope: _Scope) -> dict[str, Any]:
    state = conn.execute(select(scope.table.c.state).where(scope.where)).scalar()
    return dict(state) if state else {}


def _merge_state(
    conn: Connection,
    sync: SessionRepository,
    scope: _Scope,
    delta: Mapping[str, Any],
    now: float,
) -> dict[str, Any]:
    """The scope's state with ``delta`` merged in (``dict.update``), stored; its row
    made when missing and locked for the merge (concurrent writers of one app or user
    queue there: no update is lost)."""
    dialect = sync.database.dialect
    conn.execute(
        dialect.insert_ignoring(scope.table, list(scope.keys)).values(
            **scope.keys, state={}, update_time=now
        )
    )
    if not delta:
        return _read_state(conn, scope)
    current = conn.execute(
        select(scope.table.c.state).where(scope.where).with_for_update()
    ).scalar_one()
    state = {**current, **delta}
    conn.execute(update(scope.table).where(scope.where).values(state=state, update_time=now))
    return state
