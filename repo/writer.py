"""``TranscriptWriter``: the write path a gateway calls. Nothing acknowledged is lost.

``write`` stores a batch in the primary, or, when the primary cannot take it for an
operational reason (down, locked, full, read-only, frozen past the deadline), parks it in
the pending outbox and returns normally, saying so. ``drain`` replays parked batches in
their original order, per session, exactly once in effect: a row leaves the outbox only
after the primary has committed it, and the message key makes any repeat a no-op.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.engine import URL

from models import AppendResult, Message
from models.message import utcnow
from repo import schema
from repo._database import Database
from repo._dialects import normalize_url
from repo.errors import BackendUnavailable, RepoError
from repo.outbox import ClaimedBatch, Outbox, OutboxStatus, drainer_id
from repo.repository import PreparedBatch, SessionRepository

log = logging.getLogger("sessionrepo.writer")

T = TypeVar("T")


class WriteResult(BaseModel):
    """What ``write`` did with a batch. Either way, the batch is durably committed."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    status: Literal["stored", "parked"]
    #: Keys the primary stored now (``stored`` only).
    inserted: list[Any] = Field(default_factory=list)
    #: Keys the primary already had (``stored`` only).
    duplicates: list[Any] = Field(default_factory=list)
    #: Keys the primary had with different content (``stored`` only).
    conflicts: list[Any] = Field(default_factory=list)
    #: Messages put in the outbox (``parked`` only).
    parked: int = 0
    #: Why the batch was parked.
    reason: str | None = None


class DrainReport(BaseModel):
    """What one ``drain`` did."""

    model_config = ConfigDict(frozen=True)

    #: Parked messages the primary stored now.
    replayed: int = 0
    #: Parked messages the primary already had (an earlier attempt did commit).
    duplicates: int = 0
    #: Parked messages whose key the primary had with different content (removed).
    conflicts: int = 0
    #: Rows whose replay failed this time (kept, retried later).
    failed: int = 0
    #: Rows set aside as dead this time (kept, see ``retry_dead``).
    dead: int = 0
    #: Pending rows left in the outbox afterwards.
    remaining: int = 0


