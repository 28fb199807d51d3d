"""``backup_store`` / ``restore_backup`` (``sessionrepo backup`` / ``restore-backup``): a
consistent snapshot in one verified file, restored into the other backend and back, with
the target's tombstones honoured. (Under a 4-writer load: ``test_backup_processes.py``.)
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from sessionrepo import Message, NotFound, SessionRepository
from sessionrepo.cli import main
from sessionrepo.errors import InvalidArgument, RepoError
from sessionrepo.models import Session
from sessionrepo.ops import export_sessions
from sessionrepo.ops.backup import (
    BACKUP_FORMAT,
    BadBackupFile,
    backup_store,
    message_line,
    restore_backup,
    verify_backup_file,
)
from sessionrepo.ops.erase import verify_erased

SECRET = "backupmarmot"


def _fill(repository: SessionRepository) -> None:
    """Sessions of every shape: tool calls, odd text, retracted and compacted history,
    a fork, an ended session, an empty one."""
    a = [
        Message(role="user", content=f"hello {SECRET}"),
        Message(
            role="assistant",
            content=None,
            tool_calls=[
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"q": "x"}'},
                }
            ],
        ),
        Message(role="tool", tool_call_id="call_1", content='{"answer": 42}'),
        Message(role="user", content="ünïcode ✓ \u2028 line\nbreak \x00 nul"),
        Message(role="user", content="retract me"),
        Message(role="assistant", content="after all that"),
    ]
    repository.append(
        "a", a, user_id="alice", source="discord", title="A", metadata={"k": [1, {"z": 2}]}
    )
    repository.retract("a", [a[4].client_msg_uuid])
    repository.compact("a", 2, {"role": "system", "content": "summary of the start"})
    repository.fork_session("a", 3, "a-fork")
    repository.append("a-fork", [Message(role="user", content="in the fork")])
    repository.append("b", [Message(role="user", content="bob's")], user_id="bob")
    repository.end_session("b", "done")
    repository.create_session("empty", user_id="carol", source="web")


def _picture(repository: SessionRepository) -> dict[str, Any]:
    """Every session's fields and every stored message, as the models dump them."""
    found: dict[str, Any] = {}
    for snapshot in repository.session_snapshots(limit=1000):
        sid = snapshot.session.id
        messages = repository.load_transcript(sid, include_retracted=True)
        found[sid] = {
            "session": snapshot.session.model_dump(mode="json", by_alias=True),
            "messages": [m.model_dump(mode="json") for m in messages],
        }
    return found


def _run(*args: str) -> Result:
    return CliRunner().invoke(
        main, list(args), env={"SESSIONREPO_DATABASE_URL": None, "SESSIONREPO_OUTBOX_URL": None}
    )


def test_a_backup_restores_into_the_other_backend_exactly_and_verified(
    source: SessionRepository, target: SessionRepository, tmp_path: Path
) -> None:
    _fill(source)
    (tmp_path / "backups").mkdir()
    path = tmp_path / "backups" / "store.backup"

    report = backup_store(source, path)

    assert (report.sessions, report.messages) == (4, 12)
    assert report.backend == source.backend
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["store.backup"]  # no temporary
    lines = path.read_bytes().splitlines(keepends=True)
    header, end = json.loads(lines[0]), json.loads(lines[-1])
    assert (header["format"], header["version"], header["checksum"]) == (BACKUP_FORMAT, 2, "sha256")
    assert (end["sessions"], end["messages"], end["sha256"]) == (4, 12, report.sha256)
    checks = [json.loads(line) for line in lines if b'"type":"checksum"' in line]
    assert [(c["session_id"], c["messages"]) for c in checks] == [
        ("a", 7),
        ("a-fork", 4),
        ("b", 1),
        ("empty", 0),
    ]

    restored = restore_backup(target, path)

    assert restored.verified
    assert restored.mismatches == []
    assert (restored.sessions_restored, restored.sessions_verified) == (4, 4)
    assert (restored.messages_inserted, restored.messages_erased) == (12, 0)
    assert restored.source_backend == source.backend
    assert _picture(target) == _picture(source)
    # Searchable there: the index is rebuilt from the restored (live) messages.
    assert [hit.session_id for hit in target.search("fork")] == ["a-fork"]
    assert [hit.session_id for hit in target.search("bob's")] == ["b"]

    # Restored again: nothing inserted, everything present, still verified.
    again = restore_backup(target, path)
    assert (again.sessions_present, again.messages_inserted, again.messages_present) == (4, 0, 12)
    assert again.verified
    assert _picture(target) == _picture(source)

    # And back: a backup of the restored store restores into an empty one of the first
    # backend with the same checksums.
    back = tmp_path / "back.backup"
    assert backup_store(target, back).sha256 != ""
    checks_back = [
        json.loads(line) for line in back.read_bytes().splitlines() if b'"type":"checksum"' in line
    ]
    assert checks_back == checks


