"""Usage records and ADK state in backups: restored into the other backend exactly and
verified, and never brought back once the target's erasures removed them (the usage of
erased messages, an erased ADK session, an erased user's ADK state)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from sqlalchemy import Connection, Table, select

from sessionrepo import Message, SessionRepository
from sessionrepo.cli import main
from sessionrepo.integrations.adk import SessionRepoSessionService, session_key
from sessionrepo.models.adk import adk_app_states_table, adk_sessions_table, adk_user_states_table
from sessionrepo.models.message import utcnow
from sessionrepo.models.privacy import RetentionPolicy
from sessionrepo.ops import export_sessions, import_sessions
from sessionrepo.ops.backup import BadBackupFile, backup_store, restore_backup, usage_line
from sessionrepo.ops.erase import verify_erased

SECRET = "ledgerpangolin"
ALICE = [session_key("shop", "alice", "a1"), session_key("shop", "alice", "a2")]
BOB = session_key("shop", "bob", "b1")


def _adk(url: str) -> None:
    """Alice's two ADK sessions and Bob's one, with app, user and session state."""

    async def scenario() -> None:
        async with SessionRepoSessionService(url=url) as service:
            first = await service.create_session(
                app_name="shop",
                user_id="alice",
                session_id="a1",
                state={"app:theme": "dark", "user:address": f"1 Elm St {SECRET}", "cart": 3},
            )
            delta = {"user:card": f"4111 {SECRET}", "cart": 4}
            await service.append_event(
                first,
                Event(invocation_id="i1", author="user", actions=EventActions(state_delta=delta)),
            )
            await service.create_session(app_name="shop", user_id="alice", session_id="a2")
            await service.create_session(
                app_name="shop", user_id="bob", session_id="b1", state={"user:lang": "fr"}
            )

    asyncio.run(scenario())


def _fill(repository: SessionRepository, url: str) -> None:
    """ADK state (see :func:`_adk`) and usage: with messages, without one, in Alice's
    ADK session and in a plain session of Bob's."""
    _adk(url)
    said = Message(role="assistant", content=f"your card {SECRET}")
    repository.append(
        ALICE[0],
        [said],
        usage={"model": "gpt-4.1", "input_tokens": 1200, "output_tokens": 80, "latency": 0.25},
    )
    repository.record_usage(
        ALICE[0],
        {"usage_id": "0193a000-0000-7000-8000-000000000001", "model": "o3", "input_tokens": 7},
    )
    repository.append(
        "plain:bob",
        [Message(role="assistant", content="hello bob")],
        user_id="bob",
        usage=[
            {
                "model": "gpt-4.1-mini",
                "input_tokens": 10,
                "output_tokens": 2,
                "extra": {"z": 1, "a": 2},
            }
        ],
    )


def _rows(repository: SessionRepository, table: Table) -> list[dict[str, Any]]:
    def work(conn: Connection) -> list[dict[str, Any]]:
        key = list(table.primary_key.columns)
        return [dict(row._mapping) for row in conn.execute(select(table).order_by(*key))]

    return repository.database.read(work)


def _picture(repository: SessionRepository) -> dict[str, Any]:
    """The usage ledger and every ADK table, as the tables hold them."""
    return {
        "usage": {
            s.session.id: [u.model_dump(mode="json") for u in repository.list_usage(s.session.id)]
            for s in repository.session_snapshots(limit=1000)
        },
        "tokens": {
            s.session.id: (s.session.input_tokens, s.session.output_tokens)
            for s in repository.session_snapshots(limit=1000)
        },
        "adk_sessions": _rows(repository, adk_sessions_table),
        "adk_user_states": _rows(repository, adk_user_states_table),
        "adk_app_states": _rows(repository, adk_app_states_table),
    }


