"""``TranscriptWriter``: the write path a gateway calls. Nothing acknowledged is lost.

``write`` stores a batch in the primary, or, when the primary cannot take it for an
operational reason (down, locked, full, read-only, frozen past the deadline), parks it in
the pending outbox and returns normally, saying so. ``drain`` replays parked batches in
their original order, per session, exactly once in effect: a row leaves the outbox only
after the primary has committed it, and the message key makes any repeat a no-op.

Logging (the standard :mod:`logging`; no handler is installed): an outage reads as a few
lines, one per change of state, never one per write or per retry. Repeats of a failure
are counted and summarised in one line at doubling intervals (5 s, 10 s, ... up to 5
minutes); tracebacks are logged at DEBUG only. The loggers (:data:`LOGGERS`):

``sessionrepo.writer``
    The primary and the outbox as a gateway sees them. WARNING ``primary unavailable:
    <reason>; writes park in the outbox until it answers`` (then, should it fail again
    after a probe's answer, ``primary still unavailable (N times in 40s): <reason>`` at
    doubling intervals); INFO ``writes park in the outbox (first: session 's':
    <reason>)``, then ``still parking: N batches in 40s (last: ...)``; INFO ``primary
    answers again after 12.3s: writes go to it`` once a write or a replay has gone
    through (a probe's answer alone lets writes try it, at DEBUG); INFO ``outbox drained:
    N parked messages replayed, none left`` once the outbox is empty. Each parked batch:
    DEBUG. ERROR for parked messages whose key the primary holds with other content.
``sessionrepo.writer.drainer``
    Replays and drain rounds that fail: WARNING ``replay of parked messages failed:
    <error>; retrying with backoff``, then ``... still failing (N times in 40s)``, INFO
    ``... works again``. ERROR for a replay that fails for a reason that is not the
    primary's availability (a bug, or content: it needs a person).
``sessionrepo.writer.index``
    The drainer's search index catch-up, the same way: ``search index catch-up failed:
    <error>; retrying with backoff``. While it fails it is tried again after a backoff
    that doubles from the drainer's interval up to ``backoff_cap``; while the primary is
    known down, not at all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from datetime import timedelta
from typing import Any, Final, Protocol, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import URL

import sessionrepo.observability as _observe
from sessionrepo.contract import ResilientWriter
from sessionrepo.dialects import database_file, normalize_url
from sessionrepo.errors import (
    ArgumentTypeError,
    BackendUnavailable,
    ConflictError,
    InvalidArgument,
    InvalidMessage,
    NotARepository,
    NotFound,
    QueuedBehindOutbox,
    RepoError,
    WriteRejected,
)
from sessionrepo.models import AppendResult, Message
from sessionrepo.models.message import utcnow
from sessionrepo.models.outbox import DrainReport, OutboxStatus, WriteResult
from sessionrepo.models.session import DERIVED_FIELDS
from sessionrepo.outbox.edits import apply_edit, edit_message, is_edit
from sessionrepo.outbox.table import ClaimedBatch, Outbox, drainer_id
from sessionrepo.store import bridge as _aio
from sessionrepo.store import schema
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
# stay importable from here.
__all__ = [
    "DrainReport",
    "OutboxStatus",
    "TranscriptWriter",
    "WriteResult",
    "open_outbox_database",
]

log = logging.getLogger("sessionrepo.writer")
drainer_log = logging.getLogger("sessionrepo.writer.drainer")
index_log = logging.getLogger("sessionrepo.writer.index")

#: Every logger sessionrepo writes to, with what it reports (see the module docstring
#: for the lines of the writer's three).
LOGGERS: Final = {
    "sessionrepo.writer": "the primary lost and back, writes parking, the outbox drained",
    "sessionrepo.writer.drainer": "failed replays and drain rounds, rate-limited",
    "sessionrepo.writer.index": "the drainer's search index catch-up failing, rate-limited",
    "sessionrepo": "the asyncio API: calls still running at close",
    "sessionrepo.web": "the web console: a request that failed (with its traceback)",
}

T = TypeVar("T")


def open_outbox_database(
    url: str | URL, *, asynchronous: bool = False, read_only: bool = False
) -> Database:
    """A separate outbox store. A SQLite file is created private (mode 0600) where there
    is none, kept durable (WAL, ``synchronous=FULL``) and migrated by the same Alembic
    environment (``asynchronous``: on its asyncio driver, checked and migrated on first
    use). With ``read_only`` (``sessionrepo outbox status``), it is neither created nor
    migrated, and opened read-only.

    A symbolic link at the file's path is refused, dangling or not: the outbox would be
    made, or read, wherever the link points. So is a file that is not a sessionrepo
    store (another application's database gets none of sessionrepo's tables).

    Raises:
        NotARepository: the path is a symbolic link, or names a file that is not a
            sessionrepo store (``read_only``: or no file).
        BackendUnavailable: the file, or its folder, cannot be created.
    """
    if not isinstance(url, str | URL):
        raise ArgumentTypeError(
            "outbox_url", f"must be a string or a URL, got {type(url).__name__}"
        )
    parsed = normalize_url(url)
    options: dict[str, Any] = {}
    path = database_file(parsed)
    if path is not None:
        options["sqlite_synchronous"] = "FULL"
        if path.is_symlink():
            raise NotARepository(
                f"the outbox path {path} is a symbolic link; give the file's own path "
                "(an outbox is never made or read through a link)",
                path=str(path),
            )
    # The SQLite dialect creates a missing file 0600 (O_EXCL: never through a link made
    # since the check above) and refuses another application's file before any write.
    database = Database(parsed, asynchronous=asynchronous, read_only=read_only, **options)
    # Asynchronous: no I/O outside the event loop's calls, so on first use.
    schema.check_schema(database, auto_migrate=False if read_only else None, defer=asynchronous)
    return database


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
            wrong type); nothing was opened.
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
        if url is None:
            # Its own pool: writes stuck on the primary's pool must not block parking.
            outbox_db = Database(
                repository.database.url, pool_size=2, max_overflow=4, asynchronous=asynchronous
            )
        else:
            outbox_db = open_outbox_database(url, asynchronous=asynchronous)
        self._outbox = Outbox(outbox_db)
        #: Parked messages live in the primary itself: the append checks for them in
        #: its own statement (no question of its own to the outbox).
        self._outbox_on_primary = url is None
        self.deadline = deadline
        self.max_attempts = max_attempts
        self.batch_size = batch_size
        self.lease = lease
        self._backoff = (backoff_base, backoff_cap)
        # Of the deadline, this much is kept for parking after the primary gave up.
        self._park_reserve = min(1.0, deadline / 4)
        # Writes go through a pool of their own whose connections the server holds to
        # the primary's share of the deadline (statement and lock timeouts, SQLite's
        # busy timeout): the call runs on the caller's thread, and only a server that
        # does not answer at all needs the watchdog (or, on an asyncio driver, a task).
        self._budget = deadline - self._park_reserve
        bounded = repository.bounded_database(self._budget)
        self._watchdog = None if asynchronous else _Watchdog(bounded)
        if self._watchdog is not None:
            bounded.may_rerun = self._watchdog.not_severed
        self._breaker = _Breaker(probe_interval)
        # From the first failure to the first write or replay that goes through again: a
        # probe's answer lets writes try, but only stored data ends the outage (else a
        # primary that answers probes and refuses writes would log both, each second).
        self._outage = _Episode(
            log,
            logging.WARNING,
            start="primary unavailable: {detail}; writes park in the outbox until it answers",
            repeat="primary still unavailable ({count} times in {seconds:.0f}s): {detail}",
            end="primary answers again after {seconds:.1f}s: writes go to it",
        )
        self._parking = _Episode(
            log,
            logging.INFO,
            start="writes park in the outbox (first: session {detail})",
            repeat="still parking: {count} batches in {seconds:.0f}s (last: session {detail})",
        )
        self._replayed = 0  # since the outbox was last found empty
        self._replayed_lock = threading.Lock()
        self._replay_failures = _Episode(
            drainer_log,
            logging.WARNING,
            start="replay of parked messages failed: {detail}; retrying with backoff",
            repeat="replay of parked messages still failing ({count} times in {seconds:.0f}s): "
            "{detail}",
            end="replay of parked messages works again (failures: {count}, over {seconds:.1f}s)",
        )
        self._drain_failures = _Episode(
            drainer_log,
            logging.WARNING,
            start="outbox drain failed: {detail}; retrying every round",
            repeat="outbox drain still failing ({count} times in {seconds:.0f}s): {detail}",
            end="outbox drain works again (failures: {count}, over {seconds:.1f}s)",
        )
        self._index_failures = _Episode(
            index_log,
            logging.WARNING,
            start="search index catch-up failed: {detail}; retrying with backoff",
            repeat="search index catch-up still failing ({count} times in {seconds:.0f}s): "
            "{detail}",
            end="search index catch-up works again (failures: {count}, over {seconds:.1f}s)",
        )
        self._index_retry_at = 0.0
        self._primary_pool: _Pool
        self._outbox_pool: _Pool
        if asynchronous:
            # Tasks: a task waiting on the primary never keeps one from parking.
            self._primary_pool = self._outbox_pool = task_pool or _aio.TaskPool()
        else:
            # Daemon threads: a write abandoned on a frozen server must not keep the
            # process from exiting (the key makes the abandoned attempt harmless).
            self._primary_pool = _DaemonPool(workers, "sessionrepo-primary")
            self._outbox_pool = _DaemonPool(2, "sessionrepo-outbox")
        self._closed = False
        self._closing = threading.Event()
        self._prober: threading.Thread | None = None
        self._asynchronous = asynchronous
        self._last_write = 0.0
        self._owner = drainer_id()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._drainer: threading.Thread | None = None
        #: Wakes the drainer (a batch was parked, dead rows were put back in line).
        self.notify_drainer: Callable[[], None] = self._wake.set
        #: Fault injection for crash tests: called with the name of each step.
        self.fault_hook: Callable[[str], None] | None = None

    @property
    def outbox(self) -> Outbox:
        return self._outbox

    # -- write ----------------------------------------------------------------------

    # ``self`` positional-only: sessionrepo.aio derives the awaited signature from this one.
    @_observe.instrument_write
    def write(
        self,
        /,
        session_id: str,
        messages: Iterable[Message | Mapping[str, Any]],
        **session_defaults: Any,
    ) -> WriteResult:
        if self._closed:
            raise RepoError("this TranscriptWriter is closed")
        started = self._last_write = time.monotonic()
        batch = self._repository.prepare(session_id, messages, **session_defaults)
        if not batch.messages:
            return WriteResult(session_id=batch.session_id, status="stored")
        down = self._breaker.down()
        if down is not None:
            # Known to be down: park at once; a probe in the background finds it back.
            self._checkpoint("after_primary_failure")
            return self._park(batch, down[0], down[1], timeout=self.deadline)
        try:
            result = self._attempt(batch)
        except TimeoutError:
            reason = f"the primary did not answer within {self._budget:g}s"
            code: str | None = "deadline"
            self._lost(reason, code)
        except BackendUnavailable as exc:
            reason, code = str(exc), exc.code
            self._lost(reason, code)
        else:
            if result is not None:
                self._outage.end()
                self._checkpoint("after_primary_commit")
                return result
            reason, code = _QUEUED, None
        self._checkpoint("after_primary_failure")
        remaining = max(self._park_reserve, self.deadline - (time.monotonic() - started))
        try:
            return self._park(batch, reason, code, timeout=remaining)
        except BackendUnavailable as exc:
            if reason is not _QUEUED or not _disk_full(exc.__cause__):
                raise
            # Queued behind parked messages, with the primary answering, and the outbox
            # cannot take the batch for lack of space: replay what the session has parked
            # (that frees space and needs none), then the batch goes to the primary.
            self.drain(session_id=batch.session_id, ignore_backoff=True)
            result = self._attempt(batch)
            if result is None:
                raise
            self._checkpoint("after_primary_commit")
            return result

    def _attempt(self, batch: PreparedBatch) -> WriteResult | None:
        """The batch into the primary, or ``None`` when it must queue behind the
        session's parked messages; ``TimeoutError`` past the primary's budget."""

        def attempt() -> WriteResult | None:
            if not self._outbox_on_primary and self._outbox.has_pending(batch.session_id):
                return None
            self._checkpoint("before_primary")
            try:
                stored = self._repository.append_prepared(
                    batch, timeout=self._budget, behind_outbox=self._outbox_on_primary
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

        watchdog = self._watchdog
        if watchdog is None or not watchdog.connection_ready():
            # A new connection to a server that may not answer: on a pool thread (or a
            # task), abandoned at the deadline.
            return self._primary_pool.run(attempt, timeout=self._budget)
        with watchdog.guard(self._budget) as guard:
            try:
                return attempt()
            except BackendUnavailable as exc:
                if guard.severed:
                    raise TimeoutError from exc
                raise

    def _lost(self, reason: str, code: str | None) -> None:
        if not self._breaker.trip(reason, code):
            return
        self._outage.event(reason)
        interval = self._breaker.interval

        def ask() -> None:
            # In a write transaction: on SQLite, reading answers while another
            # connection holds the write lock, and writes would find it down again.
            self._repository.bounded_database(self._budget).write(
                lambda conn: conn.exec_driver_sql("SELECT 1")
            )

        def probe() -> None:
            # One question per interval until it answers (or a replay goes through),
            # each held to the deadline like a write (a frozen server never answers).
            while self._breaker.down() is not None and not self._closed:
                if self._asynchronous:
                    _aio.sleep(interval)
                elif self._closing.wait(interval):
                    return  # closed: nobody waits for the answer
                try:
                    if self._watchdog is None:
                        ask()
                    else:
                        with self._watchdog.guard(self._budget):
                            ask()
                except Exception:
                    log.debug("the primary does not answer yet", exc_info=True)
                    continue
                self._back()

        if self._asynchronous:
            self._primary_pool.submit(probe)
        else:  # a thread of its own: the pool's threads are for the writes and replays
            self._prober = threading.Thread(target=probe, name="sessionrepo-probe", daemon=True)
            self._prober.start()

    @property
    def primary_down(self) -> str | None:
        """Why writes park at once (the primary is known to be down), or ``None`` while
        they go to it."""
        down = self._breaker.down()
        return None if down is None else down[0]

    def _back(self) -> None:
        if self._breaker.close():
            log.debug("the primary answers: writes try it again")

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
        if self._closed:
            raise RepoError("this TranscriptWriter is closed")
        started = time.monotonic()
        edit = edit_message(operation, arguments)
        batch = self._repository.prepare(session_id, [edit])
        primary_budget = self.deadline - self._park_reserve

        def attempt() -> WriteResult | None:
            if self._outbox.has_pending(batch.session_id):
                return None
            self._checkpoint("before_primary")
            done = apply_edit(self._repository, batch.session_id, edit)
            return WriteResult(session_id=batch.session_id, status="stored", edit=done)

        try:
            result = self._primary_pool.run(attempt, timeout=primary_budget)
        except TimeoutError:
            reason = f"the primary did not answer within {primary_budget:g}s"
            code: str | None = "deadline"
        except BackendUnavailable as exc:
            reason, code = str(exc), exc.code
        else:
            if result is not None:
                self._outage.end()
                self._checkpoint("after_primary_commit")
                return result
            reason, code = _QUEUED, None
        self._checkpoint("after_primary_failure")
        remaining = max(self._park_reserve, self.deadline - (time.monotonic() - started))
        return self._park(batch, reason, code, timeout=remaining)

    def _park(
        self, batch: PreparedBatch, reason: str, code: str | None, *, timeout: float
    ) -> WriteResult:
        def park() -> int:
            return self._outbox.park(
                batch.session_id, batch.messages, batch.session, reason=reason, error_code=code
            )

        try:
            self._outbox_pool.run(park, timeout=timeout)
        except (TimeoutError, RepoError) as exc:
            detail = "it did not answer in time" if isinstance(exc, TimeoutError) else str(exc)
            raise BackendUnavailable(
                f"session {batch.session_id!r}: the primary could not take the batch "
                f"({reason}) and neither could the outbox ({detail}); nothing was "
                "acknowledged: keep the messages and send them again",
                code=code,
            ) from exc
        self._checkpoint("after_park")
        log.debug(
            "session %r: parked %d messages: %s", batch.session_id, len(batch.messages), reason
        )
        self._parking.event(f"{batch.session_id!r}: {reason}")
        self.notify_drainer()
        return WriteResult(
            session_id=batch.session_id,
            status="parked",
            parked=len(batch.messages),
            reason=reason,
        )

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
        totals = {"replayed": 0, "duplicates": 0, "conflicts": 0, "failed": 0, "dead": 0}
        if not self._outbox.any_pending(session_id):
            # Nothing parked (no write lock taken): drained, by us or by another writer.
            self._drained(0, 0 if session_id is None else None)
            return DrainReport(**totals, remaining=0)
        done: set[str] = set()
        holding: set[str] = set()
        with self._renewing(holding):
            while self._drain_one(totals, done, holding, session_id, ignore_backoff):
                pass
        remaining = self._outbox.count()
        # What left the outbox: a duplicate is a replay an abandoned attempt had made.
        self._drained(totals["replayed"] + totals["duplicates"] + totals["conflicts"], remaining)
        return DrainReport(**totals, remaining=remaining)

    def _drain_one(
        self,
        totals: dict[str, int],
        done: set[str],
        holding: set[str],
        session_id: str | None,
        ignore_backoff: bool,
    ) -> bool:
        """Claim and replay one batch; ``False`` when no session was due."""
        try:
            claimed = self._outbox.claim(
                self._owner,
                limit=self.batch_size,
                lease=self.lease,
                session_id=session_id,
                skip=frozenset(done),
                ignore_backoff=ignore_backoff,
            )
        except BackendUnavailable as exc:
            if not _disk_full(exc):
                raise
            return self._replay_holding_lock(totals, done, session_id, ignore_backoff)
        if claimed is None:
            return False
        holding.add(claimed.session_id)
        try:
            if claimed.unreadable:
                self._outbox.fail(
                    claimed.session_id,
                    claimed.unreadable,
                    owner=self._owner,
                    error="the parked payload is no longer a valid message",
                    code=None,
                    retry_at=utcnow(),
                    rejected=True,
                    dead=True,
                )
                totals["dead"] += len(claimed.unreadable)
            if not self._replay(claimed, totals):
                done.add(claimed.session_id)
        finally:
            holding.discard(claimed.session_id)
        return True

    def _replay_holding_lock(
        self, totals: dict[str, int], done: set[str], session_id: str | None, ignore_backoff: bool
    ) -> bool:
        """One batch replayed under the outbox transaction's lock instead of a lease (the
        disk is full: see :meth:`Outbox.replay_holding_lock`); ``False`` when no session
        was due. A failure is not recorded (that is a write the full disk may refuse):
        the rest of the session waits for the next round."""
        failure: list[BaseException] = []

        def replay(claimed: ClaimedBatch) -> list[uuid.UUID]:
            stored: list[uuid.UUID] = []
            messages = claimed.messages
            try:
                while messages:
                    edits = [i for i, message in enumerate(messages) if is_edit(message)]
                    run = messages[: max(1, edits[0])] if edits else messages
                    if is_edit(run[0]):
                        self._store_edit(claimed.session_id, run[0], complete=False)
                        totals["replayed"] += 1
                    else:
                        _count(
                            totals, self._store(claimed.session_id, claimed, run, complete=False)
                        )
                    stored.extend(message.client_msg_uuid for message in run)
                    messages = messages[len(run) :]
            except (TimeoutError, RepoError) as exc:
                failure.append(exc)
                totals["failed"] += len(messages)
            return stored

        replayed = self._outbox.replay_holding_lock(
            replay,
            limit=self.batch_size,
            session_id=session_id,
            skip=frozenset(done),
            ignore_backoff=ignore_backoff,
        )
        if replayed is None:
            return False
        claimed, stored = replayed
        if failure or not stored:  # (nothing readable: left for a drain with space)
            done.add(claimed.session_id)
        if failure:
            self._replay_failures.event(_describe(failure[0]), failure[0])
        return True

    @contextlib.contextmanager
    def _renewing(self, holding: set[str]) -> Iterator[None]:
        """While inside, renew this drainer's claims on the sessions in ``holding``
        every second (a third of the lease, if shorter): a heartbeat on a thread (or a
        task) of its own, so that a replay step that takes long keeps its claim, and a
        drainer that dies loses it within one lease."""
        period = max(_WATCH_TICK, min(_RENEW_EVERY, self.lease / 3))
        done = threading.Event()

        def beat() -> None:
            while True:
                if self._asynchronous:
                    waited = 0.0
                    while waited < period and not done.is_set():
                        _aio.sleep(min(_WATCH_TICK, period - waited))
                        waited += _WATCH_TICK
                    if done.is_set():
                        return
                elif done.wait(period):
                    return
                try:
                    self._outbox.renew(self._owner, sorted(holding.copy()), lease=self.lease)
                except Exception:  # the next beat tries again; the lease is longer
                    drainer_log.debug("could not renew the outbox claims", exc_info=True)

        if self._asynchronous:
            self._outbox_pool.submit(beat)
        else:
            threading.Thread(target=beat, name="sessionrepo-lease", daemon=True).start()
        try:
            yield
        finally:
            done.set()

    def _drained(self, replayed: int, remaining: int | None) -> None:
        """Count what a drain replayed; once the outbox is empty (``remaining`` 0), say
        how much was replayed since it last was, and writes are no longer parking."""
        with self._replayed_lock:
            self._replayed += replayed
            if remaining != 0:
                return
            count, self._replayed = self._replayed, 0
        self._parking.end()
        if count:
            log.info("outbox drained: %d parked messages replayed, none left", count)

    def _replay(self, claimed: ClaimedBatch, totals: dict[str, int]) -> bool:
        """Replay one claimed batch, in order; ``False`` when the session must wait.

        A batch the primary rejects is replayed again one message at a time, to find
        the message at fault; the ones before it are stored, the ones after it wait.
        """
        rows = list(
            zip(
                claimed.positions,
                claimed.messages,
                claimed.attempts,
                claimed.rejections,
                strict=True,
            )
        )
        if not rows:
            return True
        one_by_one = False
        while rows:
            # A parked edit is applied alone, in its place: the messages before it are
            # stored first, those after it wait for it.
            edits = [i for i, (_, message, *_) in enumerate(rows) if is_edit(message)]
            run = rows[:1] if edits and edits[0] == 0 else rows[: edits[0]] if edits else rows
            batch = run if not one_by_one else rows[:1]
            try:
                if is_edit(batch[0][1]):
                    self._store_edit(claimed.session_id, batch[0][1])
                    totals["replayed"] += 1
                else:
                    messages = [m for _, m, *_ in batch]
                    _count(totals, self._store(claimed.session_id, claimed, messages))
            except (TimeoutError, RepoError) as exc:
                # An edit the primary refuses (a key it lacks, a point past the end) fails
                # the same way every time: rejected, like a message the database refuses.
                rejected = isinstance(exc, WriteRejected | InvalidMessage) or (
                    is_edit(batch[0][1])
                    and isinstance(exc, InvalidArgument | NotFound | ConflictError)
                )
                if rejected and len(batch) > 1:
                    one_by_one = True
                    continue
                dead = self._failed(claimed, batch, exc, rejected=rejected)
                totals["dead" if dead else "failed"] += len(batch)
                rest = [position for position, *_ in rows[len(batch) :]]
                if not dead:
                    self._outbox.release(claimed.session_id, rest, owner=self._owner)
                    return False
                # Set aside: it no longer holds its session up; the rest go on now.
                rows = rows[len(batch) :]
                continue
            rows = rows[len(batch) :]
        return True

    def _store(
        self,
        session_id: str,
        claimed: ClaimedBatch,
        messages: list[Message],
        *,
        complete: bool = True,
    ) -> AppendResult:
        # Rows parked before derived fields were refused may carry one: the store
        # keeps those itself, so they are dropped rather than failing the replay.
        defaults = {
            name: value
            for name, value in claimed.session_defaults.items()
            if name not in DERIVED_FIELDS
        }
        batch = self._repository.prepare(session_id, messages, **defaults)
        result = self._primary_pool.run(
            lambda: self._repository.append_prepared(batch, timeout=self._budget),
            timeout=self.deadline,
        )
        self._back()
        self._outage.end()
        self._replay_failures.end()
        self._checkpoint("drain_after_primary_commit")
        if complete:
            self._outbox.complete(session_id, [m.client_msg_uuid for m in messages])
        if result.conflicts:
            log.error(
                "session %r: %d parked messages conflict with stored ones (same key, "
                "different content); the stored ones were kept: %s",
                session_id,
                len(result.conflicts),
                [str(key) for key in result.conflicts],
            )
        return result

    def _store_edit(self, session_id: str, edit: Message, *, complete: bool = True) -> None:
        self._primary_pool.run(
            lambda: apply_edit(self._repository, session_id, edit), timeout=self.deadline
        )
        self._checkpoint("drain_after_primary_commit")
        if complete:
            self._outbox.complete(session_id, [edit.client_msg_uuid])

    def _failed(
        self,
        claimed: ClaimedBatch,
        rows: list[tuple[int, Message, int, int]],
        exc: BaseException,
        *,
        rejected: bool,
    ) -> bool:
        """Record a failed replay of ``rows``; ``True`` when they were set aside dead."""
        attempts = max(row[2] for row in rows) + 1
        dead = rejected and max(row[3] for row in rows) + 1 >= self.max_attempts
        base, cap = self._backoff
        delay = 0.0 if dead else random.uniform(0, min(cap, base * 2 ** min(attempts, 30)))
        error = str(exc) or type(exc).__name__
        if isinstance(exc, TimeoutError):
            error = f"the primary did not answer within {self.deadline:g}s"
        if not rejected and isinstance(exc, TimeoutError | BackendUnavailable):
            self._replay_failures.event(error, exc)
        elif not rejected:
            drainer_log.error("session %r: replay failed: %s", claimed.session_id, error)
        self._outbox.fail(
            claimed.session_id,
            [row[0] for row in rows],
            owner=self._owner,
            error=error,
            code=getattr(exc, "code", None),
            retry_at=utcnow() + timedelta(seconds=delay),
            rejected=rejected,
            dead=dead,
        )
        return dead

    # -- background drainer ---------------------------------------------------------

    def start(self, *, interval: float = 1.0) -> None:
        # A daemon thread: a drainer stuck on a frozen server never keeps the process
        # from exiting.
        interval = check_seconds(interval, "interval")
        if self._drainer is not None:
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.is_set():
                self._wake.wait(self.drain_round(interval))
                self._wake.clear()

        self._drainer = threading.Thread(target=loop, name="sessionrepo-drainer", daemon=True)
        self._drainer.start()

    def drain_round(self, interval: float) -> float:
        """One round of the background drainer; returns the seconds to wait before the
        next (at most ``interval``; sooner when a retry falls due)."""
        interval = check_seconds(interval, "interval")
        try:
            self.drain()
            due = self._outbox.next_due()
        except Exception as exc:  # the drainer must outlive any one failure
            self._drain_failures.event(_describe(exc), exc)
            return interval
        self._drain_failures.end()
        wait = interval
        if due is not None:
            wait = min(interval, max(0.05, (due - utcnow()).total_seconds()))
        # Index what appends left in the search backlog, a bounded amount per round and
        # within the deadline (a catch-up past it finishes in the background), so that
        # searches find little to do; sooner again while more is left. Its failures are
        # the index's, never the transcript's: logged, not raised.
        # While writes are flowing, one short transaction per round: the catch-up takes
        # the write lock (SQLite) and must not hold the gateway's writes up; search
        # catches up what is left when it is asked.
        # Not while the primary is known down, nor before a failed one's backoff ends.
        now = time.monotonic()
        if self._breaker.down() is not None or now < self._index_retry_at:
            return wait
        flowing = now - self._last_write < _WRITES_FLOWING
        limit = 1 if flowing else 2000
        try:
            indexed = self._primary_pool.run(
                lambda: self._repository.catch_up_search_index(limit=limit),
                timeout=self.deadline,
            )
        except Exception as exc:
            failures = self._index_failures.event(_describe(exc), exc)
            backoff = min(self._backoff[1], interval * 2 ** min(failures - 1, 30))
            self._index_retry_at = time.monotonic() + backoff
            return wait
        self._index_failures.end()
        return min(wait, 0.05) if indexed >= limit and not flowing else wait

    def stop(self, timeout: float | None = 30.0) -> None:
        if timeout is not None:
            timeout = check_seconds(timeout, "timeout", allow_zero=True)
        drainer, self._drainer = self._drainer, None
        if drainer is None:
            return
        self._stop.set()
        self._wake.set()
        drainer.join(timeout)
        if drainer.is_alive():
            log.warning("the outbox drainer did not stop within %ss; leaving it", timeout)

    def close(self) -> None:
        self._closed = True
        self._closing.set()
        self.stop()
        if self._prober is not None:
            # Its connection goes back to the pool before the caller disposes of it.
            self._prober.join(self.deadline)
        self._primary_pool.shutdown()
        self._outbox_pool.shutdown()
        if self._watchdog is not None:
            self._watchdog.stop()
        self._outbox.close()

    def __enter__(self) -> TranscriptWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = "its own" if self._outbox_on_primary else self._outbox.display_url
        return f"TranscriptWriter({self._repository.display_url}, outbox {where})"


class _Breaker:
    """Whether the primary is known to be down.

    Tripped by a write that failed for an operational reason or missed its deadline;
    while tripped, writes park at once instead of each spending the deadline on a
    primary that cannot answer, and one probe per ``interval`` asks it. Closed by the
    first call that goes through (the probe, or a replay).
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._down: tuple[str, str | None] | None = None

    def down(self) -> tuple[str, str | None] | None:
        """``(reason, code)`` while tripped, else ``None`` (read without the lock)."""
        return self._down

    def trip(self, reason: str, code: str | None) -> bool:
        """Trip it; ``True`` when it was closed (then the caller starts the probe)."""
        with self._lock:
            was_closed = self._down is None
            self._down = (f"the primary is unavailable ({reason})", code)
            return was_closed

    def close(self) -> bool:
        """Close it; ``True`` when it was tripped."""
        with self._lock:
            was_down = self._down is not None
            self._down = None
            return was_down