def test_the_session_checksum_is_over_the_message_lines_as_written(
    source: SessionRepository, tmp_path: Path
) -> None:
    import hashlib

    _fill(source)
    path = tmp_path / "b.backup"
    backup_store(source, path)
    lines = path.read_bytes().splitlines(keepends=True)
    mine = [line for line in lines if b'"session_id":"a",' in line and b'"type":"message"' in line]
    (check,) = [json.loads(line) for line in lines if b'"type":"checksum","session_id":"a"' in line]

    assert check["sha256"] == hashlib.sha256(b"".join(mine)).hexdigest()
    stored = source.load_transcript("a", include_retracted=True)
    assert [message_line(m) for m in stored] == mine


def test_restore_never_brings_back_what_the_targets_tombstones_erased(
    source: SessionRepository, tmp_path: Path
) -> None:
    _fill(source)
    path = tmp_path / "before-erase.backup"
    backup_store(source, path)  # a backup taken before the erase still holds alice's words
    assert SECRET.encode() in path.read_bytes()
    erased = source.erase(user_id="alice")
    assert sorted(erased.session_ids) == ["a", "a-fork"]

    report = restore_backup(source, path)

    assert report.verified
    assert report.sessions_erased == 2
    assert report.messages_erased == 11
    assert report.sessions_present == 2
    assert report.messages_inserted == 0
    for sid in ("a", "a-fork"):
        with pytest.raises(NotFound):
            source.get_session(sid)
    assert verify_erased(source, [SECRET]).clean  # rows, index and (SQLite) bytes


def test_an_erased_empty_session_is_not_recreated(
    source: SessionRepository, target: SessionRepository, tmp_path: Path
) -> None:
    source.create_session("gone", user_id="dora", title="dora's private title")
    source.create_session("kept", user_id="eve")
    path = tmp_path / "b.backup"
    backup_store(source, path)
    restore_backup(target, path)
    target.erase(user_id="dora")

    report = restore_backup(target, path)

    assert (report.sessions_erased, report.sessions_present) == (1, 1)
    with pytest.raises(NotFound):
        target.get_session("gone")
    assert report.verified


def test_a_backup_is_one_instant_not_each_session_as_it_was_read(
    source: SessionRepository, tmp_path: Path
) -> None:
    firsts = {}
    for sid in ("s1", "s2", "s3"):
        firsts[sid] = Message(role="user", content=f"{sid} first")
        source.append(sid, [firsts[sid]])
    written: list[str] = []

    def meanwhile(session: Session) -> None:
        # A gateway writes while the backup is half way: to a session read already and
        # to one not read yet, edits one not read yet, and makes a new one. None of it
        # is in the backup.
        if session.id == "s1":
            source.append("s1", [Message(role="user", content="s1 late")])
            source.append("s3", [Message(role="user", content="s3 late")])
            source.retract("s2", [firsts["s2"].client_msg_uuid])
            source.append("s2-new", [Message(role="user", content="new session")])
        written.append(session.id)

    path = tmp_path / "b.backup"
    report = backup_store(source, path, on_session=meanwhile)

    assert written == ["s1", "s2", "s3"]
    assert (report.sessions, report.messages) == (3, 3)
    data = path.read_bytes()
    assert b"late" not in data
    assert b"s2-new" not in data
    assert b'"superseded":"retracted"' not in data  # s2 as it was before the edit
    assert [len(source.load_transcript(s)) for s in ("s1", "s2", "s3")] == [2, 0, 2]


