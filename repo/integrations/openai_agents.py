"""The OpenAI Agents SDK's ``Session`` on sessionrepo: ``SessionRepoSession``.

Install with ``pip install 'sessionrepo[openai-agents]'``; then pass
``SessionRepoSession("user-42")`` (the embedded default store) or
``SessionRepoSession("user-42", url="postgresql://...")`` as ``Runner.run(...,
session=...)``.

What it keeps of the SDK's contract, and where it is stricter:

- Items are stored as given, every key in order (``Message.from_openai``; a
  Responses-API item keeps its ``type``), and come back equal from ``get_items``, which
  returns the latest ``limit`` items (``SessionSettings.limit`` by default) in
  chronological order; a limit of 0 or less returns nothing.
- The key of an item with an ``id`` is derived from the session and the id
  (:func:`item_key`), so sending a batch again (a retry after a lost acknowledgement, a
  crash between commit and return) stores nothing twice: the SDK's own backends store it
  again. An item without an ``id`` gets a fresh key, so separate ``add_items`` calls with
  equal items append, as the SDK says. A ``client_msg_uuid`` the caller put on an item is
  its key (a gateway that stamps its items), and is not returned by ``get_items``.
- ``pop_item`` and ``clear_session`` edit the live history; nothing is deleted (the items
  stay readable with ``load_transcript(..., include_retracted=True)``). ``pop_item``
  takes exactly the newest item (a retract of its key; it reads the newest, then takes
  that one out, so an item appended concurrently in between stays).
- An item added again after it was popped or cleared comes back, under the next
  generation of its derived key (``item_key(session_id, id, n)``), as the SDK's rewind
  (which adds back what it popped when the tail was not what it expected) and its
  compaction (``OpenAIResponsesCompactionSession`` clears the session and adds the
  compacted items, which may keep their ids) need. Wrapped in that class, this session
  loses nothing in a compaction: the history before it stays stored. (Its atomic
  suffix replacement, a private hook of the SDK's own stores, is not offered: automatic
  compaction then needs the whole history to match, as for any other backend.)
- With ``use_outbox=True`` the writes go through a :class:`~sessionrepo.TranscriptWriter`
  (an :class:`~sessionrepo.AsyncTranscriptWriter` over an async repository):
  when the primary is down or locked, ``add_items`` (and the edits) park in the outbox and
  return; they are replayed in order later, idempotently. Reads need the primary, and a
  session with parked writes is drained before it is read (or the read raises
  :class:`~sessionrepo.BackendUnavailable` rather than return a history with a gap).
  Bringing an item back (above) reads the primary too; and an item with an id added
  back while the pop or clear that took it out is still parked stays out when both
  are replayed (the replay cannot tell it from a retry).

The ``wrapper`` keyword the SDK passes to sessions that accept it (the run context) is
accepted on the four methods and not used.

One object serves any event loop, one call or many at a time, as the SDK's own sessions
do (a sync web server's worker threads each run a turn with ``asyncio.run`` on one cached
session object): what it opens from ``url=`` is a sync :class:`~sessionrepo.SessionRepository`
(thread-safe, its connections pooled, bound to no loop), each call run in a worker thread
of the calling loop. One engine per object, however many loops used it; ``close()``
(sync, as ``SQLiteSession.close()``) releases it. An
:class:`~sessionrepo.AsyncSessionRepository` passed in is awaited on the loop it belongs
to, and the session with it.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Concatenate, Final, ParamSpec, TypeVar, cast

try:  # the framework comes with the extra: say which, not just "No module named"
    import agents  # noqa: F401
except ImportError as exc:
    raise ImportError(
        f"{__name__} needs the OpenAI Agents SDK: pip install 'sessionrepo[openai-agents]'"
    ) from exc
from agents.memory.session_settings import (
    SessionSettings,
    coerce_session_settings,
    resolve_session_limit,
)
from agents.models.fake_id import FAKE_RESPONSES_ID

from sessionrepo import (
    AsyncSessionRepository,
    AsyncTranscriptWriter,
    BackendUnavailable,
    NotFound,
    SessionRepository,
    TranscriptWriter,
    open_repository,
)
from sessionrepo.errors import ArgumentTypeError, InvalidArgument, InvalidMessage, RepoError
from sessionrepo.integrations.reported import reported_usage
from sessionrepo.models import StoredMessage
from sessionrepo.models.message import KEY_FIELD, new_key
from sessionrepo.models.usage import Usage

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.memory import Session
    from agents.run_context import RunContextWrapper

__all__ = ["ITEM_KEY_NAMESPACE", "SessionRepoSession", "item_key"]

#: The UUID namespace of derived item keys (``uuid5`` of ``"https://github.com/sessionrepo/
#: integrations/openai-agents/item-id"`` in ``NAMESPACE_URL``). Fixed forever: changing it
#: would make every retried item a new one.
ITEM_KEY_NAMESPACE: Final = uuid.UUID("b692089a-6533-5d64-9373-310eb164749c")

#: ``before_seq`` past every message: ``load_transcript`` pages backward from the end.
_END: Final = 2**63 - 1

P = ParamSpec("P")
T = TypeVar("T")


def _writer_options(writer: type[object]) -> frozenset[str]:
    """What ``writer_options`` may hold for ``writer``: its own keyword arguments."""
    return frozenset(
        name
        for name, parameter in inspect.signature(writer).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
        and name not in {"outbox_url", "task_pool"}
    )


_WRITER_OPTIONS: Final = {
    TranscriptWriter: _writer_options(TranscriptWriter),
    AsyncTranscriptWriter: _writer_options(AsyncTranscriptWriter),
}

#: Where the sessions this class creates say they come from (``Session.source``).
DEFAULT_SOURCE: Final = "openai-agents"


def item_key(session_id: str, item_id: str, generation: int = 0) -> uuid.UUID:
    """The key of the item ``item_id`` in ``session_id``: the same for every retry.

    ``generation`` counts how often the item was taken out of the live history (popped,
    cleared) and added back: each time it comes back as a new message, under the next
    generation's key.
    """
    name = f"{session_id}:{item_id}" if generation == 0 else f"{session_id}:{item_id}#{generation}"
    return uuid.uuid5(ITEM_KEY_NAMESPACE, name)


def _item_id(item: Mapping[str, Any]) -> str | None:
    """The provider's id of an item, if it names one. Not one: the SDK's placeholder for
    providers without ids (every item of such a model carries it), and the ``id`` of an
    ``item_reference``, which is the id of the item it points to."""
    if item.get("type") == "item_reference":
        return None
    value = item.get("id")
    if isinstance(value, str) and value and value != FAKE_RESPONSES_ID:
        return value
    return None


class SessionRepoSession:
    """An OpenAI Agents SDK ``Session`` stored by sessionrepo (see the module docstring).

    Use it from any event loop (see the module docstring), and ``close()`` it (or use it
    as ``async with``) to release what it opened itself; a ``repository=`` passed in stays
    the caller's.

    Args:
        session_id: the conversation (sessionrepo's session id).
        url: the database (``postgresql://...``, ``sqlite:///path``, a file path); ``None``:
            ``SESSIONREPO_DATABASE_URL``, else the embedded SQLite default.
        repository: an opened repository instead of ``url``: a
            :class:`~sessionrepo.SessionRepository` (any loop), or an
            :class:`~sessionrepo.AsyncSessionRepository` (then the session is used from
            that repository's event loop only).
        session_settings: the SDK's settings (``limit``: how many items ``get_items``
            returns by default).
        use_outbox: write through a :class:`~sessionrepo.TranscriptWriter` (an
            :class:`~sessionrepo.AsyncTranscriptWriter` over an async repository).
        outbox_url: where that writer parks (default: ``SESSIONREPO_OUTBOX_URL``, else
            the primary database).
        writer_options: more arguments of that writer (``deadline``, ``max_attempts``...).
        session_defaults: the fields of the session row the first write creates
            (``source`` defaults to ``"openai-agents"``; ``user_id``, ``title``...).

    Raises:
        InvalidArgument: both ``url`` and ``repository``, an empty ``session_id``, writer
            options without ``use_outbox``, or one the writer does not take
            (:class:`~sessionrepo.errors.ArgumentTypeError`: of the wrong type).
    """

    session_id: str
    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        *,
        url: str | None = None,
        repository: SessionRepository | AsyncSessionRepository | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        use_outbox: bool = False,
        outbox_url: str | None = None,
        writer_options: Mapping[str, Any] | None = None,
        session_defaults: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(session_id, str):
            raise ArgumentTypeError("session_id", "a session id is a str")
        if not session_id:
            raise InvalidArgument("session_id", "a session id is not empty")
        if url is not None and repository is not None:
            raise InvalidArgument("url", "give url= or repository=, not both")
        if url is not None and not isinstance(url, str):
            raise ArgumentTypeError("url", "a database URL is a str")
        if repository is not None and not isinstance(
            repository, SessionRepository | AsyncSessionRepository
        ):
            raise ArgumentTypeError(
                "repository", "expected a SessionRepository or an AsyncSessionRepository"
            )
        if not use_outbox and (outbox_url is not None or writer_options):
            raise InvalidArgument("outbox_url", "outbox settings without use_outbox=True")
        writer_class = (
            AsyncTranscriptWriter
            if isinstance(repository, AsyncSessionRepository)
            else TranscriptWriter
        )
        unknown = sorted(set(writer_options or {}) - _WRITER_OPTIONS[writer_class])
        if unknown:
            raise InvalidArgument(
                "writer_options", f"{', '.join(unknown)}: not an option of {writer_class.__name__}"
            )
        self.session_id = session_id
        self.session_settings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        self._url = url
        self._repository: SessionRepository | None = (
            repository if isinstance(repository, SessionRepository) else None
        )
        #: A caller's async repository: awaited on its own loop (see _check_loop).
        self._async: AsyncSessionRepository | None = (
            repository if isinstance(repository, AsyncSessionRepository) else None
        )
        self._owns_repository = repository is None
        self._use_outbox = bool(use_outbox)
        self._outbox_url = outbox_url
        self._writer_options = dict(writer_options or {})
        self._session_defaults = {"source": DEFAULT_SOURCE} | dict(session_defaults or {})
        self._writer: TranscriptWriter | AsyncTranscriptWriter | None = None
        # A thread lock, not an asyncio one: the first calls may come from several loops.
        self._opening = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Keys this object took out of the live history (see add_items).
        self._taken_out: set[uuid.UUID] = set()
        self._closed = False

    def __repr__(self) -> str:
        opened = self._async or self._repository
        where = opened.display_url if opened is not None else "unopened"
        return f"SessionRepoSession({self.session_id!r}, {where})"

    # -- what it opens ------------------------------------------------------------------

    async def repository(self) -> SessionRepository | AsyncSessionRepository:
        """The repository it stores in, opened on first use: a
        :class:`~sessionrepo.SessionRepository`, or the async one it was given."""
        if self._async is not None:
            self._check_open()
            return self._async
        return await asyncio.to_thread(self._opened)

    async def writer(self) -> TranscriptWriter | AsyncTranscriptWriter | None:
        """The outbox writer (``use_outbox=True``), else ``None``: a
        :class:`~sessionrepo.TranscriptWriter`, or an
        :class:`~sessionrepo.AsyncTranscriptWriter` over an async repository."""
        if self._async is not None:
            self._check_open()
            if self._use_outbox and self._writer is None:
                self._writer = AsyncTranscriptWriter(
                    self._async, outbox_url=self._outbox_url, **self._writer_options
                )
            return self._writer
        await asyncio.to_thread(self._opened)
        return self._writer

    def _opened(self) -> SessionRepository:
        """The sync repository (and writer), opened on first use. Blocking: called in a
        worker thread."""
        with self._opening:
            if self._closed:
                raise RepoError("this SessionRepoSession is closed")
            if self._repository is None:
                self._repository = open_repository(self._url)
            if self._use_outbox and self._writer is None:
                self._writer = TranscriptWriter(
                    self._repository, outbox_url=self._outbox_url, **self._writer_options
                )
            return self._repository

    def _check_open(self) -> None:
        if self._closed:
            raise RepoError("this SessionRepoSession is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            # The caller's async repository has its connections on its own loop: on
            # another one they would fail later, and less clearly.
            raise RuntimeError(
                "this SessionRepoSession stores in an AsyncSessionRepository of another "
                "event loop; pass a SessionRepository (or url=) to use it from any loop"
            )

    async def _call(
        self,
        method: Callable[Concatenate[SessionRepository, P], T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """``repository.method(*args, **kwargs)``, awaited: in a worker thread for the
        sync repository, on the loop for an async one (whose methods are the same, only
        awaited)."""
        if self._async is not None:
            self._check_open()
            return cast("T", await getattr(self._async, method.__name__)(*args, **kwargs))
        return await asyncio.to_thread(lambda: method(self._opened(), *args, **kwargs))

    async def _write_call(
        self,
        method: Callable[Concatenate[TranscriptWriter, P], T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """``writer.method(*args, **kwargs)``, awaited as :meth:`_call` awaits."""
        writer = await self.writer()
        if isinstance(writer, AsyncTranscriptWriter):
            return cast("T", await getattr(writer, method.__name__)(*args, **kwargs))
        if writer is None:  # pragma: no cover - only called with use_outbox
            raise RepoError("this SessionRepoSession has no outbox writer")
        return await asyncio.to_thread(method, writer, *args, **kwargs)

    def close(self) -> None:
        """Close the writer it made and the repository it opened (not one passed in).

        Sync, as the SDK's ``SQLiteSession.close()``; a call still running in a worker
        thread ends first. With an async repository and ``use_outbox``, the writer is an
        asyncio one: use :meth:`aclose` (``async with`` does).
        """
        with self._opening:
            if self._closed:
                return
            if isinstance(self._writer, AsyncTranscriptWriter):
                raise RepoError(
                    "this SessionRepoSession writes through an AsyncTranscriptWriter: "
                    "close it with `await session.aclose()`"
                )
            self._closed = True
            writer, self._writer = self._writer, None
            if writer is not None:
                writer.close()
            if self._owns_repository and self._repository is not None:
                self._repository.close()

    async def aclose(self) -> None:
        """:meth:`close`, awaited: the closing waits in a worker thread, or, for an async
        writer, on the loop."""
        if isinstance(self._writer, AsyncTranscriptWriter):
            self._check_open()
            self._closed = True
            writer, self._writer = self._writer, None
            await writer.close()
            return
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> SessionRepoSession:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- the Session protocol -----------------------------------------------------------

    async def get_items(
        self, limit: int | None = None, *, wrapper: RunContextWrapper[Any] | None = None
    ) -> list[TResponseInputItem]:
        """The latest ``limit`` items (default: ``session_settings.limit``; ``None``: all)
        in chronological order; none for a limit of 0 or less, or an unknown session."""
        del wrapper
        wanted = resolve_session_limit(limit, self.session_settings)
        if wanted is not None and wanted <= 0:
            return []
        # The items decoded straight from the stored columns (each what to_item() of
        # the stored message gives), no StoredMessage built: the call a run makes
        # before each model turn.
        await self._caught_up()
        try:
            if wanted is None:
                items = await self._call(SessionRepository.load_openai, self.session_id)
            else:
                items = await self._call(
                    SessionRepository.load_openai, self.session_id, before_seq=_END, limit=wanted
                )
        except NotFound:
            return []
        return cast("list[TResponseInputItem]", items)

    async def add_items(
        self, items: list[TResponseInputItem], *, wrapper: RunContextWrapper[Any] | None = None
    ) -> None:
        """Append ``items`` in order, atomically; a retried batch stores nothing twice.
        (Items another object or process popped or cleared come back in a second step:
        see :meth:`_bring_back`.)

        Raises:
            InvalidMessage: an item cannot be stored faithfully (nothing was written).
            BackendUnavailable: the primary cannot take it (without the outbox).
        """
        if not items:
            if self._closed:
                raise RepoError("this SessionRepoSession is closed")
            return
        dicts = [self._item_dict(item, index) for index, item in enumerate(items)]
        batch = [self._keyed(item) for item in dicts]
        if self._taken_out and any(_key(sent) in self._taken_out for sent in batch):
            # This object took some of them out (a pop, a clear): they come back under
            # their next generation, chosen before writing, so that the batch lands whole
            # and in order.
            batch = self._regenerated(dicts, batch, await self._stored(), set())
        model = self._session_defaults.get("model")
        usage, reported = (
            run_usage(wrapper, _key(batch[-1]), model if isinstance(model, str) else None)
            if batch
            else ([], None)
        )
        written = await self._write(batch, usage)
        if reported is not None:
            # Counted as recorded only once written (stored or parked): a retried
            # add_items sends the same records, under the same keys.
            setattr(wrapper, USAGE_RECORDED, reported)
        if written is not None and written[1]:
            await self._bring_back(dicts, batch, written[0])

    async def pop_item(
        self, *, wrapper: RunContextWrapper[Any] | None = None
    ) -> TResponseInputItem | None:
        """Take the newest item out of the live history and return it (``None``: empty).

        Exactly one item, as the SDK's rewind expects (it pops and compares item by
        item): a retract of the newest key, not ``pop_last``, whose logical step takes a
        tool call together with its outputs. Concurrent pops (other objects, other
        processes) each take another item: one that finds its item taken out by another
        pop between reading and retracting it pops the next newest.
        """
        del wrapper
        while True:
            newest = await self._live(1)
            if not newest:
                return None
            (message,) = newest
            taken = await self._retract([message.client_msg_uuid])
            if taken is None or message.client_msg_uuid in taken:  # None: parked
                self._taken_out.add(message.client_msg_uuid)
                return cast("TResponseInputItem", message.to_item())

    async def clear_session(self, *, wrapper: RunContextWrapper[Any] | None = None) -> None:
        """Empty the live history (kept as history: nothing is deleted)."""
        del wrapper
        try:
            if self._use_outbox:
                outcome = await self._write_call(TranscriptWriter.clear_session, self.session_id)
                edit = outcome.edit
            else:
                edit = await self._call(SessionRepository.clear_session, self.session_id)
        except NotFound:
            return  # never written to: already empty
        if edit is not None:  # None: parked; _bring_back sees to what was cleared
            self._taken_out.update(edit.superseded)

    # -- helpers ------------------------------------------------------------------------

    async def _live(self, limit: int | None) -> list[StoredMessage]:
        """The newest ``limit`` live messages (``None``: all), oldest first."""
        await self._caught_up()
        try:
            if limit is None:
                return await self._call(SessionRepository.load_transcript, self.session_id)
            return await self._call(
                SessionRepository.load_transcript, self.session_id, before_seq=_END, limit=limit
            )
        except NotFound:
            return []

    async def _caught_up(self) -> None:
        """Replay this session's parked writes before its history is read.

        Raises:
            BackendUnavailable: some are still parked (the primary cannot take them).
        """
        parked = 0
        if self._use_outbox:
            parked = await self._write_call(TranscriptWriter.pending, self.session_id)
        if parked:
            await self._write_call(
                TranscriptWriter.drain, session_id=self.session_id, ignore_backoff=True
            )
            waiting = await self._write_call(TranscriptWriter.pending, self.session_id)
            if waiting:
                raise BackendUnavailable(
                    f"{waiting} writes of this session wait in the outbox: its history "
                    "is read once they are replayed"
                )

    async def _retract(self, keys: list[uuid.UUID]) -> list[uuid.UUID] | None:
        """Take ``keys`` out of the live history: the keys this call took out (not those
        out of it already), or ``None`` when the edit was parked in the outbox."""
        if self._use_outbox:
            outcome = await self._write_call(TranscriptWriter.retract, self.session_id, keys)
            return None if outcome.edit is None else outcome.edit.superseded
        edit = await self._call(SessionRepository.retract, self.session_id, keys)
        return edit.superseded

    def _item_dict(self, item: object, index: int) -> dict[str, Any]:
        if not isinstance(item, Mapping):
            raise InvalidMessage(f"items[{index}]", f"an item is a dict, not {type(item).__name__}")
        return dict(item)

    def _keyed(self, item: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``item`` with its key (the caller's dict is never stamped)."""
        if KEY_FIELD in item:
            return dict(item)
        item_id = _item_id(item)
        key = item_key(self.session_id, item_id) if item_id else new_key()
        return {**item, KEY_FIELD: str(key)}

    async def _write(
        self, batch: list[dict[str, Any]], usage: list[Usage] | None = None
    ) -> tuple[list[uuid.UUID], list[uuid.UUID]] | None:
        """Append or write ``batch`` (with the run's ``usage``): the keys inserted and
        those skipped (already stored), or ``None`` when it was parked."""
        if not batch:
            return [], []
        if self._use_outbox:
            outcome = await self._write_call(
                TranscriptWriter.write,
                self.session_id,
                batch,
                usage=usage or None,
                **self._session_defaults,
            )
            if outcome.status == "parked":
                return None
            return outcome.inserted, [*outcome.duplicates, *outcome.conflicts]
        repository = await self.repository()
        prepared = repository.prepare(
            self.session_id, batch, usage=usage or None, **self._session_defaults
        )
        result = await self._call(SessionRepository.append_prepared, prepared)
        return result.inserted, [*result.duplicates, *result.conflicts]

    async def _stored(self) -> dict[uuid.UUID, StoredMessage]:
        """Every message the session holds, live or not, by key."""
        try:
            history = await self._call(
                SessionRepository.load_transcript, self.session_id, include_retracted=True
            )
        except NotFound:
            return {}
        return {message.client_msg_uuid: message for message in history}

    def _regenerated(
        self,
        items: list[dict[str, Any]],
        batch: list[dict[str, Any]],
        stored: Mapping[uuid.UUID, StoredMessage],
        moved: set[uuid.UUID],
    ) -> list[dict[str, Any]]:
        """``batch`` again, each item with an id under its first generation's key that is
        either free or live with this very item (then it is left out: a retry), and each
        item without one that is ``moved`` under a fresh key."""
        out: list[dict[str, Any]] = []
        for sent, item in zip(batch, items, strict=True):
            item_id = _item_id(item)
            if KEY_FIELD in item or item_id is None:
                out.append({**item, KEY_FIELD: str(new_key())} if _key(sent) in moved else sent)
                continue
            generation = 0
            while True:
                key = item_key(self.session_id, item_id, generation)
                message = stored.get(key)
                if message is None:
                    out.append({**item, KEY_FIELD: str(key)})
                    break
                if key not in moved and _live_as(message, item):
                    break
                generation += 1
        return out

    async def _bring_back(
        self,
        items: list[dict[str, Any]],
        batch: list[dict[str, Any]],
        inserted: list[uuid.UUID],
    ) -> None:
        """Some keys of this batch were stored already. Where each is live with the same
        item, this was a retry and nothing is left to do. Where one was taken out (popped
        or cleared, by another object or process) or holds another item, the item comes
        back under its next free generation, and what this call inserted is taken out and
        sent again behind it, so that the batch keeps its order."""
        fresh = set(inserted)
        ours = [
            (sent, item)
            for sent, item in zip(batch, items, strict=True)
            if KEY_FIELD not in item and _key(sent) not in fresh
        ]
        if not ours:
            return  # only keys the caller chose were skipped: theirs to resend
        stored = await self._stored()
        if all(_live_as(stored.get(_key(sent)), item) for sent, item in ours):
            return
        # A caller's own key stays where it is: once taken out, it could not come back.
        moved = {
            _key(sent)
            for sent, item in zip(batch, items, strict=True)
            if _key(sent) in fresh and KEY_FIELD not in item
        }
        again = self._regenerated(items, batch, stored, moved)
        if moved:
            await self._retract([_key(sent) for sent in batch if _key(sent) in moved])
            self._taken_out.update(moved)
        await self._write(again)


#: The attribute of a run's context wrapper that says how many of the run's model
#: requests (``wrapper.usage.request_usage_entries``) this adapter has recorded.
USAGE_RECORDED: Final = "sessionrepo_usage_recorded"


def run_usage(
    wrapper: Any, last_key: uuid.UUID, model: str | None = None
) -> tuple[list[Usage], int | None]:
    """The usage of the run's model requests not recorded yet, as the SDK reports them
    in the run context (``wrapper.usage.request_usage_entries``), each keyed by the
    batch's last item and the request's place in the run (a retry sends the same keys),
    and how many the run has reported (``None``: no run context, or nothing new)."""
    entries = getattr(getattr(wrapper, "usage", None), "request_usage_entries", None)
    if not entries:
        return [], None
    done = getattr(wrapper, USAGE_RECORDED, 0)
    if not isinstance(done, int) or done >= len(entries):
        return [], None
    records = []
    for index in range(done, len(entries)):
        entry = entries[index]
        details_in = entry.input_tokens_details
        details_out = entry.output_tokens_details
        record = reported_usage(
            f"OpenAI Agents request {index} of the run",
            usage_id=uuid.uuid5(last_key, f"openai-agents-request:{index}"),
            message_uuid=last_key,
            model=model,
            input_tokens=entry.input_tokens or 0,
            output_tokens=entry.output_tokens or 0,
            cache_read_tokens=getattr(details_in, "cached_tokens", 0) or 0,
            cache_write_tokens=getattr(details_in, "cache_write_tokens", 0) or 0,
            reasoning_tokens=getattr(details_out, "reasoning_tokens", 0) or 0,
        )
        if record is not None:
            records.append(record)
    return records, len(entries)


def _key(message: Mapping[str, Any]) -> uuid.UUID:
    return uuid.UUID(str(message[KEY_FIELD]))


def _live_as(message: StoredMessage | None, item: Mapping[str, Any]) -> bool:
    """Whether ``message`` is in the live history as ``item``."""
    return message is not None and message.superseded is None and message.to_item() == item


if TYPE_CHECKING:

    def _is_a_session(session: SessionRepoSession) -> Session:
        return session  # mypy checks the class against the SDK's Session protocol here
