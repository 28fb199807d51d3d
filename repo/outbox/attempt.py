"""Attempt, then park: what ``TranscriptWriter.write`` and every edit through the writer
do with a batch, written once.

1. The primary known down (:class:`~.outage.Outage`): park at once.
2. Else one attempt at the primary, held to its share of the deadline
   (:class:`~.deadline.Calls`). It stores the batch, or says that the batch must queue
   behind the session's parked rows (nothing written), or fails: unavailable, or past
   the deadline, which trips the outage.
3. Else park it, in what is left of the deadline (never less than the reserve).
4. Queued, with the primary answering, and the outbox refusing the batch for lack of
   space (``SQLITE_FULL``): the session's parked rows are replayed (which frees space and
   needs none), then the batch goes to the primary.

Acknowledged means durably committed, in the primary or the outbox: when neither takes
the batch, :class:`~sessionrepo.errors.BackendUnavailable` says so and the caller still
holds the messages.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from sessionrepo.errors import BackendUnavailable, RepoError
from sessionrepo.models.outbox import WriteResult
from sessionrepo.outbox.deadline import Calls
from sessionrepo.outbox.outage import Outage
from sessionrepo.outbox.table import Outbox
from sessionrepo.store.repository import PreparedBatch

log = logging.getLogger("sessionrepo.writer")

#: The reason of a batch that queued behind its session's parked messages.
QUEUED: Final = "queued behind this session's parked messages"

#: One attempt at the primary: the stored result, or ``None`` when the batch must queue
#: behind the session's parked rows (nothing written).
Attempt = Callable[[], WriteResult | None]


class WritePath:
    """Attempt, then park (see the module docstring).

    Args:
        outbox: where a batch is parked.
        calls: the pools and the deadline.
        outage: whether the primary is known down; told what happened.
        checkpoint: fault injection: called with the name of each step.
        parked: called once a batch is parked (wakes the drainer).
        drain_session: replays one session's parked rows now (the full-disk case).
    """

    def __init__(
        self,
        outbox: Outbox,
        calls: Calls,
        outage: Outage,
        *,
        checkpoint: Callable[[str], None],
        parked: Callable[[], None],
        drain_session: Callable[[str], object],
    ) -> None:
        self._outbox = outbox
        self._calls = calls
        self._outage = outage
        self._checkpoint = checkpoint
        self._parked = parked
        self._drain_session = drain_session

    def send(
        self, batch: PreparedBatch, attempt: Attempt, *, started: float, on_writes_pool: bool
    ) -> WriteResult:
        """``batch`` stored by ``attempt`` or parked, within the deadline from
        ``started`` (monotonic); ``on_writes_pool``: see :meth:`Calls.attempt`."""
        down = self._outage.down()
        if down is not None:
            # Known to be down: park at once; a probe in the background finds it back.
            self._checkpoint("after_primary_failure")
            return self.park(batch, down[0], down[1], timeout=self._calls.deadline)
        try:
            result = self._calls.attempt(attempt, on_writes_pool=on_writes_pool)
        except TimeoutError:
            reason = f"the primary did not answer within {self._calls.budget:g}s"
            code: str | None = "deadline"
            self._outage.lost(reason, code)
        except BackendUnavailable as exc:
            reason, code = str(exc), exc.code
            if exc.node is None:
                self._outage.lost(reason, code)
            # else one node of a distributed database (a Citus worker) is down: only
            # its sessions park; writes of the others keep going to the primary.
        else:
            if result is not None:
                self._stored()
                return result
            reason, code = QUEUED, None
        self._checkpoint("after_primary_failure")
        try:
            return self.park(batch, reason, code, timeout=self._calls.left(started))
        except BackendUnavailable as exc:
            if reason is not QUEUED or not disk_full(exc.__cause__):
                raise
            # Queued behind parked rows, with the primary answering, and the outbox
            # cannot take the batch for lack of space: replay what the session has parked
            # (that frees space and needs none), then the batch goes to the primary.
            self._drain_session(batch.session_id)
            result = self._calls.attempt(attempt, on_writes_pool=on_writes_pool)
            if result is None:
                raise
            self._stored()
            return result

    def _stored(self) -> None:
        self._outage.stored()
        self._checkpoint("after_primary_commit")

    def park(
        self, batch: PreparedBatch, reason: str, code: str | None, *, timeout: float
    ) -> WriteResult:
        """``batch`` into the outbox within ``timeout`` seconds, behind what its session
        has parked; ``BackendUnavailable`` (nothing acknowledged) when it cannot."""

        def park() -> int:
            return self._outbox.park(
                batch.session_id,
                batch.messages,
                batch.session,
                reason=reason,
                error_code=code,
                usage=batch.usage,
            )

        try:
            self._calls.outbox.run(park, timeout=timeout)
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
        self._outage.parked(batch.session_id, reason)
        self._parked()
        return WriteResult(
            session_id=batch.session_id,
            status="parked",
            parked=len(batch.messages),
            reason=reason,
        )


def disk_full(exc: BaseException | None) -> bool:
    """Whether the outbox refused a write for lack of space (SQLite's ``SQLITE_FULL``)."""
    return isinstance(exc, BackendUnavailable) and exc.code == "SQLITE_FULL"
