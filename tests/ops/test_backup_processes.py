"""The issue's Done-when: a backup taken during a 4-writer load (four gateway processes
writing through ``TranscriptWriter``) restores into the other backend with every
session's checksum equal to the source's as of the snapshot.

That the snapshot is one instant is shown by the writers' pairs (see
:mod:`support.backup_workers`): each writer's ``-a`` session is written a batch ahead of
its ``-z`` one, and 100 static sessions sort between the two, so a backup that read each
session as it came to it would find ``-z`` ahead of ``-a``. In the backup every batch is
there whole or not at all, ``-a`` holds as many batches as ``-z`` or one more, and each
session is a prefix of what the source holds once the writers stop: what they wrote
after the instant is absent.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from sessionrepo import SessionRepository, open_repository
from sessionrepo.ops import Selection
from sessionrepo.ops.backup import backup_store, message_line, restore_backup

from support.backup_workers import BATCH, write_pairs
from support.harness import SPAWN, children, collect_reports
from support.polling import eventually

WRITERS = 4
#: Empty sessions between each writer's -a and -z (by id): reading them takes the
#: time in which the writers write more pairs.
FILLERS = 100


def _counts(repository: SessionRepository) -> dict[str, int]:
    return {
        s.session.id: s.session.message_count
        for s in repository.session_snapshots(Selection(source="load"), limit=1000)
    }


def _all_writing(repository: SessionRepository) -> bool:
    counts = _counts(repository)
    return len(counts) == 2 * WRITERS and min(counts.values()) >= 5 * BATCH


def _digest(messages: list[Any]) -> str:
    return hashlib.sha256(b"".join(message_line(m) for m in messages)).hexdigest()


def test_a_backup_during_a_four_writer_load_restores_into_the_other_backend_equal(
    database_url: str, other_url: str, tmp_path: Path
) -> None:
    source = open_repository(database_url)
    for worker in range(WRITERS):
        for n in range(FILLERS):
            source.create_session(f"w{worker}-f{n:03}", source="filler")
    path = tmp_path / "load.backup"
    start, stop, results = SPAWN.Event(), SPAWN.Event(), SPAWN.Queue()
    with children() as processes:
        for worker in range(WRITERS):
            process = SPAWN.Process(
                target=write_pairs,
                kwargs={
                    "url": database_url,
                    "worker": worker,
                    "limit": 5000,
                    "start": start,
                    "stop": stop,
                    "results": results,
                },
            )
            process.start()
            processes.append(process)
        start.set()
        try:
            # Every writer has written a few pairs: the load is on.
            eventually(lambda: _all_writing(source), "all four writers writing", timeout=120)
            before = sum(_counts(source).values())
            report = backup_store(source, path)
            after = sum(_counts(source).values())
            time.sleep(0.2)  # and they go on writing after it
        finally:
            stop.set()
        reports = collect_reports(results, WRITERS, processes)
    assert [r["errors"] for r in reports] == [[]] * WRITERS
    assert after > before, "the writers wrote while the backup was taken"

    held = _backed_up(path)
    final = {sid: source.load_transcript(sid, include_retracted=True) for sid in held}
    for worker in range(WRITERS):
        a, z = len(held[f"w{worker}-a"]), len(held[f"w{worker}-z"])
        assert a % BATCH == 0, "a batch half in the backup"
        assert z % BATCH == 0, "a batch half in the backup"
        assert a - z in (0, BATCH), f"writer {worker}: -a {a}, -z {z}: not one instant"
    for sid, lines in held.items():
        # The backup holds the source's session as of the instant: a prefix of what it
        # holds now, byte for byte; what came after is absent.
        assert lines == [message_line(m) for m in final[sid][: len(lines)]], sid
    grew = [sid for sid in held if len(final[sid]) > len(held[sid])]
    assert grew, "nothing was written after the snapshot: it proved nothing"
    assert report.messages == sum(len(lines) for lines in held.values())

    target = open_repository(other_url)
    try:
        restored = restore_backup(target, path)
        assert restored.verified, restored.mismatches
        assert restored.sessions_restored == report.sessions == len(held)
        assert restored.messages_inserted == report.messages
        for sid, lines in held.items():
            as_of_snapshot = _digest(final[sid][: len(lines)])
            there = target.load_transcript(sid, include_retracted=True)
            assert _digest(there) == as_of_snapshot == _file_checksum(path, sid), sid
    finally:
        target.close()
        source.close()


def _backed_up(path: Path) -> dict[str, list[bytes]]:
    """Each session's message lines in the backup file."""
    held: dict[str, list[bytes]] = {}
    for line in path.read_bytes().splitlines(keepends=True):
        record = json.loads(line)
        if record["type"] == "session":
            held[record["session"]["id"]] = []
        elif record["type"] == "message":
            held[record["session_id"]].append(line)
    return held


def _file_checksum(path: Path, sid: str) -> str:
    for line in path.read_bytes().splitlines():
        record = json.loads(line)
        if record["type"] == "checksum" and record["session_id"] == sid:
            return str(record["sha256"])
    raise AssertionError(f"no checksum record for {sid}")
