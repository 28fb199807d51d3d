"""``TranscriptWriter``: the write path a gateway calls. Nothing acknowledged is lost.

``write`` stores a batch in the primary, or, when the primary cannot take it for an
operational reason (down, locked, full, read-only, frozen past the deadline), parks it in
the pending outbox and returns normally, saying so. ``drain`` replays parked batches in
their original order, per session, exactly once in effect: a row leaves the outbox only
after the primary has committed it, and the message key makes any repeat a no-op.

The writer is the façade over its parts, each in a module of its own:
:mod:`.attempt` (one attempt at the primary, else park: for writes and edits alike),
:mod:`.deadline` (the deadline and what carries the calls), :mod:`.outage` (the primary
known down, its probe, and the log lines: see that module for the loggers),
:mod:`.drain` (the replay and the background loop) and :mod:`.table` (the outbox's rows).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqlalchemy.engine import URL

import sessionrepo.observability as _observe
from sessionrepo.contract import ResilientWriter
from sessionrepo.errors import (
    ArgumentTypeError,
    InvalidArgument,
    QueuedBehindOutbox,
    RepoError,
)
from sessionrepo.models import Message
from sessionrepo.models.outbox import DrainReport, OutboxStatus, WriteResult
from sessionrepo.outbox.attempt import Attempt, WritePath
from sessionrepo.outbox.deadline import Calls
from sessionrepo.outbox.drain import Drainer
from sessionrepo.outbox.edits import apply_edit, edit_message
from sessionrepo.outbox.opening import open_outbox_database
from sessionrepo.outbox.outage import LOGGERS, Outage
from sessionrepo.outbox.table import Outbox, drainer_id
from sessionrepo.store import bridge as _aio
from sessionrepo.store.arguments import (
    check_bool,
    check_instance,
    check_int,
    check_optional_session_id,
    check_seconds,
)
from sessionrepo.store.database import Database
from sessionrepo.store.editing import check_keys
from sessionrepo.store.repository import PreparedBatch, SessionRepository

# The result models live in sessionrepo.models.outbox (the contract names them); they
# stay importable from here, as do the loggers' list (sessionrepo.outbox.outage) and
# the outbox's opening (sessionrepo.outbox.opening).
__all__ = [
    "LOGGERS",
    "DrainReport",
    "OutboxStatus",
    "TranscriptWriter",
    "WriteResult",
    "open_outbox_database",
]


class TranscriptWriter(ResilientWriter):
    """The resilient write path: primary store first, the pending outbox when it fails.

    Implements :class:`sessionrepo.contract.ResilientWriter`, whose docstrings state the
    guarantees.

    Args:
        repository: the primary store.
        outbox_url: where the outbox lives: a URL, else ``SESSIONREPO_OUTBOX_URL``, else
            the primary database itself (with its own small pool). Put it in a local
            SQLite file (``sqlite:////var/lib/gateway/outbox.db``) to survive the
            primary being unreachable.
        deadline: seconds ``write`` may take. A primary that has not answered by then
            (down, frozen, a held lock) gets the batch parked instead. The abandoned
            attempt may still commit later; the key makes the replay a no-op.
        max_attempts: failed replays of a message the primary *rejects* (not
            unavailable) before it is set aside as dead.
        batch_size: parked messages replayed per primary transaction.
        lease: seconds a drainer's claim on a session's rows lasts unless renewed. The
            live drainer renews it every second (every third of it, if shorter) while
            it replays, and releases it when the replay ends; so a drainer that dies
            holding a claim stalls its sessions for at most this long.
        workers: threads that carry primary writes (a write past its deadline keeps
            one busy until the database answers).
        backoff_base: seconds of the first retry's backoff after a failed replay
            (doubled each attempt, with jitter).
        backoff_cap: the longest backoff, in seconds.
        probe_interval: while the primary is known to be down (a write failed for an
            operational reason, or missed the deadline), writes park at once, without
            trying it; every ``probe_interval`` seconds one probe in the background
            asks it, and the first answer (or a replay that goes through) lets writes
            try it again.
        task_pool: for a repository on an asyncio driver only: the task pool that
            carries the writer's primary and outbox calls (``AsyncTranscriptWriter``
            passes its own, so that its ``close`` waits for them all); a new one if
            ``None``.

    Raises:
        InvalidArgument: an argument is out of range (``ArgumentTypeError``: of the
            wrong type), or ``outbox_url`` names a place that cannot hold an outbox (a
            directory, a read-only filesystem, a folder the user may not write: the
            message names the file, the cause and the fix); nothing was opened.
        NotARepository: the outbox file is another application's, or a symbolic link.
        BackendUnavailable: the outbox cannot be opened now, for a reason that may pass.
    """

    def __init__(
        self,
        repository: SessionRepository,
        *,
        outbox_url: str | URL | None = None,
        deadline: float = 5.0,
        max_attempts: int = 5,
        batch_size: int = 500,
        lease: float = 5.0,
        workers: int = 4,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
        probe_interval: float = 1.0,
        task_pool: _aio.TaskPool | None = None,
    ) -> None:
        check_instance(repository, "repository", SessionRepository)
        if repository.database.read_only:
            # Its writes could only fail, and parking them would hide that they never can.
            raise InvalidArgument(
                "repository", "opened read_only: a TranscriptWriter needs a writable repository"
            )
        deadline = check_seconds(deadline, "deadline")
        max_attempts = check_int(max_attempts, "max_attempts", minimum=1)
        batch_size = check_int(batch_size, "batch_size", minimum=1)
        lease = check_seconds(lease, "lease")
        workers = check_int(workers, "workers", minimum=1, maximum=1024)
        backoff_base = check_seconds(backoff_base, "backoff_base", allow_zero=True)
        backoff_cap = check_seconds(backoff_cap, "backoff_cap", allow_zero=True)
        probe_interval = check_seconds(probe_interval, "probe_interval")
        if outbox_url is not None and not isinstance(outbox_url, str | URL):
            raise ArgumentTypeError(
                "outbox_url", f"must be a string or a URL, got {type(outbox_url).__name__}"
            )
        # On an asynchronous repository (``AsyncTranscriptWriter``), this same logic runs
        # for coroutines: the outbox on its asyncio driver, primary calls as tasks.
        asynchronous = repository.database.asynchronous
        if task_pool is not None:
            check_instance(task_pool, "task_pool", _aio.TaskPool)
            if not asynchronous:
                raise ArgumentTypeError(
                    "task_pool", "only a repository on an asyncio driver runs calls as tasks"
                )
        self._repository = repository
        url = outbox_url or os.environ.get("SESSIONREPO_OUTBOX_URL") or None
        # A repository opened for a tenant binds its outbox to it; one opened without
        # (a store of one gateway, or a role's URL alone) leaves the file unbound.
        tenant = repository.database.tenant
        if url is None:
            # Its own pool: writes stuck on the primary's pool must not block parking.
            # As the same tenant: on PostgreSQL, parked rows are the tenant's rows.
            same_role: dict[str, Any] = {}
            if repository.database.tenant is not None:
                same_role["tenant"] = repository.database.tenant
            outbox_db = Database(
                repository.database.url,
                pool_size=2,
                max_overflow=4,
                asynchronous=asynchronous,
                **same_role,
            )
        else:
            # The file is one tenant's (as a SQLite store is): rows parked for one tenant
            # are never drained into another's.
            outbox_db = open_outbox_database(url, asynchronous=asynchronous, tenant=tenant)
        self._outbox = Outbox(outbox_db)
        #: Parked messages live in the primary itself: the append checks for them in
        #: its own statement (no question of its own to the outbox).
        self._outbox_on_primary = url is None
        self._closed = False
        self._closing = threading.Event()
        self._owner = drainer_id()
        #: Fault injection for crash tests: called with the name of each step.
        self.fault_hook: Callable[[str], None] | None = None
        self._calls = Calls(
            deadline,
            repository.bounded_database,
            asynchronous=asynchronous,
            workers=workers,
            task_pool=task_pool,
        )
        # In a write transaction: on SQLite, reading answers while another connection
        # holds the write lock, and writes would find it down again.
        writes = self._calls.writes
        self._outage = Outage(
            lambda: writes.write(lambda conn: conn.exec_driver_sql("SELECT 1")),
            interval=probe_interval,
            calls=self._calls,
            closing=self._closing,
        )
        self._drainer = Drainer(
            repository,
            self._outbox,
            self._calls,
            self._outage,
            owner=self._owner,
            max_attempts=max_attempts,
            batch_size=batch_size,
            lease=lease,
            backoff=(backoff_base, backoff_cap),
            checkpoint=self._checkpoint,
            drain=self.drain,
        )
        self._path = WritePath(
            self._outbox,
            self._calls,
            self._outage,
            checkpoint=self._checkpoint,
            parked=self._parked,
            drain_session=lambda sid: self.drain(session_id=sid, ignore_backoff=True),
        )
        #: Wakes the drainer (a batch was parked, dead rows were put back in line).
        self.notify_drainer: Callable[[], None] = self._drainer.wake

    @property
    def outbox(self) -> Outbox:
        return self._outbox

    @property
    def deadline(self) -> float:
        """Seconds ``write`` may take (see the constructor)."""
        return self._calls.deadline

    @property
    def max_attempts(self) -> int:
        return self._drainer.max_attempts

    @property
    def batch_size(self) -> int:
        return self._drainer.batch_size

    @property
    def lease(self) -> float:
        return self._drainer.lease

    @property
    def primary_down(self) -> str | None:
        """Why writes park at once (the primary is known to be down), or ``None`` while
        they go to it."""
        down = self._outage.down()
        return None if down is None else down[0]

    # -- write ----------------------------------------------------------------------

    # ``self`` positional-only: sessionrepo.aio derives the awaited signature from this one.
    @_observe.instrument_write
    def write(
        self,
        /,
        session_id: str,
        messages: Iterable[Message | Mapping[str, Any]],
        *,
        usage: Any = None,
        **session_defaults: Any,
    ) -> WriteResult:
        self._refuse_if_closed()
        started = self._drainer.last_write = time.monotonic()
        batch = self._repository.prepare(session_id, messages, usage=usage, **session_defaults)
        if not batch.keys:  # not .messages: that would validate what the memory took as known
            return WriteResult(session_id=batch.session_id, status="stored")
        return self._path.send(batch, self._appending(batch), started=started, on_writes_pool=True)

    def _appending(self, batch: PreparedBatch) -> Attempt:
        """The attempt of a write: the batch into the primary, on the writes' pool."""
        on_primary = self._outbox_on_primary

        def attempt() -> WriteResult | None:
            # An outbox on the primary: the append's own statement asks.
            if not on_primary and self._outbox.has_pending(batch.session_id):
                return None
            self._checkpoint("before_primary")
            try:
                stored = self._repository.append_prepared(
                    batch, timeout=self._calls.budget, behind_outbox=on_primary
                )
            except QueuedBehindOutbox:
                return None
            return WriteResult(
                session_id=batch.session_id,
                status="stored",
                inserted=stored.inserted,
                duplicates=stored.duplicates,
                conflicts=stored.conflicts,
            )

        return attempt

    # -- edits through the outbox (see sessionrepo.outbox.edits) ----------------------

    def rewind(self, /, session_id: str, to_seq: int) -> WriteResult:
        """:meth:`SessionRepository.rewind` on the write path: applied now when the
        session has nothing parked and the primary answers, else parked in the session's
        FIFO (replayed after what was parked before it, before what is parked after)."""
        return self._edit(session_id, "rewind", {"to_seq": check_int(to_seq, "to_seq")})

    def retract(self, /, session_id: str, keys: Iterable[Any]) -> WriteResult:
        """:meth:`SessionRepository.retract` on the write path (as :meth:`rewind`)."""
        return self._edit(session_id, "retract", {"keys": [str(key) for key in check_keys(keys)]})

    def clear_session(self, /, session_id: str) -> WriteResult:
        """:meth:`SessionRepository.clear_session` on the write path (as :meth:`rewind`)."""
        return self._edit(session_id, "clear_session", {})

    def compact(
        self, /, session_id: str, through_seq: int, summary_message: Message | Mapping[str, Any]
    ) -> WriteResult:
        """:meth:`SessionRepository.compact` on the write path (as :meth:`rewind`)."""
        summary = self._repository.prepare(session_id, [summary_message]).messages[0]
        return self._edit(
            session_id,
            "compact",
            {
                "through_seq": check_int(through_seq, "through_seq", minimum=1),
                "summary": summary.model_dump(mode="json"),
            },
        )

    def _edit(self, session_id: str, operation: str, arguments: dict[str, Any]) -> WriteResult:
        self._refuse_if_closed()
        started = time.monotonic()
        edit = edit_message(operation, arguments)
        batch = self._repository.prepare(session_id, [edit])

        def attempt() -> WriteResult | None:
            # An edit is no append: it asks the outbox itself, wherever that lives.
            if self._outbox.has_pending(batch.session_id):
                return None
            self._checkpoint("before_primary")
            done = apply_edit(self._repository, batch.session_id, edit)
            return WriteResult(session_id=batch.session_id, status="stored", edit=done)

        # Not on the writes' pool (the repository's edit runs on its own): the watchdog
        # cannot cut it, so it runs on a pool thread, abandoned at the deadline.
        return self._path.send(batch, attempt, started=started, on_writes_pool=False)

    def _parked(self) -> None:
        # ``notify_drainer`` as it is now: sessionrepo.aio replaces it after construction.
        self.notify_drainer()

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise RepoError("this TranscriptWriter is closed")

    def _checkpoint(self, step: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(step)

    # -- drain ----------------------------------------------------------------------

    def pending(self, session_id: str | None = None) -> int:
        return self._outbox.count(check_optional_session_id(session_id))

    def status(self) -> OutboxStatus:
        return self._outbox.status()

    def retry_dead(self, session_id: str | None = None) -> int:
        count = self._outbox.retry_dead(check_optional_session_id(session_id))
        self.notify_drainer()
        return count

    @_observe.instrument_drain
    def drain(self, *, session_id: str | None = None, ignore_backoff: bool = False) -> DrainReport:
        check_optional_session_id(session_id)
        check_bool(ignore_backoff, "ignore_backoff")
        return self._drainer.drain(session_id, ignore_backoff)

    def start(self, *, interval: float = 1.0) -> None:
        self._drainer.start(check_seconds(interval, "interval"))

    def drain_round(self, interval: float) -> float:
        """One round of the background drainer; returns the seconds to wait before the
        next (at most ``interval``; sooner when a retry falls due)."""
        return self._drainer.round(interval)

    def stop(self, timeout: float | None = 30.0) -> None:
        if timeout is not None:
            timeout = check_seconds(timeout, "timeout", allow_zero=True)
        self._drainer.stop(timeout)

    def close(self) -> None:
        self._closed = True
        self._closing.set()
        self.stop()
        self._outage.join(self.deadline)
        self._calls.shutdown()
        self._outbox.close()

    def __enter__(self) -> TranscriptWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = "its own" if self._outbox_on_primary else self._outbox.display_url
        return f"TranscriptWriter({self._repository.display_url}, outbox {where})"