def test_usage_and_adk_state_restore_into_the_other_backend_exactly_and_verified(
    source: SessionRepository,
    target: SessionRepository,
    database_url: str,
    other_url: str,
    tmp_path: Path,
) -> None:
    _fill(source, database_url)
    path = tmp_path / "state.backup"

    taken = backup_store(source, path)

    assert (taken.sessions, taken.usage, taken.adk_sessions, taken.adk_states) == (4, 3, 3, 3)
    lines = [json.loads(line) for line in path.read_bytes().splitlines()]
    kinds = [line["type"] for line in lines]
    assert kinds[-4:] == ["adk_app_state", "adk_user_state", "adk_user_state", "end"]
    (check,) = [r for r in lines if r["type"] == "checksum" and r["session_id"] == ALICE[0]]
    held = [usage_line(ALICE[0], u) for u in source.list_usage(ALICE[0])]
    assert (check["usage"], check["usage_sha256"]) == (
        2,
        hashlib.sha256(b"".join(held)).hexdigest(),
    )
    assert check["adk_session"] is not None

    restored = restore_backup(target, path)

    assert restored.verified, restored.mismatches
    assert (restored.usage_inserted, restored.usage_erased) == (3, 0)
    assert (restored.adk_sessions_inserted, restored.adk_states_inserted) == (3, 3)
    assert _picture(target) == _picture(source)

    again = restore_backup(target, path)
    assert again.verified
    assert (again.usage_inserted, again.usage_present) == (0, 3)
    assert (again.adk_sessions_inserted, again.adk_sessions_present) == (0, 3)
    assert (again.adk_states_inserted, again.adk_states_present) == (0, 3)
    assert _picture(target) == _picture(source)

    # And ADK reads it back (its get_session then applies the plain message appended
    # after the last event: the target's state moves on from the backup's).
    async def read_back() -> dict[str, Any]:
        async with SessionRepoSessionService(url=other_url) as service:
            got = await service.get_session(app_name="shop", user_id="alice", session_id="a1")
            assert got is not None
            return dict(got.state)

    assert asyncio.run(read_back()) == {
        "cart": 4,
        "app:theme": "dark",
        "user:address": f"1 Elm St {SECRET}",
        "user:card": f"4111 {SECRET}",
    }


def test_an_erased_users_usage_and_adk_state_never_come_back(
    source: SessionRepository, database_url: str, tmp_path: Path
) -> None:
    _fill(source, database_url)
    path = tmp_path / "before-erase.backup"
    backup_store(source, path)
    before = _picture(source)
    erased = source.erase(user_id="alice")
    assert sorted(erased.session_ids) == sorted(ALICE)
    assert erased.counts.adk_user_states == 1

    report = restore_backup(source, path)

    assert report.verified, report.mismatches
    assert report.sessions_erased == 2
    assert (report.usage_erased, report.usage_present) == (2, 1)
    assert (report.adk_sessions_erased, report.adk_sessions_present) == (2, 1)
    # Alice's user state refused; Bob's and the app's (shared by every user) present.
    assert (report.adk_states_erased, report.adk_states_present) == (1, 2)
    after = _picture(source)
    assert set(after["usage"]) == {BOB, "plain:bob"}
    assert after["usage"]["plain:bob"] == before["usage"]["plain:bob"]
    assert [r["user_id"] for r in after["adk_sessions"]] == ["bob"]
    assert [r["user_id"] for r in after["adk_user_states"]] == ["bob"]
    assert verify_erased(source, [SECRET]).clean

    # Alice comes back: a new session, a new user state. The old backup restored once
    # more leaves it as it is (her new state is not the erased one, nor overwritten).
    async def returns() -> None:
        async with SessionRepoSessionService(url=database_url) as service:
            await service.create_session(
                app_name="shop", user_id="alice", session_id="a3", state={"user:lang": "de"}
            )

    asyncio.run(returns())
    third = restore_backup(source, path)
    assert third.verified
    assert (third.adk_states_erased, third.sessions_erased) == (1, 2)
    states = {r["user_id"]: r["state"] for r in _rows(source, adk_user_states_table)}
    assert states["alice"] == {"lang": "de"}


def test_usage_made_before_an_erasure_is_refused_and_the_totals_count_it_out(
    source: SessionRepository, target: SessionRepository, tmp_path: Path
) -> None:
    """The source goes on writing to a session the target erased: restored into the
    target (which has since lost the session), the backup's messages and usage made
    before the erasure stay out, those made after it come back, and the recreated
    session's token totals are those of the usage restored."""
    old = Message(role="assistant", content=f"old {SECRET}")
    source.append("s", [old], usage={"model": "m", "input_tokens": 100, "output_tokens": 10})
    first = tmp_path / "first.backup"
    backup_store(source, first)
    restore_backup(target, first)
    target.erase(session_id="s")
    new = Message(role="assistant", content="new words")
    source.append("s", [new], usage={"model": "m", "input_tokens": 5, "output_tokens": 1})
    second = tmp_path / "second.backup"
    backup_store(source, second)
    # The target lost the session (pruned by hand, not erased: the tombstone stays).
    target.append("s", [Message(role="user", content="the target's own")])
    target.end_session("s", "gone")
    assert target.delete_ended_sessions(["s"], cutoff=utcnow() + timedelta(days=1)).deleted

    report = restore_backup(target, second)

    assert report.verified, report.mismatches
    assert (report.sessions_restored, report.messages_erased, report.usage_erased) == (1, 1, 1)
    assert [m.content for m in target.load_transcript("s")] == ["new words"]
    assert [u.input_tokens for u in target.list_usage("s")] == [5]
    session = target.get_session("s")
    assert (session.input_tokens, session.output_tokens) == (5, 1)
    assert verify_erased(target, [SECRET]).clean