def open_outbox_database(url: str | URL) -> Database:
    """A separate outbox store. A SQLite file is created private (mode 0600), kept
    durable (WAL, ``synchronous=FULL``) and migrated by the same Alembic environment."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        path = Path(parsed.database)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    database = Database(parsed, sqlite_synchronous="FULL")
    try:
        schema.ensure_current(database, auto_migrate=database.backend == "sqlite")
    except BaseException:
        database.dispose()
        raise
    return database


class TranscriptWriter:
    """The resilient write path: primary store first, the pending outbox when it fails.

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
        lease: seconds a drainer's claim on a session's rows lasts (it is released at
            once when the replay ends; the lease matters only if the drainer dies).
        workers: threads that carry primary writes (a write past its deadline keeps
            one busy until the database answers).
    """

    def __init__(
        self,
        repository: SessionRepository,
        *,
        outbox_url: str | URL | None = None,
        deadline: float = 5.0,
        max_attempts: int = 5,
        batch_size: int = 500,
        lease: float = 60.0,
        workers: int = 4,
        backoff_base: float = 0.5,
        backoff_cap: float = 300.0,
    ) -> None:
        if deadline <= 0:
            raise ValueError("deadline must be positive")
        self._repository = repository
        url = outbox_url or os.environ.get("SESSIONREPO_OUTBOX_URL") or None
        if url is None:
            # Its own pool: writes stuck on the primary's pool must not block parking.
            outbox_db = Database(repository.database.url, pool_size=2, max_overflow=4)
        else:
            outbox_db = open_outbox_database(url)
        self._outbox = Outbox(outbox_db)
        self.deadline = deadline
        self.max_attempts = max_attempts
        self.batch_size = batch_size
        self.lease = max(lease, 2 * deadline)
        self._backoff = (backoff_base, backoff_cap)
        self._primary_pool = ThreadPoolExecutor(workers, thread_name_prefix="sessionrepo-primary")
        self._outbox_pool = ThreadPoolExecutor(2, thread_name_prefix="sessionrepo-outbox")
        self._owner = drainer_id()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._drainer: threading.Thread | None = None
        #: Fault injection for crash tests: called with the name of each step.
        self.fault_hook: Callable[[str], None] | None = None

    @property
    def outbox(self) -> Outbox:
        return self._outbox

    # -- write ----------------------------------------------------------------------

    def write(
        self,
        session_id: str,
        messages: Iterable[Message | Mapping[str, Any]],
        **session_defaults: Any,
    ) -> WriteResult:
        """Store a batch durably, in the primary or in the outbox.

        Returns only after a durable commit. A session with parked messages gets new
        ones parked behind them, so replay can never reorder its transcript.

        Raises:
            InvalidMessage: bad input (never parked; nothing was written).
            WriteRejected: the primary refused this data itself (never parked).
            BackendUnavailable: neither the primary nor the outbox could take the batch;
                nothing was acknowledged and the caller still holds the messages.
        """
        batch = self._repository.prepare(session_id, messages, **session_defaults)
        if not batch.messages:
            return WriteResult(session_id=batch.session_id, status="stored")

        def attempt() -> WriteResult | None:
            if self._outbox.has_pending(batch.session_id):
                return None
            self._checkpoint("before_primary")
            stored = self._repository.append_prepared(batch, timeout=self.deadline)
            return WriteResult(
                session_id=batch.session_id,
                status="stored",
                inserted=stored.inserted,
                duplicates=stored.duplicates,
                conflicts=stored.conflicts,
            )

        try:
            result = self._within_deadline(self._primary_pool, attempt)
        except FutureTimeout:
            reason = f"the primary did not answer within {self.deadline:g}s"
            code: str | None = "deadline"
        except BackendUnavailable as exc:
            reason, code = str(exc), exc.code
        else:
            if result is not None:
                self._checkpoint("after_primary_commit")
                return result
            reason, code = "queued behind this session's parked messages", None
        self._checkpoint("after_primary_failure")
        return self._park(batch, reason, code)

    def _park(self, batch: PreparedBatch, reason: str, code: str | None) -> WriteResult:
        def park() -> int:
            return self._outbox.park(
                batch.session_id, batch.messages, batch.session, reason=reason, error_code=code
            )

        try:
            self._within_deadline(self._outbox_pool, park)
        except (FutureTimeout, RepoError) as exc:
            detail = "it did not answer in time" if isinstance(exc, FutureTimeout) else str(exc)
            raise BackendUnavailable(
                f"session {batch.session_id!r}: the primary could not take the batch "
                f"({reason}) and neither could the outbox ({detail}); nothing was "
                "acknowledged: keep the messages and send them again",
                code=code,
            ) from exc
        self._checkpoint("after_park")
        log.warning(
            "session %r: parked %d messages: %s", batch.session_id, len(batch.messages), reason
        )
        self._wake.set()
        return WriteResult(
            session_id=batch.session_id,
            status="parked",
            parked=len(batch.messages),
            reason=reason,
        )

    def _within_deadline(self, pool: ThreadPoolExecutor, work: Callable[[], T]) -> T:
        future: Future[T] = pool.submit(work)
        try:
            return future.result(timeout=self.deadline)
        except FutureTimeout:
            future.cancel()  # not started yet: never start it
            raise

    def _checkpoint(self, step: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(step)

    # -- drain ----------------------------------------------------------------------

    def pending(self, session_id: str | None = None) -> int:
        """Messages waiting in the outbox (dead ones not counted)."""
        return self._outbox.count(session_id)

    def status(self) -> OutboxStatus:
        return self._outbox.status()

    def retry_dead(self, session_id: str | None = None) -> int:
        """Put messages set aside as dead back in line; the next drain tries them."""
        count = self._outbox.retry_dead(session_id)
        self._wake.set()
        return count

    def drain(self, *, session_id: str | None = None) -> DrainReport:
        """Replay parked messages, oldest first per session, until none is due.

        A session whose replay fails keeps its rows (attempts, last error, next retry
        with exponential backoff and jitter) and does not hold up the others. A message
        the primary keeps *rejecting* becomes dead after ``max_attempts``.
        """
        totals = {"replayed": 0, "duplicates": 0, "conflicts": 0, "failed": 0, "dead": 0}
        done: set[str] = set()
        while True:
            claimed = self._outbox.claim(
                self._owner,
                limit=self.batch_size,
                lease=self.lease,
                session_id=session_id,
                skip=frozenset(done),
            )
            if claimed is None:
                break
            if claimed.unreadable:
                self._outbox.fail(
                    claimed.session_id,
                    claimed.unreadable,
                    error="the parked payload is no longer a valid message",
                    code=None,
                    retry_at=utcnow(),
                    dead=True,
                )
                totals["dead"] += len(claimed.unreadable)
            if not self._replay(claimed, totals):
                done.add(claimed.session_id)
        return DrainReport(**totals, remaining=self._outbox.count())

    def _replay(self, claimed: ClaimedBatch, totals: dict[str, int]) -> bool:
        """Replay one claimed batch; ``False`` when the session must wait."""
        if not claimed.messages:
            return True
        try:
            stored = self._store(claimed, claimed.positions, claimed.messages)
        except (FutureTimeout, BackendUnavailable) as exc:
            self._failed(claimed, claimed.positions, claimed.attempts, exc, permanent=False)
            totals["failed"] += len(claimed.positions)
            return False
        except RepoError as exc:
            if len(claimed.messages) == 1:
                dead = self._failed(
                    claimed, claimed.positions, claimed.attempts, exc, permanent=True
                )
                totals["failed" if not dead else "dead"] += 1
                return False
            # One of them is poisoned: find it by replaying one at a time, in order.
            return self._replay_one_by_one(claimed, totals)
        _count(totals, stored)
        return True

    def _replay_one_by_one(self, claimed: ClaimedBatch, totals: dict[str, int]) -> bool:
        items = list(zip(claimed.positions, claimed.messages, claimed.attempts, strict=True))
        for index, (position, message, attempts) in enumerate(items):
            try:
                stored = self._store(claimed, [position], [message])
            except RepoError as exc:
                permanent = not isinstance(exc, BackendUnavailable)
                dead = self._failed(claimed, [position], [attempts], exc, permanent=permanent)
                totals["dead" if dead else "failed"] += 1
                self._outbox.release(claimed.session_id, [p for p, *_ in items[index + 1 :]])
                return False
            except FutureTimeout as exc:
                self._failed(claimed, [position], [attempts], exc, permanent=False)
                totals["failed"] += 1
                self._outbox.release(claimed.session_id, [p for p, *_ in items[index + 1 :]])
                return False
            _count(totals, stored)
        return True

    def _store(
        self, claimed: ClaimedBatch, positions: list[int], messages: list[Message]
    ) -> AppendResult:
        batch = self._repository.prepare(claimed.session_id, messages, **claimed.session_defaults)
        result = self._within_deadline(
            self._primary_pool,
            lambda: self._repository.append_prepared(batch, timeout=self.deadline),
        )
        self._checkpoint("drain_after_primary_commit")
        self._outbox.complete(claimed.session_id, positions)
        if result.conflicts:
            log.error(
                "session %r: %d parked messages conflict with stored ones (same key, "
                "different content); the stored ones were kept: %s",
                claimed.session_id,
                len(result.conflicts),
                [str(key) for key in result.conflicts],
            )
        return result

    def _failed(
        self,
        claimed: ClaimedBatch,
        positions: list[int],
        attempts: list[int],
        exc: BaseException,
        *,
        permanent: bool,
    ) -> bool:
        tries = max(attempts) + 1
        dead = permanent and tries >= self.max_attempts
        base, cap = self._backoff
        delay = random.uniform(0, min(cap, base * 2**tries))
        error = str(exc) or type(exc).__name__
        if isinstance(exc, FutureTimeout):
            error = f"the primary did not answer within {self.deadline:g}s"
        self._outbox.fail(
            claimed.session_id,
            positions,
            error=error,
            code=getattr(exc, "code", None),
            retry_at=utcnow() + timedelta(seconds=delay),
            dead=dead,
        )
        return dead

    # -- background drainer ---------------------------------------------------------

    def start(self, *, interval: float = 1.0) -> None:
        """Run ``drain`` in a background thread until ``close``; it drains at once
        (startup recovery: whatever an earlier process left parked goes first)."""
        if self._drainer is not None:
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.is_set():
                wait = interval
                try:
                    self.drain()
                    due = self._outbox.next_due()
                    if due is not None:
                        wait = min(interval, max(0.05, (due - utcnow()).total_seconds()))
                except RepoError as exc:
                    log.warning("outbox drain failed, retrying in %.1fs: %s", interval, exc)
                self._wake.wait(wait)
                self._wake.clear()

        self._drainer = threading.Thread(target=loop, name="sessionrepo-drainer", daemon=True)
        self._drainer.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the background drainer (the current round finishes first)."""
        drainer, self._drainer = self._drainer, None
        if drainer is None:
            return
        self._stop.set()
        self._wake.set()
        drainer.join(timeout)

    def close(self) -> None:
        """Stop the drainer and release the outbox. The repository stays open (it is
        the caller's). Writes abandoned past their deadline are not waited for."""
        self.stop()
        self._primary_pool.shutdown(wait=False, cancel_futures=True)
        self._outbox_pool.shutdown(wait=False, cancel_futures=True)
        self._outbox.database.dispose()

    def __enter__(self) -> TranscriptWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _count(totals: dict[str, int], stored: AppendResult) -> None:
    totals["replayed"] += len(stored.inserted)
    totals["duplicates"] += len(stored.duplicates)
    totals["conflicts"] += len(stored.conflicts)
