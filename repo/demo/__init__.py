"""What ``sessionrepo demo`` does: real gateway processes flush overlapping transcripts
into one embedded SQLite file, the way an agent gateway does, live through an outage of
that file, recover, and the file is then checked with plain SQL for anything lost or
doubled.

Three gateway processes (``discord``, ``telegram``, ``cli``) start together behind a
barrier and write at the same time:

- every message is an OpenAI-format dict stamped once, when it is made, with
  :func:`sessionrepo.models.ensure_key`;
- after every turn a gateway re-flushes its *whole* in-memory transcript, and also
  flushes mid-turn when the user interrupts, and once more at shutdown and at close;
- ``discord`` and ``telegram`` both write into one shared group-chat session;
- ``discord`` hands a direct-message session over to ``cli``, which loads it back
  from the store (``to_openai(include_key=True)``), re-flushes it, and continues it
  while ``discord`` still re-flushes its stale copy at shutdown;
- every gateway writes through a :class:`~sessionrepo.TranscriptWriter` with its own
  local outbox file beside the primary. Half-way, a fourth process takes the primary's
  write lock (``BEGIN EXCLUSIVE`` on a plain ``sqlite3`` connection): the gateways
  flush only once it holds the lock, for one whole turn each, so every write of that
  turn is parked in the outbox (the busy timeout is short and the deadline one second).
  When every gateway is through that turn the lock is released and each gateway drains
  its outbox, then carries on; at shutdown it drains again and reports what is left.

No process keeps any "already written" bookkeeping: the key alone makes every re-send a
no-op. :func:`run_demo` returns a :class:`DemoResult`; the command line only prints it.
"""

from __future__ import annotations

import itertools
import json
import logging
import multiprocessing
import queue
import shutil
import sqlite3
import tempfile
import time
import traceback
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL

from sessionrepo.models import ensure_key
from sessionrepo.outbox.writer import DrainReport, TranscriptWriter
from sessionrepo.store import schema
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


@dataclass
class GatewayReport:
    """What one gateway process attempted and what the store answered.

    Attributes:
        name: the gateway.
        sent: messages handed to ``append``, re-sends included.
        inserted: keys ``append`` reported as newly stored.
        duplicates: keys ``append`` reported as already stored (skipped).
        conflicts: keys re-sent with different content (must stay 0).
        flushes: number of ``write`` calls per exit path.
        made: per session, the keys of the messages this gateway made, in order.
        first_flush: wall-clock time (epoch seconds) when its first flush began.
        last_flush: wall-clock time when its last flush returned.
        parked_writes: ``write`` calls answered "parked" (the batch went to the outbox).
        parked: messages in the batches parked (the outbox holds a message once, even
            when a re-flush parks it again while it waits).
        parked_keys: per session, the distinct keys this gateway had parked.
        outage_writes: ``write`` calls made while the primary was locked.
        outage_parked: of those, the ones answered "parked".
        outage_first: wall-clock time when its first flush during the outage began.
        outage_last: wall-clock time when its last flush during the outage returned.
        drained: parked messages the drains removed from the outbox (replayed,
            already stored, or conflicting).
        replayed: of those, the ones the primary stored on replay.
        drain_conflicts: of those, the ones whose key the primary had with other content.
        outbox_left: messages still in its outbox at the end (dead ones included).
        logged: what its writer logged (``"warning: primary unavailable: ..."``), kept
            for the report instead of going to the terminal, where the outage's
            expected warnings would read as errors of the demo.
        error: the traceback, if the process failed.
    """

    name: str
    sent: int = 0
    inserted: int = 0
    duplicates: int = 0
    conflicts: int = 0
    flushes: dict[str, int] = field(default_factory=dict)
    made: dict[str, list[str]] = field(default_factory=dict)
    first_flush: float | None = None
    last_flush: float | None = None
    parked_writes: int = 0
    parked: int = 0
    parked_keys: dict[str, list[str]] = field(default_factory=dict)
    outage_writes: int = 0
    outage_parked: int = 0
    outage_first: float | None = None
    outage_last: float | None = None
    drained: int = 0
    replayed: int = 0
    drain_conflicts: int = 0
    outbox_left: int | None = None
    logged: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def made_count(self) -> int:
        return sum(len(keys) for keys in self.made.values())