def test_an_import_of_an_older_export_refuses_the_usage_of_erased_messages(
    source: SessionRepository, tmp_path: Path
) -> None:
    """The export's importer keeps to the same rule as restore-backup."""
    source.append(
        "s",
        [Message(role="assistant", content=f"first {SECRET}")],
        usage={"model": "m", "input_tokens": 100, "output_tokens": 10},
    )
    export = tmp_path / "old.jsonl"
    with export.open("wb") as out:
        export_sessions(source, out)
    source.erase(session_id="s")

    with export.open("rb") as stream:
        report = import_sessions(source, stream)

    assert (report.messages_erased, report.usage_erased, report.usage_inserted) == (1, 1, 0)
    assert source.session_snapshots() == []


def test_a_damaged_state_record_is_refused_before_anything_is_written(
    source: SessionRepository, target: SessionRepository, database_url: str, tmp_path: Path
) -> None:
    _fill(source, database_url)
    path = tmp_path / "b.backup"
    backup_store(source, path)
    good = path.read_bytes()
    damaged = tmp_path / "damaged.backup"

    for data, message in (
        (good.replace(b'"theme":"dark"', b'"theme":"lite"'), "the file's checksum"),
        (good.replace(b'"cart":4', b'"cart":5'), "checksum"),
        (good.replace(b'"input_tokens":1200', b'"input_tokens":1300'), "checksum"),
        (good.replace(b'"applied_seq":', b'"applied":'), "adk_session record must hold"),
    ):
        damaged.write_bytes(data)
        with pytest.raises(BadBackupFile, match=message):
            restore_backup(target, damaged)
        assert target.session_snapshots() == []
        assert _rows(target, adk_app_states_table) == []


def test_a_version_1_backup_still_restores(
    source: SessionRepository, target: SessionRepository, tmp_path: Path
) -> None:
    """A file written before usage and ADK state were in backups (format version 1:
    no such records, a checksum record of the messages only)."""
    source.append("v1", [Message(role="user", content="from an older sessionrepo")])
    path = tmp_path / "new.backup"
    backup_store(source, path)
    records = [json.loads(line) for line in path.read_bytes().splitlines()]
    records[0]["version"] = 1
    body = b""
    for written in records[:-1]:
        record = written
        if record["type"] == "checksum":
            record = {k: record[k] for k in ("type", "session_id", "messages", "sha256")}
        body += json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
    end = {"type": "end", "sessions": 1, "messages": 1, "sha256": hashlib.sha256(body).hexdigest()}
    old = tmp_path / "v1.backup"
    old.write_bytes(body + json.dumps(end, separators=(",", ":")).encode() + b"\n")

    report = restore_backup(target, old)

    assert report.verified
    assert (report.sessions_restored, report.messages_inserted) == (1, 1)
    assert [m.content for m in target.load_transcript("v1")] == ["from an older sessionrepo"]


def test_the_cli_says_what_it_backed_up_and_restored_of_usage_and_adk_state(
    source: SessionRepository, database_url: str, other_url: str, tmp_path: Path
) -> None:
    _fill(source, database_url)
    path = tmp_path / "cli.backup"
    env = {"SESSIONREPO_DATABASE_URL": None, "SESSIONREPO_OUTBOX_URL": None}

    made = CliRunner().invoke(main, ["--url", database_url, "backup", str(path)], env=env)
    assert made.exit_code == 0, made.output
    assert "3 usage records and 6 ADK states" in made.stdout
    restored = CliRunner().invoke(main, ["--url", other_url, "restore-backup", str(path)], env=env)
    assert restored.exit_code == 0, restored.output
    assert "usage records: 3 inserted" in restored.stdout
    assert "ADK sessions: 3 inserted" in restored.stdout
    assert "ADK app and user states: 3 inserted" in restored.stdout


def test_a_backup_restores_into_a_store_whose_retention_erased_old_history(
    source: SessionRepository, tmp_path: Path
) -> None:
    """Retention erased a live session's old retracted message: restoring a backup taken
    before refuses that message only; the session's live messages are there, verified."""
    now = utcnow()
    old = Message(role="user", content=f"old {SECRET}", timestamp=now - timedelta(days=20))
    live = Message(role="user", content="live", timestamp=now - timedelta(days=20))
    source.append("s", [old, live], source="slack")
    source.retract("s", [old.client_msg_uuid])
    path = tmp_path / "b.backup"
    backup_store(source, path)
    source.set_retention_policy(RetentionPolicy(source="slack", superseded_days=10))
    assert source.apply_retention(now=now).superseded_messages == 1

    report = restore_backup(source, path)

    assert report.verified, report.mismatches
    assert (report.messages_erased, report.messages_present) == (1, 1)
    assert [m.content for m in source.load_transcript("s", include_retracted=True)] == ["live"]
    assert verify_erased(source, [SECRET]).clean
