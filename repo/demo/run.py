"""Running the demo: a fresh SQLite file, the processes, the checks."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from sessionrepo.demo.gateway import GATEWAYS
from sessionrepo.demo.processes import run_processes, sqlite_url
from sessionrepo.demo.report import DemoResult
from sessionrepo.demo.verify import overlap, verify
from sessionrepo.store import schema


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
        url = sqlite_url(path)
        schema.migrate(url)
        reports, outage = run_processes(path, url, outboxes, turns)
        verified = verify(url, reports, outage, outboxes)
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
        overlap=overlap(reports),
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