class _Guard:
    __slots__ = ("connection", "deadline", "severed")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.connection: Any = None
        self.severed = False


class _Watchdog:
    """The deadline of a write that runs on the caller's thread, for a server that does
    not answer at all (frozen, or a network that drops everything), where the server's
    own timeouts cannot fire: past the deadline, the connection under the call is cut
    (:meth:`~sessionrepo.dialects.base.BackendDialect.sever`), and the call fails at
    once with the server's silence as its reason.

    One daemon thread per writer looks at the calls in flight a few times a second:
    a guarded call costs two dictionary operations, and no thread switch.
    """

    def __init__(self, database: Database) -> None:
        self._dialect = database.dialect
        self._pool = database.engine.pool
        self._guards: dict[int, _Guard] = {}
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        event.listen(database.engine, "checkout", self._checked_out)

    def connection_ready(self) -> bool:
        """Whether the call would find a connection made already (a new one could hang
        in the connect, before there is a connection to cut)."""
        return not self._dialect.capabilities.connect_may_hang or self._pool.checkedin() > 0  # type: ignore[attr-defined]

    def _checked_out(self, dbapi_connection: Any, record: Any, proxy: Any) -> None:
        guard = self._guards.get(threading.get_ident())
        if guard is not None:
            guard.connection = dbapi_connection

    def not_severed(self) -> bool:
        guard = self._guards.get(threading.get_ident())
        return guard is None or not guard.severed

    @contextlib.contextmanager
    def guard(self, seconds: float) -> Iterator[_Guard]:
        if self._thread is None:
            self._start()
        guard = _Guard(time.monotonic() + seconds)
        ident = threading.get_ident()
        self._guards[ident] = guard
        try:
            yield guard
        finally:
            del self._guards[ident]

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="sessionrepo-watchdog", daemon=True
                )
                self._thread.start()

    def _watch(self) -> None:
        while not self._stopped.wait(_WATCH_TICK):
            now = time.monotonic()
            for guard in list(self._guards.values()):
                if guard.deadline <= now and not guard.severed and guard.connection is not None:
                    guard.severed = True
                    try:
                        self._dialect.sever(guard.connection)
                    except Exception:  # a connection closed meanwhile: nothing to cut
                        log.debug("could not cut a connection past its deadline", exc_info=True)

    def stop(self) -> None:
        self._stopped.set()


