"""The gateway processes of ``ops/test_backup_processes.py``: writers that keep writing
through a :class:`TranscriptWriter` while a backup is taken.

Each writer ``w`` writes batches of :data:`BATCH` messages in pairs: batch ``i`` to
session ``w{w}-a``, and once that is stored, batch ``i`` to ``w{w}-z``. So at any instant
``w{w}-a`` holds as many batches as ``w{w}-z`` or one more: a backup of one instant shows
exactly that; one that read ``-a`` and, later, ``-z`` (filler sessions sort between
them) would find ``-z`` ahead. Runs until ``stop`` is set (or ``limit`` pairs).
"""

from __future__ import annotations

import time
from typing import Any

from sessionrepo import SessionRepository, TranscriptWriter, open_repository

from support.harness import error_text

#: Messages per batch.
BATCH = 3
#: How long a writer waits at the start barrier for the others.
BARRIER_TIMEOUT = 120.0


def write_pairs(*, url: str, worker: int, limit: int, start: Any, stop: Any, results: Any) -> None:
    report: dict[str, Any] = {"worker": worker, "pairs": 0, "parked": 0, "errors": []}
    repository: SessionRepository | None = None
    writer: TranscriptWriter | None = None
    try:
        repository = open_repository(url)
        # A generous deadline: a write is stored, not parked, unless the store is down.
        writer = TranscriptWriter(repository, deadline=30.0)
        start.wait(BARRIER_TIMEOUT)
        for pair in range(limit):
            if stop.is_set():
                break
            for side in ("a", "z"):
                sid = f"w{worker}-{side}"
                batch = [
                    {
                        "role": "user" if n % 2 == 0 else "assistant",
                        "content": f"worker {worker} {side} batch {pair} message {n}",
                    }
                    for n in range(BATCH)
                ]
                done = writer.write(sid, batch, user_id=f"user-{worker}", source="load")
                if done.status != "stored":
                    # Parked: stored by the drain before the pair goes on, so the order
                    # of the two sides holds in the store.
                    report["parked"] += 1
                    while writer.pending(sid):
                        writer.drain(session_id=sid, ignore_backoff=True)
                        time.sleep(0.05)
            report["pairs"] = pair + 1
    except BaseException as exc:
        report["errors"].append(error_text(f"worker {worker}", exc))
    finally:
        if writer is not None:
            writer.close()
        if repository is not None:
            repository.close()
        results.put(report)