def test_a_damaged_file_is_refused_before_anything_is_written(
    source: SessionRepository, target: SessionRepository, tmp_path: Path
) -> None:
    _fill(source)
    path = tmp_path / "b.backup"
    backup_store(source, path)
    good = path.read_bytes()

    def refused(data: bytes, message: str) -> None:
        damaged = tmp_path / "damaged.backup"
        damaged.write_bytes(data)
        with pytest.raises(BadBackupFile, match=message):
            restore_backup(target, damaged)
        assert target.session_snapshots() == []
        damaged.unlink()

    # Still valid JSON, another word: the session's checksum catches it.
    refused(good.replace(b"bob's", b"bub's"), "checksum")
    # A session's fields: the file's checksum does.
    refused(good.replace(b'"title":"A"', b'"title":"B"'), "the file's checksum")
    refused(good[: len(good) // 2], "cut short|damaged")
    refused(good.rsplit(b"\n", 2)[0] + b"\n", "cut short")  # the end record dropped
    refused(b"", "empty")
    export = tmp_path / "export.jsonl"
    with export.open("wb") as out:
        export_sessions(source, out)
    refused(export.read_bytes(), "not a sessionrepo backup")
    plain = tmp_path / "x.backup"
    plain.write_bytes(b"{}\n")
    with pytest.raises(BadBackupFile, match="not a sessionrepo backup"):
        verify_backup_file(plain)


def test_a_session_changed_in_the_target_is_a_mismatch_and_the_cli_exits_1(
    source: SessionRepository, target: SessionRepository, other_url: str, tmp_path: Path
) -> None:
    _fill(source)
    path = tmp_path / "b.backup"
    backup_store(source, path)
    target.append("b", [Message(role="user", content="the target's own")], user_id="bob")

    report = restore_backup(target, path)

    assert not report.verified
    assert report.sessions_diverged == 1
    (miss,) = report.mismatches
    assert (miss.session_id, miss.expected_messages, miss.found_messages) == ("b", 1, 1)
    assert miss.expected_sha256 != miss.found_sha256
    assert [m.content for m in target.load_transcript("b")] == ["the target's own"]

    result = _run("--url", other_url, "restore-backup", str(path))
    assert result.exit_code == 1, result.output
    assert "MISMATCH: 1 session of 4" in result.stderr
    as_json = _run("--url", other_url, "restore-backup", str(path), "--json")
    assert as_json.exit_code == 1
    assert json.loads(as_json.stdout)["mismatches"][0]["session_id"] == "b"


def test_the_cli_backs_up_and_restores(
    source: SessionRepository, database_url: str, other_url: str, tmp_path: Path
) -> None:
    _fill(source)
    path = tmp_path / "cli.backup"

    made = _run("--url", database_url, "backup", str(path), "--json")
    assert made.exit_code == 0, made.output
    report = json.loads(made.stdout)
    assert (report["sessions"], report["messages"]) == (4, 12)
    assert report["taken_at"].endswith("Z")

    again = _run("--url", database_url, "backup", str(path))
    assert again.exit_code == 1
    assert "already exists" in again.stderr

    restored = _run("--url", other_url, "restore-backup", str(path))
    assert restored.exit_code == 0, restored.output
    assert "restored 4 sessions" in restored.stdout
    assert "verified: 4 sessions match the backup" in restored.stdout

    path.write_bytes(path.read_bytes().replace(b"bob's", b"bub's"))
    damaged = _run("--url", f"sqlite:///{tmp_path / 'new.db'}", "restore-backup", str(path))
    assert damaged.exit_code == 1
    assert "checksum" in damaged.stderr
    assert not (tmp_path / "new.db").exists()  # refused before the store was opened


def test_bad_arguments_are_refused_and_leave_no_file(
    source: SessionRepository, tmp_path: Path
) -> None:
    _fill(source)
    tmp_path = tmp_path / "backups"
    tmp_path.mkdir()
    (tmp_path / "taken").write_bytes(b"keep me")
    with pytest.raises(InvalidArgument, match="already exists"):
        backup_store(source, tmp_path / "taken")
    assert (tmp_path / "taken").read_bytes() == b"keep me"
    with pytest.raises(InvalidArgument, match="not a folder"):
        backup_store(source, tmp_path / "missing" / "b.backup")
    with pytest.raises(InvalidArgument):
        backup_store(source, tmp_path / "b.backup", page=0)

    def fail(session: Session) -> None:
        raise RuntimeError("disk on fire")

    with pytest.raises(RepoError, match="RuntimeError"):  # the transaction's boundary
        backup_store(source, tmp_path / "b.backup", on_session=fail)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # no temporary left
