"""What ``sessionrepo demo`` does: real gateway processes flush overlapping transcripts
into one embedded SQLite file, the way an agent gateway does, and the file is then
checked with plain SQL for anything lost or doubled.

Three gateway processes (``discord``, ``telegram``, ``cli``) start together behind a
barrier and write at the same time:

- every message is an OpenAI-format dict stamped once, when it is made, with
  :func:`models.ensure_key`;
- after every turn a gateway re-flushes its *whole* in-memory transcript, and also
  flushes mid-turn when the user interrupts, and once more at shutdown and at close;
- ``discord`` and ``telegram`` both write into one shared group-chat session;
- ``discord`` hands a direct-message session over to ``cli``, which loads it back
  from the store (``to_openai(include_key=True)``), re-flushes it, and continues it
  while ``discord`` still re-flushes its stale copy at shutdown.

No process keeps any "already written" bookkeeping: the key alone makes every re-send a
no-op. :func:`run_demo` returns a :class:`DemoResult`; the command line only prints it.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import queue
import shutil
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

from models import ensure_key
from repo import schema
from repo._database import Database
from repo.repository import SessionRepository, open_repository

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


@dataclass
class GatewayReport:
    """What one gateway process attempted and what the store answered.

    Attributes:
        name: the gateway.
        sent: messages handed to ``append``, re-sends included.
        inserted: keys ``append`` reported as newly stored.
        duplicates: keys ``append`` reported as already stored (skipped).
        conflicts: keys re-sent with different content (must stay 0).
        flushes: number of ``append`` calls per exit path.
        made: per session, the keys of the messages this gateway made, in order.
        first_flush: wall-clock time (epoch seconds) when its first flush began.
        last_flush: wall-clock time when its last flush returned.
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
    error: str | None = None

    @property
    def made_count(self) -> int:
        return sum(len(keys) for keys in self.made.values())


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
        checks: the verifications, run with plain SQL on the file.
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
    checks: list[Check]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)


def run_demo(path: Path | None = None, *, turns: int = 20) -> DemoResult:
    """Run the three gateway processes against a fresh SQLite file and verify it.

    Args:
        path: the SQLite file to create (it must not exist yet); by default a file in a
            temporary directory that is removed afterwards.
        turns: conversation turns per session and gateway (at least 2).

    Raises:
        FileExistsError: ``path`` already exists.
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
    elif path.exists():
        raise FileExistsError(f"{path} already exists: the demo needs a fresh file")
    try:
        url = URL.create("sqlite+pysqlite", database=str(path.resolve())).render_as_string()
        database = Database(url)
        try:
            schema.upgrade(database)
        finally:
            database.dispose()
        reports = _run_gateways(url, turns)
        checks, stored, sessions, alternations = _verify(url, reports)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return DemoResult(
        path=path,
        kept=scratch is None,
        gateways=reports,
        attempted=sum(r.sent for r in reports),
        made=sum(r.made_count for r in reports),
        stored=stored,
        skipped=sum(r.duplicates for r in reports),
        sessions=sessions,
        alternations=alternations,
        overlap=_overlap(reports),
        checks=checks,
        seconds=time.monotonic() - started,
    )


# -- the gateway processes ------------------------------------------------------------


class _Gateway:
    """An agent gateway's persistence habits, minus everything else."""

    def __init__(self, name: str, repository: SessionRepository) -> None:
        self.name = name
        self.repository = repository
        self.transcripts: dict[str, list[dict[str, Any]]] = {}
        self.report = GatewayReport(name=name)

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
        if report.first_flush is None:
            report.first_flush = time.time()
        result = self.repository.append(session_id, transcript, source=self.name)
        report.last_flush = time.time()
        report.sent += len(transcript)
        report.inserted += len(result.inserted)
        report.duplicates += len(result.duplicates)
        report.conflicts += len(result.conflicts)
        report.flushes[path] = report.flushes.get(path, 0) + 1

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

    def shutdown(self) -> None:
        for path in ("shutdown", "close"):  # both exit paths fire on a real shutdown
            for session_id in self.transcripts:
                self.flush(session_id, path)


@dataclass(frozen=True)
class _Signals:
    """What the processes share (multiprocessing objects, handed over at spawn)."""

    start: Any  # Barrier: nobody writes before everybody is ready
    handed_over: Any  # Event: discord is done with the direct-message session
    resumed: Any  # Event: cli has loaded that session back and flushed it
    reports: Any  # Queue of GatewayReport, one per process


def _gateway_main(name: str, url: str, turns: int, signals: _Signals) -> None:
    """Entry point of one gateway process (spawned): runs its script, reports back."""
    report = GatewayReport(name=name)
    try:
        with open_repository(url, auto_migrate=False) as repository:
            gateway = _Gateway(name, repository)
            report = gateway.report
            signals.start.wait(WAIT_SECONDS)
            _SCRIPTS[name](gateway, turns, signals.handed_over, signals.resumed)
    except BaseException:
        report.error = traceback.format_exc()
        # Release the peers at once: they must not wait WAIT_SECONDS for us.
        signals.start.abort()
        signals.handed_over.set()
        signals.resumed.set()
    signals.reports.put(report)


