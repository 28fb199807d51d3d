"""Checking what the demo's gateways wrote, with plain SQL on the files."""

from __future__ import annotations

import itertools
import sqlite3
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine, text

from sessionrepo.demo.report import Check, GatewayReport, OutageReport


@dataclass(frozen=True)
class Verified:
    """What :func:`verify` found: the checks, and the figures the result reports."""

    checks: list[Check]
    stored: int
    sessions: dict[str, int]
    alternations: dict[str, int]
    outbox_left: int


def verify(
    url: str,
    reports: list[GatewayReport],
    outage: OutageReport,
    outboxes: dict[str, Path],
) -> Verified:
    """Check the primary at ``url`` and the outbox files against what the processes
    report they made and were told, with plain SQL (no library code reads the files)."""
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
    return Verified(
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


def overlap(reports: list[GatewayReport]) -> float:
    """Seconds during which every gateway was flushing (0 if they never all were)."""
    firsts = [r.first_flush for r in reports]
    lasts = [r.last_flush for r in reports]
    if None in firsts or None in lasts:
        return 0.0
    return max(0.0, min(x for x in lasts if x) - max(x for x in firsts if x))