@dataclass
class OutageReport:
    """What the process that locked the primary did.

    Attributes:
        locked_at: wall-clock time (epoch seconds) when it held the write lock.
        released_at: wall-clock time when it had released it.
        error: the traceback, if the process failed.
    """

    name: str = "outage"
    locked_at: float | None = None
    released_at: float | None = None
    error: str | None = None

    @property
    def seconds(self) -> float:
        if self.locked_at is None or self.released_at is None:
            return 0.0
        return self.released_at - self.locked_at


@dataclass(frozen=True)
class Check:
    """One verification run against the database."""

    name: str
    ok: bool
    detail: str


@dataclass
class DemoResult:
    """The outcome of :func:`run_demo`.

    Attributes:
        path: the SQLite file the gateways wrote.
        kept: whether the file is still there (``False`` for the default temporary one).
        gateways: each process's report.
        attempted: messages sent, re-sends included, over all processes.
        made: distinct messages made (distinct keys).
        stored: rows in ``messages``.
        skipped: sends the store reported as duplicates.
        sessions: rows in ``messages`` per session.
        alternations: per session written by several gateways, how often consecutive
            rows (by ``seq``) come from different gateways.
        overlap: seconds during which all gateways were flushing (0 if they never were
            all at it at once).
        outage: what the process that locked the primary did.
        parked_writes: ``write`` calls answered "parked", over all gateways.
        drained: parked messages the drains removed from the outboxes.
        outbox_left: rows left in the outbox files, counted with plain SQL.
        outboxes: each gateway's outbox file.
        checks: the verifications, run with plain SQL on the files.
        seconds: wall time of the whole run.
    """

    path: Path
    kept: bool
    gateways: list[GatewayReport]
    attempted: int
    made: int
    stored: int
    skipped: int
    sessions: dict[str, int]
    alternations: dict[str, int]
    overlap: float
    outage: OutageReport
    parked_writes: int
    drained: int
    outbox_left: int
    outboxes: dict[str, Path]
    checks: list[Check]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)


def run_demo(path: Path | None = None, *, turns: int = 20) -> DemoResult:
    """Run the gateway processes and the outage against a fresh SQLite file; verify it.

    Args:
        path: the SQLite file to create (it must not exist yet); the gateways' outbox
            files are created beside it. By default a temporary directory, removed
            afterwards.
        turns: conversation turns per session and gateway (at least 2).

    Raises:
        FileExistsError: ``path`` or one of the outbox files already exists.
        ValueError: ``turns`` is below 2.
        RepoError: the database could not be created.
    """
    if turns < 2:
        raise ValueError("turns: at least 2 (the hand-over happens half-way)")
    started = time.monotonic()
    scratch = None
    if path is None:
        scratch = Path(tempfile.mkdtemp(prefix="sessionrepo-demo-"))
        path = scratch / "demo.db"
    outboxes = outbox_paths(path)
    taken = [p for p in (path, *outboxes.values()) if p.exists()]
    if taken:
        raise FileExistsError(f"{taken[0]} already exists: the demo needs fresh files")
    try:
        url = _sqlite_url(path)
        schema.migrate(url)
        reports, outage = _run_processes(path, url, outboxes, turns)
        verified = _verify(url, reports, outage, outboxes)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return DemoResult(
        path=path,
        kept=scratch is None,
        gateways=reports,
        attempted=sum(r.sent for r in reports),
        made=sum(r.made_count for r in reports),
        stored=verified.stored,
        skipped=sum(r.duplicates for r in reports),
        sessions=verified.sessions,
        alternations=verified.alternations,
        overlap=_overlap(reports),
        outage=outage,
        parked_writes=sum(r.parked_writes for r in reports),
        drained=sum(r.drained for r in reports),
        outbox_left=verified.outbox_left,
        outboxes=outboxes,
        checks=verified.checks,
        seconds=time.monotonic() - started,
    )