#: A write this recent (seconds) means writes are flowing: the drainer's catch-up
#: then takes one short transaction per round.
_WRITES_FLOWING: Final = 0.25

#: Seconds between the watchdog's looks at the calls in flight.
_WATCH_TICK: Final = 0.05

#: Seconds between a drainer's renewals of its claims (a third of the lease if shorter).
_RENEW_EVERY: Final = 1.0

#: The reason of a batch that queued behind its session's parked messages.
_QUEUED: Final = "queued behind this session's parked messages"

#: Seconds from a repeating failure's first line to its first summary; then doubling, up
#: to the cap.
_REPEAT_FIRST: Final = 5.0
_REPEAT_CAP: Final = 300.0


class _Episode:
    """Something that may happen again and again while it lasts (an outage's failures,
    writes parking): its first occurrence logged at once, in one line; the repeats
    counted, and summarised in one line at doubling intervals (:data:`_REPEAT_FIRST`
    seconds, then twice that, up to :data:`_REPEAT_CAP`); the traceback of each at DEBUG
    only; its end in one line (``end``, if given).

    ``start`` and ``repeat`` are formatted with ``detail`` (the latest), ``count`` (so
    far) and ``seconds`` (since the first); ``end`` with ``count`` and ``seconds``.
    """

    def __init__(
        self,
        logger: logging.Logger,
        level: int,
        *,
        start: str,
        repeat: str,
        end: str | None = None,
    ) -> None:
        self._log, self._level = logger, level
        self._start, self._repeat, self._end = start, repeat, end
        self._lock = threading.Lock()
        self._count = 0
        self._since = 0.0
        self._gap = _REPEAT_FIRST
        self._next_line = 0.0

    def event(self, detail: str, exc: BaseException | None = None) -> int:
        """One occurrence; returns how many there were since the episode began."""
        now = time.monotonic()
        with self._lock:
            self._count += 1
            count = self._count
            if count == 1:
                self._since, self._gap = now, _REPEAT_FIRST
                self._next_line = now + self._gap
                line: str | None = self._start
            elif now >= self._next_line:
                self._gap = min(_REPEAT_CAP, self._gap * 2)
                self._next_line = now + self._gap
                line = self._repeat
            else:
                line = None
            seconds = now - self._since
        if line is not None:
            detail = _first_line(detail)
            self._log.log(self._level, line.format(detail=detail, count=count, seconds=seconds))
        if exc is not None:
            self._log.debug("the failure in full", exc_info=exc)
        return count

    def end(self) -> None:
        """The episode is over (a no-op when none is going on)."""
        if not self._count:  # the common case, on the write path: no lock taken
            return
        with self._lock:
            count, self._count = self._count, 0
            seconds = time.monotonic() - self._since
        if count and self._end is not None:
            self._log.info(self._end.format(count=count, seconds=seconds))


