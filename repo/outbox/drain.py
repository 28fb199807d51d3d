"""The drainer: parked rows replayed into the primary, oldest first, per session.

A row leaves the outbox only after the primary has committed it (:meth:`Outbox.complete`
by key, after the primary's commit); the message key makes any repeat a no-op, so a
crash anywhere in between duplicates nothing. A session whose replay fails keeps its rows
(attempts, last error, next retry time) and does not hold the others up; a row the
primary keeps *rejecting* is set aside as dead after ``max_attempts``. Claims are leases
a heartbeat renews while a replay runs (:meth:`Drainer._renewing`), so a drainer that
dies lets go of its sessions within one lease. A parked edit is applied alone, in its
place in the session's FIFO.

Between drains, the background loop (:meth:`Drainer.start`) also catches the search
index up with what appends left in its backlog.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Final

from sessionrepo.errors import (
    BackendUnavailable,
    ConflictError,
    InvalidArgument,
    InvalidMessage,
    NotFound,
    RepoError,
    WriteRejected,
)
from sessionrepo.models import AppendResult, Message
from sessionrepo.models.message import utcnow
from sessionrepo.models.outbox import DrainReport
from sessionrepo.models.session import DERIVED_FIELDS
from sessionrepo.outbox.attempt import disk_full
from sessionrepo.outbox.deadline import WATCH_TICK, Calls
from sessionrepo.outbox.edits import apply_edit, is_edit
from sessionrepo.outbox.outage import Episode, Outage, describe, drainer_log, index_log, log
from sessionrepo.outbox.table import ClaimedBatch, Outbox
from sessionrepo.store import bridge as _aio
from sessionrepo.store.arguments import check_seconds
from sessionrepo.store.repository import SessionRepository

#: A write this recent (seconds) means writes are flowing: the drainer's catch-up
#: then takes one short transaction per round.
_WRITES_FLOWING: Final = 0.25
#: Messages the semantic catch-up embeds per drainer round while writes pause (one call
#: of the embedder; none while they flow).
_EMBED_PER_ROUND: Final = 64

#: Seconds between a drainer's renewals of its claims (a third of the lease if shorter).
_RENEW_EVERY: Final = 1.0


class Drainer:
    """Replays a writer's outbox into its primary.

    Args:
        repository: the primary.
        outbox: the parked rows.
        calls: the pools and the deadline each replay step is held to.
        outage: told when a replay goes through (the primary answers again).
        owner: who this drainer's claims name (:func:`~.table.drainer_id`).
        max_attempts, batch_size, lease, backoff: see :class:`~.writer.TranscriptWriter`
            (``backoff``: its ``(backoff_base, backoff_cap)``).
        checkpoint: fault injection: called with the name of each step.
        drain: the drain a background round runs (the writer's, instrumented).
    """

    def __init__(
        self,
        repository: SessionRepository,
        outbox: Outbox,
        calls: Calls,
        outage: Outage,
        *,
        owner: str,
        max_attempts: int,
        batch_size: int,
        lease: float,
        backoff: tuple[float, float],
        checkpoint: Callable[[str], None],
        drain: Callable[[], object],
    ) -> None:
        self._repository = repository
        self._outbox = outbox
        self._calls = calls
        self._outage = outage
        self.owner = owner
        self.max_attempts = max_attempts
        self.batch_size = batch_size
        self.lease = lease
        self._backoff = backoff
        self._checkpoint = checkpoint
        self._round_drain = drain
        #: When the writer last took a write (monotonic): the catch-up yields to writes.
        self.last_write = 0.0
        self._index_retry_at = 0.0
        #: Cleared while a search index catch-up runs: one that outlasts its round's
        #: deadline goes on in the background, and no round starts another until it ends.
        self._index_idle = threading.Event()
        self._index_idle.set()
        #: Held by each claim and its replay: a drain a caller asks for and the
        #: background round interleave batch by batch, so neither finds a session leased
        #: by the other (the lease is for other drainers) and reports it as pending.
        self._one_batch: contextlib.AbstractContextManager[object] = (
            _aio.Lock() if calls.asynchronous else threading.Lock()
        )
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._replay_failures = Episode(
            drainer_log,
            logging.WARNING,
            start="replay of parked messages failed: {detail}; retrying with backoff",
            repeat="replay of parked messages still failing ({count} times in {seconds:.0f}s): "
            "{detail}",
            end="replay of parked messages works again (failures: {count}, over {seconds:.1f}s)",
        )
        self._drain_failures = Episode(
            drainer_log,
            logging.WARNING,
            start="outbox drain failed: {detail}; retrying every round",
            repeat="outbox drain still failing ({count} times in {seconds:.0f}s): {detail}",
            end="outbox drain works again (failures: {count}, over {seconds:.1f}s)",
        )
        self._index_failures = Episode(
            index_log,
            logging.WARNING,
            start="search index catch-up failed: {detail}; retrying with backoff",
            repeat="search index catch-up still failing ({count} times in {seconds:.0f}s): "
            "{detail}",
            end="search index catch-up works again (failures: {count}, over {seconds:.1f}s)",
        )

    def wake(self) -> None:
        """Wake the background loop (a batch was parked, dead rows were put back)."""
        self._wake.set()

    # -- one drain --------------------------------------------------------------------

    def drain(self, session_id: str | None, ignore_backoff: bool) -> DrainReport:
        """Replay what is due (of ``session_id``), until no session is (arguments
        checked by the caller)."""
        totals = {
            "replayed": 0,
            "duplicates": 0,
            "conflicts": 0,
            "erased": 0,
            "failed": 0,
            "dead": 0,
        }
        if not self._outbox.any_pending(session_id):
            # Nothing parked (no write lock taken): drained, by us or by another writer.
            self._outage.drained(0, 0 if session_id is None else None)
            return DrainReport(**totals, remaining=0)
        done: set[str] = set()
        holding: set[str] = set()
        with self._renewing(holding):
            while True:
                with self._one_batch:  # a claim and its replay, as one
                    if not self._drain_one(totals, done, holding, session_id, ignore_backoff):
                        break
        if totals["erased"]:
            # Their rows are deleted: no copy of an erased message may stay in the
            # outbox file's bytes (its WAL) either.
            self._outbox.scrub()
        # Of the session, for a drain of one (as when it had nothing due, above): the
        # drain of one session reads its shard alone on Citus.
        remaining = self._outbox.count(session_id)
        # What left the outbox: a duplicate is a replay an abandoned attempt had made.
        self._outage.drained(
            totals["replayed"] + totals["duplicates"] + totals["conflicts"],
            remaining if session_id is None else None,
        )
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
                self.owner,
                limit=self.batch_size,
                lease=self.lease,
                session_id=session_id,
                skip=frozenset(done),
                ignore_backoff=ignore_backoff,
            )
        except BackendUnavailable as exc:
            if not disk_full(exc):
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
                    owner=self.owner,
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
            self._replay_failures.event(describe(failure[0]), failure[0])
        return True

    @contextlib.contextmanager
    def _renewing(self, holding: set[str]) -> Iterator[None]:
        """While inside, renew this drainer's claims on the sessions in ``holding``
        every second (a third of the lease, if shorter): a heartbeat on a thread (or a
        task) of its own, so that a replay step that takes long keeps its claim, and a
        drainer that dies loses it within one lease."""
        period = max(WATCH_TICK, min(_RENEW_EVERY, self.lease / 3))
        done = threading.Event()
        asynchronous = self._calls.asynchronous

        def beat() -> None:
            while True:
                if asynchronous:
                    waited = 0.0
                    while waited < period and not done.is_set():
                        _aio.sleep(min(WATCH_TICK, period - waited))
                        waited += WATCH_TICK
                    if done.is_set():
                        return
                elif done.wait(period):
                    return
                try:
                    self._outbox.renew(self.owner, sorted(holding.copy()), lease=self.lease)
                except Exception:  # the next beat tries again; the lease is longer
                    drainer_log.debug("could not renew the outbox claims", exc_info=True)

        if asynchronous:
            self._calls.outbox.submit(beat)
        else:
            threading.Thread(target=beat, name="sessionrepo-lease", daemon=True).start()
        try:
            yield
        finally:
            done.set()

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
                    self._outbox.release(claimed.session_id, rest, owner=self.owner)
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
        # The usage parked with these messages goes with them (rows parked before
        # migration 0012 have none).
        riding = dict(
            zip((m.client_msg_uuid for m in claimed.messages), claimed.usage, strict=False)
        )
        usage = [record for m in messages for record in riding.get(m.client_msg_uuid, ())]
        batch = self._repository.prepare(session_id, messages, usage=usage or None, **defaults)
        result = self._calls.primary.run(
            lambda: self._repository.append_prepared(batch, timeout=self._calls.budget),
            timeout=self._calls.deadline,
        )
        self._outage.answered()
        self._outage.stored()
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
        self._calls.primary.run(
            lambda: apply_edit(self._repository, session_id, edit), timeout=self._calls.deadline
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
            error = f"the primary did not answer within {self._calls.deadline:g}s"
        if not rejected and isinstance(exc, TimeoutError | BackendUnavailable):
            self._replay_failures.event(error, exc)
        elif not rejected:
            drainer_log.error("session %r: replay failed: %s", claimed.session_id, error)
        self._outbox.fail(
            claimed.session_id,
            [row[0] for row in rows],
            owner=self.owner,
            error=error,
            code=getattr(exc, "code", None),
            retry_at=utcnow() + timedelta(seconds=delay),
            rejected=rejected,
            dead=dead,
        )
        return dead

    # -- the background loop ----------------------------------------------------------

    def start(self, interval: float) -> None:
        """Run :meth:`round` on a thread until :meth:`stop` (a no-op when running)."""
        # A daemon thread: a drainer stuck on a frozen server never keeps the process
        # from exiting.
        if self._thread is not None:
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.is_set():
                self._wake.wait(self.round(interval))
                self._wake.clear()

        self._thread = threading.Thread(target=loop, name="sessionrepo-drainer", daemon=True)
        self._thread.start()

    def round(self, interval: float) -> float:
        """One round of the background drainer; returns the seconds to wait before the
        next (at most ``interval``; sooner when a retry falls due)."""
        interval = check_seconds(interval, "interval")
        try:
            self._round_drain()
            due = self._outbox.next_due()
        except Exception as exc:  # the drainer must outlive any one failure
            self._drain_failures.event(describe(exc), exc)
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
        # Not while the primary is known down, nor before a failed one's backoff ends,
        # nor while the last one still runs.
        now = time.monotonic()
        if (
            self._outage.down() is not None
            or now < self._index_retry_at
            or not self._index_idle.is_set()
        ):
            return wait
        flowing = now - self.last_write < _WRITES_FLOWING
        limit = 1 if flowing else 2000
        # The semantic catch-up embeds on this process's CPU (the default model takes
        # about 0.2 s for one text): never while writes are flowing, and one embedder
        # call's worth per round when they pause, so that a write arriving meanwhile
        # competes with one batch at most (see the README's Performance section).
        embed = 0 if flowing else _EMBED_PER_ROUND

        def catch_up() -> tuple[int, int] | None:
            # Its outcome is told here, not by the round, which may have stopped waiting.
            self._index_idle.clear()
            try:
                indexed = self._repository.catch_up_search_index(limit=limit)
                embedded = self._repository.catch_up_semantic_index(limit=embed) if embed else 0
                self._index_failures.end()
                return indexed, embedded
            except Exception as exc:
                self._index_failed(exc, interval)
                return None
            finally:
                self._index_idle.set()

        try:
            done = self._calls.primary.run(catch_up, timeout=self._calls.deadline)
        except TimeoutError:
            # A large backlog (a bulk import, the semantic index's embedding), or a
            # primary that does not answer, which the writes' probe reports: not a failure
            # of the index. Started, it goes on; not started yet, it never starts.
            index_log.debug(
                "search index catch-up still running after %gs; it finishes in the background",
                self._calls.deadline,
            )
            return wait
        except Exception as exc:  # the call could not be made at all
            self._index_failed(exc, interval)
            return wait
        if done is None:
            return wait
        indexed, embedded = done
        more = indexed >= limit or (embed and embedded >= embed)
        return min(wait, 0.05) if more and not flowing else wait

    def _index_failed(self, exc: BaseException, interval: float) -> None:
        """A catch-up failed: logged (once an episode), and the next one waits a backoff
        that doubles from the drainer's interval up to ``backoff_cap``."""
        failures = self._index_failures.event(describe(exc), exc)
        backoff = min(self._backoff[1], interval * 2 ** min(failures - 1, 30))
        self._index_retry_at = time.monotonic() + backoff

    def stop(self, timeout: float | None) -> None:
        """Stop the background loop, waiting up to ``timeout`` seconds for its round, and
        up to the deadline for a catch-up that outlasted its round (so that it ends, and
        says how, before the writer does)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        self._wake.set()
        thread.join(timeout)
        if thread.is_alive():
            log.warning("the outbox drainer did not stop within %ss; leaving it", timeout)
        self._index_idle.wait(self._calls.deadline)


def _count(totals: dict[str, int], stored: AppendResult) -> None:
    totals["replayed"] += len(stored.inserted)
    totals["duplicates"] += len(stored.duplicates)
    totals["conflicts"] += len(stored.conflicts)
    totals["erased"] += len(stored.erased)
