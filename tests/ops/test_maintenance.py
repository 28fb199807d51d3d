"""``sessionrepo.ops``: export / import / prune as a library, and the doctor's judgements.

The round trip is held to "exactly": every session field (counters, times, ``next_seq``,
JSON key order) and every message field (key, ``seq``, timestamp, ``extra`` key order,
``openai_keys``) read back from the target equals what the source holds. The CLI tests
(``test_cli_ops.py``) reuse :func:`build_corpus` and :func:`snapshot`.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from sessionrepo import Message, Session, SessionRepository, open_repository
from sessionrepo.dialects import PostgresDialect, SQLiteDialect
from sessionrepo.models.message import utcnow
from sessionrepo.models.tables import messages_table, sessions_table
from sessionrepo.ops import (
    EXPORT_VERSION,
    BadExportFile,
    Selection,
    export_sessions,
    import_sessions,
    parse_duration,
    prune_sessions,
)
from sessionrepo.outbox.table import Outbox
from sessionrepo.store.database import Database
from sessionrepo.store.schema import upgrade

from support.corpus import BIG, assert_same_store, build_corpus, set_times, snapshot

S = sessions_table.c
M = messages_table.c

# -- fixtures and helpers -------------------------------------------------------------


@pytest.fixture
def target_url(empty_database_url: str) -> str:
    """A second, empty database of the same backend, migrated."""
    database = Database(empty_database_url)
    try:
        upgrade(database)
    finally:
        database.dispose()
    return empty_database_url


@pytest.fixture
def target(target_url: str) -> Iterator[SessionRepository]:
    repository = open_repository(target_url)
    yield repository
    repository.close()


def _export(repository: SessionRepository, selection: Selection | None = None) -> bytes:
    buffer = io.BytesIO()
    export_sessions(repository, buffer, selection)
    return buffer.getvalue()


def _import(repository: SessionRepository, data: bytes, **options: Any) -> Any:
    return import_sessions(repository, io.BytesIO(data), **options)


def _records(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.split(b"\n") if line]


# -- export and import ----------------------------------------------------------------


def test_export_then_import_into_an_empty_database_is_exact(
    repo: SessionRepository, database_url: str, target: SessionRepository, target_url: str
) -> None:
    ids = build_corpus(repo)

    data = _export(repo)
    report = _import(target, data)

    assert report.complete
    assert (report.sessions_restored, report.sessions_present, report.sessions_merged) == (4, 0, 0)
    assert report.messages_inserted == 7 + 2 + BIG
    assert (report.messages_present, report.messages_conflicting) == (0, 0)
    assert_same_store(database_url, target_url, ids)

    again = _import(target, data)

    assert (again.messages_inserted, again.messages_present) == (0, report.messages_inserted)
    assert (again.sessions_restored, again.sessions_present) == (0, 4)
    assert_same_store(database_url, target_url)


def test_the_file_is_the_documented_format(repo: SessionRepository) -> None:
    build_corpus(repo)

    records = _records(_export(repo))

    assert records[0]["type"] == "header"
    assert (records[0]["format"], records[0]["version"]) == ("sessionrepo-export", EXPORT_VERSION)
    assert records[-1] == {"type": "end", "sessions": 4, "messages": 7 + 2 + BIG, "usage": 0}
    current = None
    seqs: list[int] = []
    for record in records[1:-1]:
        if record["type"] == "session":
            assert seqs == list(range(1, len(seqs) + 1))
            current, seqs = record, []
            assert set(record) == {"type", "next_seq", "session"}
            assert set(record["session"]) == set(Session.model_fields)
        else:
            assert current is not None
            assert record["type"] == "message"
            assert record["session_id"] == current["session"]["id"]
            assert record["seq"] < current["next_seq"]
            assert set(record["message"]) == {*Message.model_fields, "superseded"}
            seqs.append(record["seq"])
    ids = [r["session"]["id"] for r in records if r["type"] == "session"]
    assert ids == sorted(ids)


def test_an_export_is_a_consistent_snapshot_while_a_session_grows(
    repo: SessionRepository, target: SessionRepository
) -> None:
    repo.append("live", [Message(role="user", content=f"#{i}") for i in range(3)])
    original = repo.load_transcript
    grown: list[str] = []

    def load_transcript(session_id: str, **options: Any) -> Any:
        if not grown:  # a gateway writes after the session row was read
            grown.append(session_id)
            repo.append(session_id, [Message(role="user", content="late")])
        return original(session_id, **options)

    repo.load_transcript = load_transcript  # type: ignore[method-assign]
    data = _export(repo)
    records = _records(data)

    session = next(r for r in records if r["type"] == "session")
    assert session["next_seq"] == 4
    assert session["session"]["message_count"] == 3
    assert [r["seq"] for r in records if r["type"] == "message"] == [1, 2, 3]
    _import(target, data)
    assert target.get_session("live").message_count == 3
    assert [m.content for m in target.load_transcript("live")] == ["#0", "#1", "#2"]


def test_export_selections(repo: SessionRepository) -> None:
    build_corpus(repo)
    old = utcnow() + timedelta(days=1)

    def ids(selection: Selection) -> list[str]:
        return [r["session"]["id"] for r in _records(_export(repo, selection)) if "session" in r]

    assert ids(Selection(session_ids=("cli:long",))) == ["cli:long"]
    assert ids(Selection(source="discord")) == ["discord:chan-1", "discord:chan-1:rotated"]
    assert ids(Selection(user_id="user-2")) == ["telegram:empty"]
    assert ids(Selection(status="open")) == ["cli:long", "discord:chan-1"]
    assert ids(Selection(ended_before=old)) == ["discord:chan-1:rotated", "telegram:empty"]
    assert ids(Selection(ended_before=old - timedelta(days=2))) == []


def test_an_interrupted_import_is_completed_by_running_it_again(
    repo: SessionRepository, database_url: str, target: SessionRepository, target_url: str
) -> None:
    build_corpus(repo)
    data = _export(repo)
    lines = data.split(b"\n")
    cut = b"\n".join(lines[: len(lines) // 2]) + b"\n"  # mid-way through the long session

    partial = _import(target, cut, batch_size=7)

    assert not partial.complete
    assert 0 < partial.messages_inserted < 7 + 2 + BIG
    whole = _import(target, data, batch_size=7)

    assert whole.complete
    assert whole.messages_inserted + partial.messages_inserted == 7 + 2 + BIG
    assert whole.messages_present == partial.messages_inserted
    assert whole.sessions_merged == 0  # resumed exactly, not appended after
    assert_same_store(database_url, target_url)


def test_imported_messages_are_found_by_search(
    repo: SessionRepository, target: SessionRepository
) -> None:
    words = ["okapi", "zebu", "quokka", "tapir", "dugong"]
    repo.append("restored", [Message(role="user", content=f"a {w} here") for w in words])
    shared = [Message(role="user", content="first"), Message(role="user", content="the ibex")]
    repo.append("merged", shared)
    target.append("merged", shared[:1])
    target.append("merged", [Message(role="assistant", content="own")])

    _import(target, _export(repo), batch_size=2)

    assert target.search_index_state() == ("ok", None)
    for seq, word in enumerate(words, start=1):
        assert [(h.session_id, h.seq) for h in target.search(word)] == [("restored", seq)]
    assert [(h.session_id, h.seq) for h in target.search("ibex")] == [("merged", 3)]


def test_a_session_the_target_changed_is_merged_not_overwritten(
    repo: SessionRepository, target: SessionRepository
) -> None:
    sent = [Message(role="user", content=f"#{i}") for i in range(4)]
    repo.append("shared", sent, source="discord")
    data = _export(repo)
    # The target got the first two, then a message of its own.
    target.append("shared", sent[:2], source="discord")
    own = Message(role="assistant", content="written here")
    target.append("shared", [own])

    report = _import(target, data, batch_size=3)

    assert (report.sessions_merged, report.sessions_restored) == (1, 0)
    assert (report.messages_inserted, report.messages_present) == (2, 2)
    stored = target.load_transcript("shared")
    keys = [sent[0], sent[1], own, sent[2], sent[3]]
    assert [m.client_msg_uuid for m in stored] == [m.client_msg_uuid for m in keys]
    assert [m.seq for m in stored] == [1, 2, 3, 4, 5]
    assert target.get_session("shared").message_count == 5
    assert _import(target, data).messages_inserted == 0


def test_a_key_stored_with_other_content_is_a_conflict_and_kept(
    repo: SessionRepository, target: SessionRepository
) -> None:
    message = Message(role="user", content="original")
    repo.append("s", [message])
    data = _export(repo)
    target.append("s", [message.model_copy(update={"content": "edited elsewhere"})])

    report = _import(target, data)

    assert report.messages_conflicting == 1
    assert report.messages_inserted == 0
    assert [m.content for m in target.load_transcript("s")] == ["edited elsewhere"]


def test_restored_counters_count_the_messages_and_a_gap_stays_a_gap(
    repo: SessionRepository, target: SessionRepository
) -> None:
    repo.append("s", [Message(role="user", content=f"#{i}") for i in range(3)])
    records = _records(_export(repo))
    # A file edited by hand: counters that lie, and no message at seq 2.
    records[1]["session"] |= {"message_count": 99, "tool_call_count": 5}
    del records[3]
    records[-1]["messages"] = 2

    report = _import(target, _lines(records))

    assert (report.sessions_restored, report.messages_inserted) == (1, 2)
    stored = target.get_session("s")
    assert (stored.message_count, stored.tool_call_count) == (2, 0)
    assert stored.last_active_at == repo.get_session("s").last_active_at
    assert [m.seq for m in target.load_transcript("s")] == [1, 3]
    again = _import(target, _lines(records))
    assert (again.sessions_present, again.messages_present, again.messages_inserted) == (1, 2, 0)


def _valid_file(repo: SessionRepository) -> list[dict[str, Any]]:
    repo.append("s", [Message(role="user", content=f"#{i}") for i in range(3)])
    return _records(_export(repo))


def _lines(records: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda r: r[1:], "line 1: not a sessionrepo export"),
        (lambda r: [{**r[0], "version": EXPORT_VERSION + 1}, *r[1:]], "upgrade sessionrepo"),
        (lambda r: [r[0], r[2], *r[3:]], "line 2: a message before any session"),
        (lambda r: [*r[:2], r[3], r[2], *r[4:]], "line 4: seq 1 is out of order"),
        (
            lambda r: [*r[:2], {**r[2], "session_id": "other"}, *r[3:]],
            "line 3: a message of session 'other'",
        ),
        (
            lambda r: [*r[:2], {**r[2], "message": {**r[2]["message"], "role": "robot"}}, *r[3:]],
            "line 3: message.role",
        ),
        (lambda r: [*r[:-1], {**r[-1], "messages": 2}], "the end record counts 1 sessions and 2"),
        (lambda r: [*r, r[1]], "a record after the end record"),
        (lambda r: [*r[:2], {"type": "mystery"}, *r[2:]], "line 3: unknown record type 'mystery'"),
    ],
)
def test_a_damaged_file_is_refused_at_the_line_that_is_wrong(
    repo: SessionRepository, target: SessionRepository, damage: Any, expected: str
) -> None:
    with pytest.raises(BadExportFile, match=expected.replace("(", r"\(").replace(")", r"\)")):
        _import(target, _lines(damage(_valid_file(repo))))


def test_lines_that_are_not_json_or_nothing_at_all_are_refused(
    repo: SessionRepository, target: SessionRepository
) -> None:
    data = _lines(_valid_file(repo))
    with pytest.raises(BadExportFile, match="line 3: damaged"):
        _import(target, data.replace(b'"type": "message"', b"{{", 1))
    with pytest.raises(BadExportFile, match="line 1: not a sessionrepo export"):
        _import(target, b"hello\n")
    with pytest.raises(BadExportFile, match="empty"):
        _import(target, b"")


@pytest.mark.parametrize(
    "damage",
    [
        lambda r: b'{"type": "message", \n',  # not JSON
        lambda r: json.dumps({**r, "seq": 1}).encode() + b"\n",  # a valid line, out of order
    ],
    ids=["not-json", "out-of-order"],
)
def test_a_damaged_line_keeps_what_came_before_it_and_a_rerun_finishes(
    repo: SessionRepository,
    database_url: str,
    target: SessionRepository,
    target_url: str,
    damage: Any,
) -> None:
    """The session being read when the damage is found keeps its messages before the
    damaged line (they were waiting for their batch to fill), and importing the mended
    file adds only what follows it, resuming the session as exported."""
    repo.append("a", [Message(role="user", content=f"a{i}") for i in range(2)])
    repo.append("b", [Message(role="user", content=f"b{i}") for i in range(4)])
    data = _export(repo)
    lines = data.splitlines(keepends=True)
    # header, a, a0, a1, b, b0, b1 | damage | b2, b3, end
    damaged = b"".join([*lines[:7], damage(json.loads(lines[7])), *lines[7:]])

    with pytest.raises(BadExportFile, match="line 8: "):
        _import(target, damaged)

    assert [m.content for m in target.load_transcript("a")] == ["a0", "a1"]
    assert [m.content for m in target.load_transcript("b")] == ["b0", "b1"]
    whole = _import(target, data)
    assert whole.complete
    assert (whole.messages_inserted, whole.messages_present) == (2, 4)
    assert (whole.sessions_present, whole.sessions_merged) == (2, 0)  # resumed, as exported
    assert_same_store(database_url, target_url)


def test_records_split_on_newline_only(repo: SessionRepository, target: SessionRepository) -> None:
    # U+2028, U+0085 and U+001C are line breaks to str.splitlines(), not to JSON Lines.
    text = "a\u2028b\u0085c\x1cd\re"
    repo.append("s", [Message(role="user", content=text)])

    _import(target, _export(repo))

    assert target.load_transcript("s")[0].content == text


# -- prune ----------------------------------------------------------------------------


def test_parse_duration() -> None:
    assert parse_duration("90d") == timedelta(days=90)
    assert parse_duration("12h") == timedelta(hours=12)
    assert parse_duration("30m") == timedelta(minutes=30)
    assert parse_duration("45s") == timedelta(seconds=45)
    assert parse_duration(" 7D ") == timedelta(days=7)
    for bad in ("90", "d", "1.5d", "-1d", "10w", "", "1e3d"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)


def _prunable_sessions(url: str, repository: SessionRepository, count: int) -> list[str]:
    long_ago = utcnow() - timedelta(days=400)
    ids = []
    for i in range(count):
        sid = f"old-{i}"
        repository.append(sid, [Message(role="user", content=f"{sid} #{n}") for n in range(3)])
        repository.end_session(sid, "done")
        set_times(url, sid, ended_at=long_ago, last_active_at=long_ago)
        ids.append(sid)
    return ids


def test_prune_works_in_batches_and_takes_the_messages(
    repo: SessionRepository, database_url: str
) -> None:
    ids = _prunable_sessions(database_url, repo, 5)
    batches: list[list[str]] = []

    report = prune_sessions(
        repo,
        cutoff=utcnow() - timedelta(days=90),
        batch_size=2,
        on_batch=lambda batch: batches.append([s.id for s in batch]),
    )

    assert batches == [ids[:2], ids[2:4], ids[4:]]
    assert (report.sessions, report.messages, report.kept) == (5, 15, [])
    assert repo.list_sessions().sessions == []
    database = repo.database
    assert database.read(lambda c: c.execute(select(M.session_id)).all()) == []


def test_a_session_written_to_while_pruning_is_kept(
    repo: SessionRepository, database_url: str
) -> None:
    ids = _prunable_sessions(database_url, repo, 3)
    other = open_repository(database_url)
    original = repo.database.write

    def write(work: Any) -> Any:
        # Between listing and deleting, a late message arrives for one of them.
        other.append(ids[1], [Message(role="assistant", content="late reply")])
        return original(work)

    repo.database.write = write  # type: ignore[method-assign]
    try:
        report = prune_sessions(repo, cutoff=utcnow() - timedelta(days=90))
    finally:
        other.close()

    assert report.session_ids == [ids[0], ids[2]]
    assert report.kept == [ids[1]]
    assert [m.content for m in repo.load_transcript(ids[1])][-1] == "late reply"


def test_prune_with_export_deletes_only_what_was_exported_unchanged(
    repo: SessionRepository, database_url: str, target: SessionRepository, target_url: str
) -> None:
    ids = _prunable_sessions(database_url, repo, 3)
    expected = snapshot(database_url)
    other = open_repository(database_url)
    original = repo.database.write

    def write(work: Any) -> Any:
        # After the export, before the delete: a field is filled in (it stays prunable,
        # but the file no longer holds what would be deleted).
        other.create_session(ids[2], title="named later")
        return original(work)

    repo.database.write = write  # type: ignore[method-assign]
    buffer = io.BytesIO()
    try:
        report = prune_sessions(repo, cutoff=utcnow() - timedelta(days=90), export_to=buffer)
    finally:
        other.close()

    assert report.session_ids == ids[:2]
    assert report.kept == [ids[2]]
    assert report.exported == 3
    assert repo.get_session(ids[2]).title == "named later"
    imported = _import(target, buffer.getvalue())
    assert imported.complete
    assert snapshot(target_url) == {sid: expected[sid] for sid in ids}


def test_pruned_messages_leave_the_search_index(repo: SessionRepository, database_url: str) -> None:
    long_ago = utcnow() - timedelta(days=400)
    repo.append("gone", [Message(role="user", content="an okapi")])
    repo.end_session("gone", "done")
    set_times(database_url, "gone", ended_at=long_ago, last_active_at=long_ago)
    repo.append("live", [Message(role="user", content="another okapi")])
    assert {h.session_id for h in repo.search("okapi")} == {"gone", "live"}

    assert prune_sessions(repo, cutoff=utcnow() - timedelta(days=90)).session_ids == ["gone"]

    assert [h.session_id for h in repo.search("okapi")] == ["live"]
    # The id comes back (a late drain recreates it): its new message at seq 1 must not
    # be found by the words of the pruned one.
    repo.append("gone", [Message(role="user", content="a zebu")])
    assert [h.session_id for h in repo.search("okapi")] == ["live"]
    assert [(h.session_id, h.seq) for h in repo.search("zebu")] == [("gone", 1)]
    assert repo.search_index_state() == ("ok", None)


def test_prune_leaves_the_outbox_rows_of_a_pruned_session_and_reports_them(
    repo: SessionRepository, database_url: str
) -> None:
    ids = _prunable_sessions(database_url, repo, 2)
    parked = [Message(role="user", content="still in flight")]
    Outbox(repo.database).park(ids[0], parked, Session(id=ids[0]), reason="test")

    report = prune_sessions(repo, cutoff=utcnow() - timedelta(days=90))

    assert report.sessions == 2
    assert (report.outbox_rows, report.outbox_sessions) == (1, [ids[0]])
    assert Outbox(repo.database).count(ids[0]) == 1


# -- doctor's judgements (the values a server may have; the checks run in the CLI tests) --


def _healthy_postgres() -> dict[str, str]:
    return {
        "server_version_num": "150004",
        "synchronous_commit": "on",
        "fsync": "on",
        "full_page_writes": "on",
        "TimeZone": "UTC",
        "default_transaction_read_only": "off",
        "in_recovery": "False",
        "role": "gateway",
        "role_bypass": "",
        "tenants": "0",
    }


@pytest.mark.parametrize(
    ("setting", "value", "status"),
    [
        (None, None, "ok"),
        ("role_bypass", "superuser", "ok"),  # no tenant roles: one gateway's store
        ("tenants", "2", "ok"),  # a tenant's role, held to the policies
        ("synchronous_commit", "off", "fail"),
        ("synchronous_commit", "local", "ok"),
        ("fsync", "off", "fail"),
        ("full_page_writes", "off", "warn"),
        ("TimeZone", "Europe/Paris", "warn"),
        ("server_version_num", "120010", "warn"),
        ("in_recovery", "True", "fail"),
        ("default_transaction_read_only", "on", "fail"),
    ],
)
def test_judge_postgres(setting: str | None, value: str | None, status: str) -> None:
    settings = _healthy_postgres()
    if setting is not None:
        assert value is not None
        settings[setting] = value

    checks = PostgresDialect().judge_settings(settings)

    worst = {c.status for c in checks} - {"ok"}
    assert worst == ({status} if status != "ok" else set())
    assert all(c.fix for c in checks if c.status != "ok")


def test_judge_postgres_fails_a_role_that_bypasses_the_policies_of_a_store_with_tenants() -> None:
    settings = {**_healthy_postgres(), "role_bypass": "superuser", "tenants": "2"}

    [tenancy] = [c for c in PostgresDialect().judge_settings(settings) if c.name == "tenancy"]

    assert tenancy.status == "fail"
    assert "2 tenant roles" in tenancy.detail
    assert tenancy.fix


@pytest.mark.parametrize(
    ("setting", "value", "status"),
    [
        (None, None, "ok"),
        ("journal_mode", "delete", "fail"),
        ("synchronous", "1", "warn"),
        ("synchronous", "0", "fail"),
        ("synchronous", "3", "ok"),
        ("foreign_keys", "0", "fail"),
        ("busy_timeout", "0", "fail"),
    ],
)
def test_judge_sqlite(setting: str | None, value: str | None, status: str) -> None:
    settings = {
        "journal_mode": "wal",
        "synchronous": "2",
        "foreign_keys": "1",
        "busy_timeout": "10000",
    }
    if setting is not None:
        assert value is not None
        settings[setting] = value

    checks = SQLiteDialect().judge_settings(settings)

    worst = {c.status for c in checks} - {"ok"}
    assert worst == ({status} if status != "ok" else set())
    assert all(c.fix for c in checks if c.status != "ok")
