"""The demo's processes: three agent gateways with a gateway's persistence habits, and
the process that takes the primary's write lock for the outage. Each is the entry point
of a process :mod:`.processes` starts; each reports back through :class:`Signals`."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
import traceback
from dataclasses import dataclass
from typing import Any, Final

from sessionrepo.demo.report import GatewayReport, OutageReport
from sessionrepo.models import ensure_key
from sessionrepo.outbox.writer import DrainReport, TranscriptWriter
from sessionrepo.store.repository import SessionRepository, open_repository

#: Seconds a process waits for a peer (or the parent for a report) before giving up, so
#: a crashed process fails the demo instead of hanging it.
WAIT_SECONDS: Final = 60.0

DIRECT: Final = "discord:dm-alice"  # written by discord, then resumed by cli
GROUP: Final = "discord:guild-42-general"  # bridged: discord and telegram both write it
TELEGRAM: Final = "telegram:chat-bob"
CLI: Final = "cli:dave"

#: The gateway processes, in the order they are started.
GATEWAYS: Final = ("discord", "telegram", "cli")

#: Flush paths, in the order the summary shows them.
EXIT_PATHS: Final = ("end of turn", "interrupt", "resume", "shutdown", "close")

#: Seconds a gateway's primary waits on a held write lock before it reports "locked"...
BUSY_TIMEOUT: Final = 0.5
#: ...well within the writer's deadline, so a write during the outage is parked at once.
DEADLINE: Final = 1.0
#: Drain rounds a gateway tries before it reports what is still left in its outbox.
DRAIN_ROUNDS: Final = 50


class Gateway:
    """An agent gateway's persistence habits, minus everything else."""

    def __init__(self, name: str, repository: SessionRepository, writer: TranscriptWriter) -> None:
        self.name = name
        self.repository = repository
        self.writer = writer
        self.transcripts: dict[str, list[dict[str, Any]]] = {}
        self.report = GatewayReport(name=name)
        self.in_outage = False

    def make(self, session_id: str, message: dict[str, Any]) -> None:
        """A new message: stamped with its key once, here, and kept in memory."""
        key = ensure_key(message)
        self.transcripts.setdefault(session_id, []).append(message)
        self.report.made.setdefault(session_id, []).append(str(key))

    def resume(self, session_id: str) -> None:
        """Load a transcript someone else wrote and carry on from it."""
        stored = self.repository.load_transcript(session_id)
        self.transcripts[session_id] = [m.to_openai(include_key=True) for m in stored]
        self.flush(session_id, "resume")

    def flush(self, session_id: str, path: str) -> None:
        """Re-send the whole in-memory transcript: no "already written" bookkeeping."""
        transcript = self.transcripts[session_id]
        report = self.report
        began = time.time()
        if report.first_flush is None:
            report.first_flush = began
        if self.in_outage and report.outage_first is None:
            report.outage_first = began
        result = self.writer.write(session_id, transcript, source=self.name)
        report.last_flush = time.time()
        report.sent += len(transcript)
        report.inserted += len(result.inserted)
        report.duplicates += len(result.duplicates)
        report.conflicts += len(result.conflicts)
        report.flushes[path] = report.flushes.get(path, 0) + 1
        parked = result.status == "parked"
        report.parked_writes += parked
        report.parked += result.parked
        if parked:
            keys = report.parked_keys.setdefault(session_id, [])
            keys.extend(k for k in (str(m["client_msg_uuid"]) for m in transcript) if k not in keys)
        if self.in_outage:
            report.outage_writes += 1
            report.outage_parked += parked
            report.outage_last = report.last_flush

    def turn(self, session_id: str, number: int) -> None:
        """One exchange: user, tool call, tool result, answer; flushed at its end, and
        mid-turn too when the user interrupts (every third turn)."""
        call_id = f"call_{self.name}_{session_id.rsplit(':', 1)[-1]}_{number}"
        # Equal content on purpose every other turn: identity is the key, not the text.
        question = "thanks!" if number % 2 else f"{self.name}: question {number}?"
        self.make(session_id, {"role": "user", "content": question})
        self.make(
            session_id,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "lookup", "arguments": json.dumps({"n": number})},
                    }
                ],
            },
        )
        self.make(session_id, {"role": "tool", "tool_call_id": call_id, "content": "42"})
        if number % 3 == 2:
            self.flush(session_id, "interrupt")
        self.make(
            session_id,
            {"role": "assistant", "content": f"answer {number}", "refusal": None},
        )
        self.flush(session_id, "end of turn")

    def outage_begins(self, signals: Signals) -> None:
        """Wait until the primary is locked: every flush from here on meets the lock."""
        signals.outage_begin.wait(WAIT_SECONDS)
        _wait(signals.locked, "lock on the primary")
        self.in_outage = True

    def outage_ends(self, signals: Signals) -> None:
        """Let the lock go once every gateway is through its outage turn; recover."""
        self.in_outage = False
        signals.outage_end.wait(WAIT_SECONDS)
        _wait(signals.released, "release of the primary")
        self.recover()

    def recover(self) -> None:
        """Drain the outbox until it is empty (or the rounds run out)."""
        for _ in range(DRAIN_ROUNDS):
            if not self.writer.pending():
                return
            self._count(self.writer.drain(ignore_backoff=True))
            # A lost race for the write lock (busy timeout): try again a moment later.
            time.sleep(0.05)

    def _count(self, drained: DrainReport) -> None:
        self.report.drained += drained.replayed + drained.duplicates + drained.conflicts
        self.report.replayed += drained.replayed
        self.report.drain_conflicts += drained.conflicts

    def shutdown(self) -> None:
        for path in ("shutdown", "close"):  # both exit paths fire on a real shutdown
            for session_id in self.transcripts:
                self.flush(session_id, path)
        self.recover()
        self.report.outbox_left = self.writer.pending() + self.writer.status().dead