def _wait(event: Any, what: str) -> None:
    if not event.wait(WAIT_SECONDS):
        raise TimeoutError(f"no {what} within {WAIT_SECONDS:.0f} s")


def _discord(gateway: _Gateway, turns: int, handed_over: Any, resumed: Any) -> None:
    half = turns // 2
    for number in range(turns):
        if number < half:
            gateway.turn(DIRECT, number)
        elif number == half:
            handed_over.set()  # the user moves to the CLI; discord's copy goes stale
        gateway.turn(GROUP, number)
    # Shut down while cli is writing the session: the stale copy is flushed again.
    _wait(resumed, "resume by cli")
    gateway.shutdown()


def _telegram(gateway: _Gateway, turns: int, handed_over: Any, resumed: Any) -> None:
    for number in range(turns):
        gateway.turn(TELEGRAM, number)
        gateway.turn(GROUP, 100 + number)
    gateway.shutdown()


def _cli(gateway: _Gateway, turns: int, handed_over: Any, resumed: Any) -> None:
    half = turns // 2
    for number in range(turns):
        if number == half:
            _wait(handed_over, "hand-over by discord")
            gateway.resume(DIRECT)
            resumed.set()
        if number >= half:
            gateway.turn(DIRECT, 100 + number)
        gateway.turn(CLI, number)
    gateway.shutdown()


_SCRIPTS: Final = {"discord": _discord, "telegram": _telegram, "cli": _cli}


def _run_gateways(url: str, turns: int) -> list[GatewayReport]:
    context = multiprocessing.get_context("spawn")
    reports: Any = context.Queue()
    signals = _Signals(
        start=context.Barrier(len(GATEWAYS)),
        handed_over=context.Event(),
        resumed=context.Event(),
        reports=reports,
    )
    processes = [
        context.Process(
            target=_gateway_main,
            args=(name, url, turns, signals),
            name=f"gateway-{name}",
        )
        for name in GATEWAYS
    ]
    for process in processes:
        process.start()
    received: dict[str, GatewayReport] = {}
    deadline = time.monotonic() + 2 * WAIT_SECONDS
    try:
        while len(received) < len(processes) and time.monotonic() < deadline:
            try:
                report: GatewayReport = reports.get(timeout=0.5)
            except queue.Empty:
                if any(process.is_alive() for process in processes):
                    continue
                try:  # all gone: take what was sent, then stop waiting
                    report = reports.get(timeout=1.0)
                except queue.Empty:
                    break
            received[report.name] = report
    finally:
        for process in processes:
            process.join(timeout=WAIT_SECONDS if len(received) == len(processes) else 1.0)
            if process.is_alive():
                process.terminate()
                process.join()
        reports.close()
    return [
        received.get(name)
        or GatewayReport(
            name=name,
            error=f"process exited with code {process.exitcode} without reporting",
        )
        for name, process in zip(GATEWAYS, processes, strict=True)
    ]


# -- verification, with plain SQL on the file -----------------------------------------


def _verify(
    url: str, reports: list[GatewayReport]
) -> tuple[list[Check], int, dict[str, int], dict[str, int]]:
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

    seq_of = {(sid, uuid.UUID(str(key))): seq for sid, seq, key in rows}
    stored = set(seq_of)
    made = Counter(
        (sid, uuid.UUID(key)) for r in reports for sid, keys in r.made.items() for key in keys
    )
    checks: list[Check] = []

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append(Check(name, ok, detail))

    failed = [r.name for r in reports if r.error is not None]
    check(
        "every gateway process ran to its end",
        not failed,
        f"{len(reports)} processes" if not failed else f"failed: {', '.join(failed)}",
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
    inserted = sum(r.inserted for r in reports)
    sent = sum(r.sent for r in reports)
    answered = sum(r.inserted + r.duplicates + r.conflicts for r in reports)
    conflicts = sum(r.conflicts for r in reports)
    check(
        "append results add up: each row inserted once, the rest skipped",
        inserted == len(rows) and answered == sent and conflicts == 0,
        f"{inserted} inserted, {sent - inserted} skipped, {conflicts} conflicts",
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
    sizes = {sid: len(seqs) for sid, seqs in per_session.items()}
    return checks, len(rows), sizes, alternations


def _increasing(seqs: list[int]) -> bool:
    return all(seq > 0 for seq in seqs) and all(a < b for a, b in itertools.pairwise(seqs))


def _overlap(reports: list[GatewayReport]) -> float:
    firsts = [r.first_flush for r in reports]
    lasts = [r.last_flush for r in reports]
    if None in firsts or None in lasts:
        return 0.0
    return max(0.0, min(x for x in lasts if x) - max(x for x in firsts if x))
