"""What the demo reports: each process's report, the checks, the whole result."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


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
