"""The primary as a writer sees it (up, or known down and probed), and the log lines that
say so.

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
    known down, not at all. One that outlasts the writer's deadline (a large backlog) is
    not a failure: it finishes in the background (DEBUG ``search index catch-up still
    running after 5s``) and no other starts meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final

from sessionrepo.outbox.deadline import Calls
from sessionrepo.store import bridge as _aio

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

#: Seconds from a repeating failure's first line to its first summary; then doubling, up
#: to the cap.
_REPEAT_FIRST: Final = 5.0
_REPEAT_CAP: Final = 300.0


class Episode:
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


def describe(exc: BaseException) -> str:
    """A failure in one line: its message's first line (the rest, and the chain, are for
    the DEBUG traceback)."""
    if isinstance(exc, TimeoutError) and not str(exc):
        return "the primary did not answer within the deadline"
    return _first_line(str(exc)) or type(exc).__name__


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0][:500] if lines else ""


class Outage:
    """Whether the primary is known to be down, and the writer's log of it.

    Tripped by a write that failed for an operational reason or missed its deadline
    (:meth:`lost`); while tripped, writes park at once instead of each spending the
    deadline on a primary that cannot answer, and one probe per ``interval`` asks it
    (``ask``, held to the deadline like a write). Closed by the first call that goes
    through (:meth:`answered`: the probe's, or a replay's). The outage, as logged, ends
    only when data is stored again (:meth:`stored`): else a primary that answers probes
    and refuses writes would log both, each second.

    Args:
        ask: one question to the primary, raising when it does not answer.
        interval: seconds between probes.
        calls: where a probe runs on an asyncio driver (a task of the writer's pool).
        closing: set when the writer closes: the probe stops asking.
    """

    def __init__(
        self,
        ask: Callable[[], object],
        *,
        interval: float,
        calls: Calls,
        closing: threading.Event,
    ) -> None:
        self.interval = interval
        self._ask = ask
        self._calls = calls
        self._closing = closing
        self._lock = threading.Lock()
        self._down: tuple[str, str | None] | None = None
        self._prober: threading.Thread | None = None
        self._lost = Episode(
            log,
            logging.WARNING,
            start="primary unavailable: {detail}; writes park in the outbox until it answers",
            repeat="primary still unavailable ({count} times in {seconds:.0f}s): {detail}",
            end="primary answers again after {seconds:.1f}s: writes go to it",
        )
        self._parking = Episode(
            log,
            logging.INFO,
            start="writes park in the outbox (first: session {detail})",
            repeat="still parking: {count} batches in {seconds:.0f}s (last: session {detail})",
        )
        self._replayed = 0  # since the outbox was last found empty
        self._replayed_lock = threading.Lock()

    def down(self) -> tuple[str, str | None] | None:
        """``(reason, code)`` while tripped, else ``None`` (read without the lock)."""
        return self._down

    def lost(self, reason: str, code: str | None) -> None:
        """A write found the primary unavailable: trip, log, and start probing (once)."""
        with self._lock:
            was_closed = self._down is None
            self._down = (f"the primary is unavailable ({reason})", code)
        if not was_closed:
            return
        self._lost.event(reason)
        if self._calls.asynchronous:
            self._calls.primary.submit(self._probe)
        else:  # a thread of its own: the pool's threads are for the writes and replays
            self._prober = threading.Thread(
                target=self._probe, name="sessionrepo-probe", daemon=True
            )
            self._prober.start()

    def _probe(self) -> None:
        # One question per interval until it answers (or a replay goes through).
        while self._down is not None and not self._closing.is_set():
            if self._calls.asynchronous:
                _aio.sleep(self.interval)
            elif self._closing.wait(self.interval):
                return  # closed: nobody waits for the answer
            try:
                self._calls.guarded(self._ask)
            except Exception:
                log.debug("the primary does not answer yet", exc_info=True)
                continue
            self.answered()

    def answered(self) -> None:
        """The primary answered (a probe, a replay): writes try it again."""
        with self._lock:
            was_down, self._down = self._down is not None, None
        if was_down:
            log.debug("the primary answers: writes try it again")

    def stored(self) -> None:
        """Data went to the primary: an outage, if one was logged, is over."""
        self._lost.end()

    def parked(self, session_id: str, reason: str) -> None:
        """A batch went to the outbox."""
        self._parking.event(f"{session_id!r}: {reason}")

    def drained(self, replayed: int, remaining: int | None) -> None:
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

    def join(self, timeout: float) -> None:
        """Wait for the probe thread (closing: its connection goes back to the pool
        before the caller disposes of it)."""
        if self._prober is not None:
            self._prober.join(timeout)