def _describe(exc: BaseException) -> str:
    """A failure in one line: its message's first line (the rest, and the chain, are for
    the DEBUG traceback)."""
    if isinstance(exc, TimeoutError) and not str(exc):
        return "the primary did not answer within the deadline"
    return _first_line(str(exc)) or type(exc).__name__


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0][:500] if lines else ""


def _disk_full(exc: BaseException | None) -> bool:
    """Whether the outbox refused a write for lack of space (SQLite's ``SQLITE_FULL``)."""
    return isinstance(exc, BackendUnavailable) and exc.code == "SQLITE_FULL"


class _Pool(Protocol):
    """Where the writer runs a call with a deadline: daemon threads, or asyncio tasks."""

    def run(self, work: Callable[[], T], *, timeout: float) -> T: ...

    def submit(self, work: Callable[[], Any]) -> None: ...

    def shutdown(self) -> None: ...


class _DaemonPool:
    """A minimal thread pool of daemon threads with a per-call deadline.

    ``concurrent.futures`` joins its workers at interpreter exit, so one write stuck on
    a frozen server would keep the whole gateway from exiting. A call that misses its
    deadline is cancelled if it has not started; if it has, it is abandoned.
    """

    def __init__(self, size: int, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{index}", daemon=True)
            for index in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def run(self, work: Callable[[], T], *, timeout: float) -> T:
        """``work()`` on a pool thread; ``TimeoutError`` if it takes over ``timeout``."""
        future: Future[T] = Future()
        self._queue.put((future, work))
        try:
            return future.result(timeout=timeout)
        except TimeoutError:
            future.cancel()  # not started yet: never start it
            raise

    def submit(self, work: Callable[[], Any]) -> None:
        """``work()`` on a pool thread; not waited for (its failure is its own)."""
        self._queue.put((Future(), work))

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, work = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(work())
            except BaseException as exc:
                future.set_exception(exc)

    def shutdown(self) -> None:
        """Let idle threads end; threads stuck in a call end with it (or the process)."""
        for _ in self._threads:
            self._queue.put(None)


def _count(totals: dict[str, int], stored: AppendResult) -> None:
    totals["replayed"] += len(stored.inserted)
    totals["duplicates"] += len(stored.duplicates)
    totals["conflicts"] += len(stored.conflicts)