def outbox_paths(path: Path) -> dict[str, Path]:
    """Each gateway's local outbox file, beside the primary ``path``."""
    return {name: path.with_name(f"{path.stem}.outbox-{name}.db") for name in GATEWAYS}


def _sqlite_url(path: Path) -> str:
    return URL.create("sqlite+pysqlite", database=str(path.resolve())).render_as_string()


# -- the gateway processes ------------------------------------------------------------


class _Gateway:
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

    def outage_begins(self, signals: _Signals) -> None:
        """Wait until the primary is locked: every flush from here on meets the lock."""
        signals.outage_begin.wait(WAIT_SECONDS)
        _wait(signals.locked, "lock on the primary")
        self.in_outage = True

    def outage_ends(self, signals: _Signals) -> None:
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
class _Signals:
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


def _gateway_main(name: str, url: str, outbox_url: str, turns: int, signals: _Signals) -> None:
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
                gateway = _Gateway(name, repository, writer)
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


def _locker_main(path: str, signals: _Signals) -> None:
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


def _discord(gateway: _Gateway, turns: int, signals: _Signals) -> None:
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


def _telegram(gateway: _Gateway, turns: int, signals: _Signals) -> None:
    outage = _outage_turn(turns)
    for number in range(turns):
        if number == outage:
            gateway.outage_begins(signals)
        gateway.turn(TELEGRAM, number)
        gateway.turn(GROUP, 100 + number)
        if number == outage:
            gateway.outage_ends(signals)
    gateway.shutdown()


def _cli(gateway: _Gateway, turns: int, signals: _Signals) -> None:
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