@dataclass(frozen=True)
class Signals:
    """What the processes share (multiprocessing objects, handed over at start)."""

    start: Any  # Barrier: nobody writes before everybody is ready
    handed_over: Any  # Event: discord is done with the direct-message session
    resumed: Any  # Event: cli has loaded that session back and flushed it
    outage_begin: Any  # Barrier: every gateway is at its outage turn, the locker too
    locked: Any  # Event: the locker holds the primary's write lock
    outage_end: Any  # Barrier: every gateway has flushed its outage turn
    released: Any  # Event: the locker has released the lock
    reports: Any  # Queue of GatewayReport / OutageReport, one per process

    def abort(self) -> None:
        """Release every peer at once: nobody must wait WAIT_SECONDS for a dead one."""
        for barrier in (self.start, self.outage_begin, self.outage_end):
            barrier.abort()
        for event in (self.handed_over, self.resumed, self.locked, self.released):
            event.set()


def gateway_main(name: str, url: str, outbox_url: str, turns: int, signals: Signals) -> None:
    """Entry point of one gateway process: runs its script, reports back."""
    report = GatewayReport(name=name)
    logged: list[str] = []
    _keep_log(logged)
    try:
        # attempts=1: a held lock is reported after the busy timeout, not retried.
        with open_repository(
            url, auto_migrate=False, busy_timeout=BUSY_TIMEOUT, attempts=1
        ) as repository:
            writer = TranscriptWriter(repository, outbox_url=outbox_url, deadline=DEADLINE)
            try:
                gateway = Gateway(name, repository, writer)
                report = gateway.report
                signals.start.wait(WAIT_SECONDS)
                _SCRIPTS[name](gateway, turns, signals)
            finally:
                writer.close()
    except BaseException:
        report.error = traceback.format_exc()
        signals.abort()
    report.logged = logged
    signals.reports.put(report)


class _KeepLog(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname.lower()}: {record.getMessage()}")


def _keep_log(lines: list[str]) -> None:
    """This process's sessionrepo log lines (INFO and up) into ``lines``, not onto the
    terminal: with a handler of its own, the logger's records no longer reach Python's
    last-resort handler on stderr."""
    logger = logging.getLogger("sessionrepo")
    logger.setLevel(logging.INFO)
    logger.addHandler(_KeepLog(lines))


def locker_main(path: str, signals: Signals) -> None:
    """Entry point of the outage process: holds the primary's write lock while every
    gateway flushes one turn, then lets it go."""
    report = OutageReport()
    try:
        # A plain connection: no library code, the way another program would lock it.
        connection = sqlite3.connect(path, timeout=WAIT_SECONDS, isolation_level=None)
        try:
            signals.start.wait(WAIT_SECONDS)
            signals.outage_begin.wait(WAIT_SECONDS)
            connection.execute("BEGIN EXCLUSIVE")
            report.locked_at = time.time()
            signals.locked.set()
            signals.outage_end.wait(WAIT_SECONDS)
            connection.execute("ROLLBACK")
            report.released_at = time.time()
            signals.released.set()
        finally:
            connection.close()
    except BaseException:
        report.error = traceback.format_exc()
        signals.abort()
    signals.reports.put(report)


def _wait(event: Any, what: str) -> None:
    if not event.wait(WAIT_SECONDS):
        raise TimeoutError(f"no {what} within {WAIT_SECONDS:.0f} s")


def _outage_turn(turns: int) -> int:
    """The turn flushed while the primary is locked: the last one before the hand-over,
    so discord has drained the direct-message session before cli loads it back."""
    return turns // 2 - 1


def _discord(gateway: Gateway, turns: int, signals: Signals) -> None:
    half, outage = turns // 2, _outage_turn(turns)
    for number in range(turns):
        if number == outage:
            gateway.outage_begins(signals)
        if number < half:
            gateway.turn(DIRECT, number)
        elif number == half:
            gateway.recover()  # nothing of it may wait in the outbox when cli loads it
            signals.handed_over.set()  # the user moves to the CLI; discord's copy goes stale
        gateway.turn(GROUP, number)
        if number == outage:
            gateway.outage_ends(signals)
    # Shut down while cli is writing the session: the stale copy is flushed again.
    _wait(signals.resumed, "resume by cli")
    gateway.shutdown()


def _telegram(gateway: Gateway, turns: int, signals: Signals) -> None:
    outage = _outage_turn(turns)
    for number in range(turns):
        if number == outage:
            gateway.outage_begins(signals)
        gateway.turn(TELEGRAM, number)
        gateway.turn(GROUP, 100 + number)
        if number == outage:
            gateway.outage_ends(signals)
    gateway.shutdown()


def _cli(gateway: Gateway, turns: int, signals: Signals) -> None:
    half, outage = turns // 2, _outage_turn(turns)
    for number in range(turns):
        if number == outage:
            gateway.outage_begins(signals)
        if number == half:
            _wait(signals.handed_over, "hand-over by discord")
            gateway.resume(DIRECT)
            signals.resumed.set()
        if number >= half:
            gateway.turn(DIRECT, 100 + number)
        gateway.turn(CLI, number)
        if number == outage:
            gateway.outage_ends(signals)
    gateway.shutdown()


_SCRIPTS: Final = {"discord": _discord, "telegram": _telegram, "cli": _cli}
