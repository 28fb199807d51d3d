"""Erasure across processes, and down to the bytes of SQLite's files.

A gateway's outbox is a SQLite file of its own that an erasure in another process cannot
reach: its parked copies are stopped at the primary by the tombstones when it drains.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from sessionrepo import (
    Message,
    NotFound,
    Session,
    SessionRepository,
    TranscriptWriter,
    open_repository,
)
from sessionrepo.models.message import utcnow
from sessionrepo.ops import prune_sessions
from sessionrepo.ops.erase import scan_file, verify_erased
from sessionrepo.outbox.opening import open_outbox_database
from sessionrepo.outbox.table import Outbox

SESSIONREPO = str(Path(sys.executable).with_name("sessionrepo"))
SECRET_STORED = "stored-narwhal-secret"
SECRET_PARKED = "parked-ocelot-secret"
SECRET_OLD = "pruned-gecko-secret"
SECRET_LATE = "late-axolotl-secret"


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SESSIONREPO, "--url", url, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def _park(path: Path, session_id: str, messages: list[Message]) -> None:
    outbox = Outbox(open_outbox_database(f"sqlite:///{path}"))
    try:
        outbox.park(
            session_id, messages, Session(id=session_id, user_id="alice"), reason="primary down"
        )
    finally:
        outbox.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)
def test_parked_copies_in_two_gateways_outboxes_are_not_stored_after_an_erase_elsewhere(
    database_url: str, tmp_path: Path
) -> None:
    repository = open_repository(database_url)
    stored = Message(role="user", content=f"hello {SECRET_STORED}")
    repository.append("a1", [stored], user_id="alice", source="telegram")
    repository.append("b1", [Message(role="user", content="bob's")], user_id="bob")
    # Gateway A parked a copy of what the primary has (its write committed after its
    # deadline); gateway B parked a message made before the erasure, never stored.
    gateway_a, gateway_b = tmp_path / "a" / "outbox.db", tmp_path / "b" / "outbox.db"
    gateway_a.parent.mkdir()
    gateway_b.parent.mkdir()
    _park(gateway_a, "a1", [stored])
    _park(gateway_b, "a1", [Message(role="user", content=f"then {SECRET_PARKED}")])

    done = _cli(database_url, "erase", "--user", "alice", "--actor", "test", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["session_ids"] == ["a1"]

    drained: list[Any] = []
    for path in (gateway_a, gateway_b):
        writer = TranscriptWriter(repository, outbox_url=f"sqlite:///{path}")
        try:
            drained.append(writer.drain())
            assert writer.pending() == 0
        finally:
            writer.close()
    assert [(d.replayed, d.erased) for d in drained] == [(0, 1), (0, 1)]
    with pytest.raises(NotFound):
        repository.get_session("a1")
    # A new message after the erasure is stored.
    late = Message(role="user", content=f"new {SECRET_LATE}")
    assert repository.append("a1", [late]).inserted == [late.client_msg_uuid]
    found = verify_erased(repository, [SECRET_STORED, SECRET_PARKED], files=[gateway_a, gateway_b])
    assert found.findings == []
    if repository.backend == "sqlite":
        assert any(s.startswith("file:") for s in found.scanned)
    repository.close()

    assert _cli(database_url, "verify-erased", "--text", SECRET_STORED).returncode == 0
    assert _cli(database_url, "verify-erased", "--text", SECRET_LATE).returncode == 1
    audit = _cli(database_url, "audit", "--json")
    assert json.loads(audit.stdout)[0]["actor"] == "test"


@pytest.mark.parametrize(
    ("legacy", "compact"),
    [(False, False), (True, False), (True, True)],
    ids=["written-by-sessionrepo", "legacy-file-scrubbed", "legacy-file-compacted"],
)
def test_on_sqlite_the_erased_text_is_gone_from_the_file_and_its_wal(
    tmp_path: Path, legacy: bool, compact: bool
) -> None:
    path = tmp_path / "store.db"
    open_repository(f"sqlite:///{path}", auto_migrate=True).close()
    writer = open_repository(f"sqlite:///{path}")
    if legacy:
        # Written as by a SQLite without secure delete (before sessionrepo turned it on,
        # or another program): deletes and updates left their bytes in the pages.
        event.listen(writer.database.engine, "checkout", _insecure)
    _fill(writer)
    writer.close()
    repository = open_repository(f"sqlite:///{path}")
    secrets = [SECRET_STORED, SECRET_PARKED, SECRET_OLD, "number 1"]
    assert SECRET_STORED.encode() in path.read_bytes()  # the bytes are there to be erased
    report = repository.erase(user_id="alice", compact=compact)
    assert report.scrub is not None
    assert report.scrub.complete
    left = {}
    for name in ("store.db", "store.db-wal"):
        file = tmp_path / name
        if file.exists():
            left |= scan_file(file, secrets)
    if legacy and not compact:
        # What the scrub cannot reach without rewriting the file: the pages still in use
        # keep what was deleted from them insecurely before. `compact` (VACUUM) does it.
        assert left
    else:
        assert left == {}
    # The other sessions are untouched, and still found.
    assert len(repository.load_transcript("s3")) == 20
    assert repository.search("filler")
    repository.close()


def _insecure(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    dbapi_connection.execute("PRAGMA secure_delete=OFF")


def _fill(repository: SessionRepository) -> None:
    repository.append(
        "victim",
        [
            Message(role="user", content=f"{SECRET_STORED} number {n}", reasoning=SECRET_PARKED)
            for n in range(30)
        ],
        user_id="alice",
        title=f"about {SECRET_STORED}",
    )
    repository.catch_up_search_index()
    # Then enough to have FTS5 merge its segments: the pages of the old ones, freed
    # without secure delete, hold the victim's words.
    for index in range(40):
        repository.append(
            f"s{index}",
            [Message(role="user", content=f"filler {index} " * 50) for _ in range(20)],
            user_id="bob",
        )
        repository.catch_up_search_index()
    repository.retract("victim", [repository.load_transcript("victim")[0].client_msg_uuid])
    # An older session of the victim's, pruned before: its pages were freed without
    # secure delete, and still hold its words until the erasure zeroes the free pages.
    repository.append(
        "victim-old",
        [Message(role="user", content=f"{SECRET_OLD} {n} " * 40) for n in range(50)],
        user_id="alice",
    )
    repository.end_session("victim-old", "done")
    pruned = prune_sessions(repository, cutoff=utcnow() + timedelta(hours=1))
    assert pruned.session_ids == ["victim-old"]