def _context() -> Any:
    """Fresh processes, cheaply: a fork server that imported the library once (where
    the platform has one), else plain spawn."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["sessionrepo.demo"])
        return context
    return multiprocessing.get_context("spawn")


def _run_processes(
    path: Path, url: str, outboxes: dict[str, Path], turns: int
) -> tuple[list[GatewayReport], OutageReport]:
    context = _context()
    reports: Any = context.Queue()
    parties = len(GATEWAYS) + 1  # the locker takes part in every barrier
    signals = _Signals(
        start=context.Barrier(parties),
        handed_over=context.Event(),
        resumed=context.Event(),
        outage_begin=context.Barrier(parties),
        locked=context.Event(),
        outage_end=context.Barrier(parties),
        released=context.Event(),
        reports=reports,
    )
    processes = {
        name: context.Process(
            target=_gateway_main,
            args=(name, url, _sqlite_url(outboxes[name]), turns, signals),
            name=f"gateway-{name}",
        )
        for name in GATEWAYS
    }
    processes["outage"] = context.Process(
        target=_locker_main, args=(str(path.resolve()), signals), name="outage"
    )
    for process in processes.values():
        process.start()
    received: dict[str, GatewayReport | OutageReport] = {}
    deadline = time.monotonic() + 2 * WAIT_SECONDS
    try:
        while len(received) < len(processes) and time.monotonic() < deadline:
            try:
                report: GatewayReport | OutageReport = reports.get(timeout=0.5)
            except queue.Empty:
                if any(process.is_alive() for process in processes.values()):
                    continue
                try:  # all gone: take what was sent, then stop waiting
                    report = reports.get(timeout=1.0)
                except queue.Empty:
                    break
            received[report.name] = report
    finally:
        everyone = len(received) == len(processes)
        for process in processes.values():
            process.join(timeout=WAIT_SECONDS if everyone else 1.0)
            if process.is_alive():
                process.terminate()
                process.join()
        reports.close()

    def silent(name: str) -> str:
        return f"process exited with code {processes[name].exitcode} without reporting"

    gateways = []
    for name in GATEWAYS:
        got = received.get(name)
        gateways.append(
            got if isinstance(got, GatewayReport) else GatewayReport(name, error=silent(name))
        )
    outage = received.get("outage")
    if not isinstance(outage, OutageReport):
        outage = OutageReport(error=silent("outage"))
    return gateways, outage


# -- verification, with plain SQL on the files ----------------------------------------


@dataclass(frozen=True)
class _Verified:
    checks: list[Check]
    stored: int
    sessions: dict[str, int]
    alternations: dict[str, int]
    outbox_left: int


def _verify(
    url: str,
    reports: list[GatewayReport],
    outage: OutageReport,
    outboxes: dict[str, Path],
) -> _Verified:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT session_id, seq, client_msg_uuid FROM messages ORDER BY session_id, seq"
                )
            ).all()
            doubled = conn.execute(
                text(
                    "SELECT session_id, client_msg_uuid, COUNT(*) FROM messages "
                    "GROUP BY session_id, client_msg_uuid HAVING COUNT(*) > 1"
                )
            ).all()
            counters = conn.execute(
                text(
                    "SELECT s.id, s.message_count, "
                    "(SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id) "
                    "FROM sessions s ORDER BY s.id"
                )
            ).all()
    finally:
        engine.dispose()
    left = {name: _outbox_rows(outbox) for name, outbox in outboxes.items()}

    seq_of = {(sid, uuid.UUID(str(key))): seq for sid, seq, key in rows}
    stored = set(seq_of)
    made = Counter(
        (sid, uuid.UUID(key)) for r in reports for sid, keys in r.made.items() for key in keys
    )
    checks: list[Check] = []

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append(Check(name, ok, detail))

    processes: list[GatewayReport | OutageReport] = [*reports, outage]
    failed = [r.name for r in processes if r.error is not None]
    check(
        "every process ran to its end",
        not failed,
        f"{len(reports)} gateways and the outage" if not failed else f"failed: {', '.join(failed)}",
    )
    check(
        "the outage parked every write made while the primary was locked",
        all(0 < r.outage_parked == r.outage_writes for r in reports),
        ", ".join(f"{r.name} {r.outage_parked} of {r.outage_writes}" for r in reports)
        + ("" if any(r.outage_parked for r in reports) else ": the demo showed no outage"),
    )
    inside = [
        r.name
        for r in reports
        if None in (outage.locked_at, outage.released_at, r.outage_first, r.outage_last)
        or not (outage.locked_at or 0) <= (r.outage_first or 0)
        or not (r.outage_last or 0) <= (outage.released_at or 0)
    ]
    check(
        "the lock was held through every gateway's outage flushes",
        not inside,
        f"held {outage.seconds:.2f} s" if not inside else f"not for {', '.join(inside)}",
    )
    parked_keys = {
        (sid, uuid.UUID(key))
        for r in reports
        for sid, keys in r.parked_keys.items()
        for key in keys
    }
    undrained = [
        r.name
        for r in reports
        if r.parked_writes
        and (
            r.drained == 0
            or any(
                (sid, uuid.UUID(k)) not in stored for sid, ks in r.parked_keys.items() for k in ks
            )
        )
    ]
    check(
        "every parked message was drained into the primary",
        not undrained and bool(parked_keys),
        f"{len(parked_keys)} distinct messages parked, all stored; "
        f"{sum(r.drained for r in reports)} drained"
        if not undrained and parked_keys
        else f"not in {', '.join(undrained) or 'any gateway: nothing was parked'}",
    )
    check(
        "every outbox is empty (rows counted in each outbox file)",
        all(n == 0 for n in left.values()) and all(r.outbox_left == 0 for r in reports),
        ", ".join(f"{name} {'?' if n is None else n}" for name, n in left.items()),
    )
    check(
        "rows stored == distinct messages made",
        len(rows) == len(made) and all(n == 1 for n in made.values()),
        f"{len(rows)} rows, {len(made)} keys made",
    )
    check(
        "no (session_id, client_msg_uuid) stored twice",
        not doubled and len(stored) == len(rows),
        f"{len(doubled)} doubled",
    )
    lost = set(made) - stored
    unknown = stored - set(made)
    check(
        "every message made is stored, and nothing else",
        not lost and not unknown,
        f"{len(lost)} lost, {len(unknown)} unexpected",
    )
    per_session: dict[str, list[int]] = {}
    for sid, seq, _ in rows:
        per_session.setdefault(sid, []).append(seq)
    gaps = [sid for sid, seqs in per_session.items() if seqs != list(range(1, len(seqs) + 1))]
    check(
        "each session's seq is 1..n",
        not gaps,
        f"{len(per_session)} sessions" if not gaps else f"broken in {', '.join(gaps)}",
    )
    disordered = [
        f"{r.name} in {sid}"
        for r in reports
        for sid, keys in r.made.items()
        if not _increasing([seq_of.get((sid, uuid.UUID(key)), -1) for key in keys])
    ]
    check(
        "each writer's messages are in the order it made them",
        not disordered,
        f"{sum(len(r.made) for r in reports)} writer/session pairs"
        if not disordered
        else f"out of order: {', '.join(disordered)}",
    )
    inserted = sum(r.inserted + r.replayed for r in reports)
    sent = sum(r.sent for r in reports)
    answered = sum(r.inserted + r.duplicates + r.conflicts + r.parked for r in reports)
    conflicts = sum(r.conflicts + r.drain_conflicts for r in reports)
    check(
        "write results add up: each row inserted once (directly or by a drain), the rest skipped",
        inserted == len(rows) and answered == sent and conflicts == 0,
        f"{inserted} inserted, {sent - inserted} skipped or parked, {conflicts} conflicts",
    )
    wrong = [sid for sid, count, actual in counters if count != actual]
    check(
        "session message counters match the rows",
        not wrong and len(counters) == len(per_session),
        f"{len(counters)} sessions" if not wrong else f"wrong in {', '.join(wrong)}",
    )
    writer_of = {
        (sid, uuid.UUID(key)): r.name
        for r in reports
        for sid, keys in r.made.items()
        for key in keys
    }
    alternations: dict[str, int] = {}
    for sid in per_session:
        writers = [writer_of.get((s, uuid.UUID(str(key)))) for s, _, key in rows if s == sid]
        if len(set(writers)) > 1:
            alternations[sid] = sum(a != b for a, b in itertools.pairwise(writers))
    return _Verified(
        checks=checks,
        stored=len(rows),
        sessions={sid: len(seqs) for sid, seqs in per_session.items()},
        alternations=alternations,
        outbox_left=sum(n or 0 for n in left.values()),
    )


def _outbox_rows(path: Path) -> int | None:
    """Rows in an outbox file's ``pending_outbox``, dead ones included; ``None`` when
    the file or the table is missing."""
    if not path.exists():
        return None
    connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        count = connection.execute("SELECT COUNT(*) FROM pending_outbox").fetchone()[0]
    except sqlite3.Error:
        return None
    finally:
        connection.close()
    return int(count)


def _increasing(seqs: list[int]) -> bool:
    return all(seq > 0 for seq in seqs) and all(a < b for a, b in itertools.pairwise(seqs))


def _overlap(reports: list[GatewayReport]) -> float:
    firsts = [r.first_flush for r in reports]
    lasts = [r.last_flush for r in reports]
    if None in firsts or None in lasts:
        return 0.0
    return max(0.0, min(x for x in lasts if x) - max(x for x in firsts if x))
