"""``sessionrepo import-hermes``: a Hermes gateway's ``state.db`` and spool move over with
nothing dropped, nothing doubled, and the source untouched, on both backends.

The Hermes homes are built by the tests (``_hermes_fixtures``): the old (version 2) and a
current column set, in-place compaction (inactive rows, a copied ``message_uid``), a rewind,
a compression chain, tool calls, multimodal content, values sessionrepo cannot store as
they are, and a spool with the four payload kinds and files that are not payloads.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import pytest
from _hermes_fixtures import (
    HermesDB,
    ModernHome,
    Spool,
    build_modern_home,
    build_v2_state_db,
    snapshot,
)
from click.testing import CliRunner, Result

from sessionrepo import BackendUnavailable, SessionRepository, StoredMessage, open_repository
from sessionrepo.cli.hermes import EXIT_ATTENTION
from sessionrepo.cli.hermes import import_hermes as command
from sessionrepo.importers.hermes import (
    HISTORY_SUFFIX,
    HermesImportError,
    HermesImportSummary,
    import_hermes,
    open_hermes,
    spool_key,
    uid_key,
)

#: ``messages`` columns that are ``Message`` fields.
FIELD_COLUMNS = {
    "role",
    "content",
    "tool_calls",
    "tool_call_id",
    "tool_name",
    "reasoning",
    "finish_reason",
    "token_count",
    "timestamp",
    "platform_message_id",
}
#: ``sessions`` columns that are ``Session`` fields and are not also kept in metadata.
SESSION_FIELD_COLUMNS = {
    "id",
    "source",
    "user_id",
    "title",
    "model",
    "system_prompt",
    "parent_session_id",
    "end_reason",
}


def invoke(*args: str) -> Result:
    # The tests choose every database: nothing comes from the environment.
    return CliRunner().invoke(
        command,
        list(args),
        env={"SESSIONREPO_DATABASE_URL": None, "SESSIONREPO_OUTBOX_URL": None},
    )


def run_import(
    url: str, source: Path, report: Path | None = None, *, expect: int = 0
) -> HermesImportSummary:
    """``import-hermes --json`` through the command; the summary it printed."""
    extra = ["--inbound-report", str(report)] if report is not None else []
    result = invoke("--url", url, "--json", *extra, str(source))
    assert result.exit_code == expect, result.output
    return HermesImportSummary.model_validate_json(result.stdout)


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The command writes its default inbound report to the current directory.
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def modern(tmp_path: Path) -> Iterator[ModernHome]:
    home = build_modern_home(tmp_path / "hermes")
    yield home
    home.db.close()


@pytest.fixture
def store(database_url: str) -> Iterator[SessionRepository]:
    repository = open_repository(database_url)
    yield repository
    repository.close()


def all_messages(repo: SessionRepository) -> dict[str, list[StoredMessage]]:
    """Every stored transcript, by session id."""
    found: dict[str, list[StoredMessage]] = {}
    cursor = None
    while True:
        page = repo.list_sessions(limit=100, cursor=cursor)
        for session in page.sessions:
            found[session.id] = repo.load_transcript(session.id)
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor


def by_row_id(repo: SessionRepository) -> dict[int, tuple[str, StoredMessage]]:
    """Stored messages that came from ``state.db`` rows, by Hermes row id."""
    found: dict[int, tuple[str, StoredMessage]] = {}
    for session_id, messages in all_messages(repo).items():
        for message in messages:
            hermes = message.extra["hermes"]
            if "spool_file" not in hermes:
                assert hermes["id"] not in found, "a row stored twice"
                found[hermes["id"]] = (session_id, message)
    return found


def by_spool_place(repo: SessionRepository) -> dict[tuple[str, int], tuple[str, StoredMessage]]:
    found = {}
    for session_id, messages in all_messages(repo).items():
        for message in messages:
            hermes = message.extra.get("hermes", {})
            if "spool_file" in hermes:
                found[hermes["spool_file"], hermes.get("index", 0)] = (session_id, message)
    return found


def decoded(content: Any) -> Any:
    if isinstance(content, str) and content.startswith("\x00json:"):
        return json.loads(content[len("\x00json:") :])
    return content


def assert_row_stored(
    row: dict[str, Any], stored: StoredMessage, moved: frozenset[str] = frozenset()
) -> None:
    """Every non-NULL column of ``row`` is in ``stored``: in its field, or in
    ``extra["hermes"]`` under its name; ``moved`` columns as their repr, moved aside."""
    hermes = stored.extra["hermes"]
    assert hermes["id"] == row["id"]
    assert hermes["timestamp"] == row["timestamp"]  # the exact REAL
    assert stored.timestamp == datetime.fromtimestamp(row["timestamp"], UTC)
    for column, value in row.items():
        if column in ("id", "session_id", "timestamp") or value is None:
            continue
        if column in moved:
            assert hermes["moved_aside"][column] == repr(value), column
        elif column == "content":
            assert stored.content == decoded(value)
        elif column == "tool_calls":
            assert stored.tool_calls == json.loads(value)
        elif column in FIELD_COLUMNS:
            assert getattr(stored, column) == value, column
        else:
            assert hermes[column] == value, column
    kept = {c for c, v in row.items() if v is not None and c not in FIELD_COLUMNS | {"session_id"}}
    added = {"id", "timestamp", "content_encoding", "moved_aside"}
    assert kept - {"id"} == set(hermes) - added, "columns missing or invented"
    if isinstance(row["content"], str) and row["content"].startswith("\x00json:"):
        assert hermes["content_encoding"] == "json"


def openai_without_provenance(message: StoredMessage) -> dict[str, Any]:
    wire = message.to_openai()
    wire.pop("hermes")
    return wire


# -- a current Hermes home ----------------------------------------------------------------


def test_every_row_arrives_with_every_column(
    modern: ModernHome, database_url: str, store: SessionRepository, tmp_path: Path
) -> None:
    s, db = modern, modern.db
    summary = run_import(database_url, s.home, tmp_path / "inbound.jsonl", expect=EXIT_ATTENTION)

    assert summary.schema_version == 30
    assert summary.rows_read == len(db.rows) == 22
    assert summary.inactive_rows == sum(row["active"] == 0 for row in db.rows) == 5
    assert summary.spool_messages_read == 6
    assert summary.messages_read == summary.messages_inserted == 28
    assert (summary.messages_already_present, summary.messages_changed) == (0, 0)
    assert summary.sessions_read == 4
    assert (summary.sessions_without_row, summary.sessions_only_in_spool) == (1, 1)
    assert summary.history_sessions == 1

    # Each row once, in its session (inactive rows in the #history companion), with every
    # column; the rows whose values could not be stored are checked below.
    stored = by_row_id(store)
    assert set(stored) == {row["id"] for row in db.rows}
    moved = {
        s.ids["b_bad_id"]: frozenset({"tool_call_id"}),
        s.ids["b_surrogate"]: frozenset({"content"}),
        s.ids["b_bad_calls"]: frozenset({"tool_calls"}),
        s.ids["cron_bad_utf8"]: frozenset({"content"}),
    }
    for row in db.rows:
        session_id, message = stored[row["id"]]
        expected = row["session_id"] + (HISTORY_SUFFIX if row["active"] == 0 else "")
        assert session_id == expected, row["id"]
        assert_row_stored(row, message, moved.get(row["id"], frozenset()))

    # Transcript order is Hermes' id order; the live transcript has only active rows.
    transcripts = all_messages(store)
    for session_id, messages in transcripts.items():
        ids = [m.extra["hermes"]["id"] for m in messages if "id" in m.extra["hermes"]]
        assert ids == sorted(ids), session_id
    live_a = [m.extra["hermes"]["id"] for m in transcripts[s.a]]
    assert live_a == [s.ids[n] for n in ("a_summary", "a_image_copy", "a_answer", "a_last")]
    history_a = [m.extra["hermes"]["id"] for m in transcripts[s.a + HISTORY_SUFFIX]]
    assert history_a == [s.ids[n] for n in ("a_user", "a_call", "a_tool", "a_image", "a_undone")]

    # What a gateway gets back: the OpenAI dict, tool calls and multimodal parts intact.
    image = stored[s.ids["a_image_copy"]][1].to_openai()
    assert image["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="},
    }
    calls = stored[s.ids["b_calls"]][1].to_openai()
    assert [call["id"] for call in calls["tool_calls"]] == ["call_a", "call_b"]
    assert calls["hermes"]["reasoning_content"] == "two searches in parallel"
    tool = stored[s.ids["b_tool_b"]][1].to_openai()
    assert (tool["role"], tool["tool_call_id"], tool["tool_name"]) == (
        "tool",
        "call_b",
        "web_search",
    )
    answer = stored[s.ids["a_answer"]][1]
    assert answer.platform_message_id == "tg-1001"
    assert json.loads(answer.extra["hermes"]["display_metadata"]) == {
        "edited": False,
        "chunks": [1, 2],
    }


def test_keys_follow_message_uid_and_the_compaction_copy_gets_its_own(
    modern: ModernHome, database_url: str, store: SessionRepository
) -> None:
    s = modern
    run_import(database_url, s.home, expect=EXIT_ATTENTION)
    stored = by_row_id(store)

    def key(name: str) -> Any:
        return stored[s.ids[name]][1].client_msg_uuid

    # A gateway that knows a message's uid can compute its key.
    assert key("a_user") == uid_key(s.uids["u1"])
    assert key("a_answer") == uid_key(s.uids["u5"])
    # In-place compaction copied a_image with its uid: the original keeps the uid's key,
    # the copy gets a key of its own, and both are stored.
    assert key("a_image") == uid_key(s.uids["u4"])
    assert key("a_image_copy") not in (key("a_image"), uid_key(s.uids["u4"]))
    spooled = by_spool_place(store)
    assert spooled[s.files["dump"], 1][1].client_msg_uuid == spool_key(s.files["dump"], 1)


def test_sessions_keep_every_column_and_the_compression_chain(
    modern: ModernHome, database_url: str, store: SessionRepository
) -> None:
    s, db = modern, modern.db
    run_import(database_url, s.home, expect=EXIT_ATTENTION)

    for session_id, row in db.sessions.items():
        session = store.get_session(session_id)
        hermes = session.metadata["hermes"]
        assert session.source == row["source"]
        assert session.user_id == row["user_id"]
        assert session.title == row["title"]
        assert session.model == row["model"]
        assert session.parent_session_id == row["parent_session_id"]
        assert session.started_at == datetime.fromtimestamp(row["started_at"], UTC)
        if row["ended_at"] is None:
            assert session.ended_at is None
        else:
            assert session.ended_at == datetime.fromtimestamp(row["ended_at"], UTC)
        assert session.end_reason == row["end_reason"]
        assert (session.input_tokens, session.output_tokens) == (
            row["input_tokens"],
            row["output_tokens"],
        )
        # Every other column, Hermes' own counters included, is in metadata["hermes"].
        for column, value in row.items():
            if column in SESSION_FIELD_COLUMNS or value is None:
                continue
            if column == "model_config" and session.model_settings is not None:
                assert session.model_settings == json.loads(value)
            else:
                assert hermes[column] == value, (session_id, column)

    # Dated by their own history (newest message, or end), not by the import.
    for session_id in [*db.sessions, s.a + HISTORY_SUFFIX]:
        session = store.get_session(session_id)
        times = [m.timestamp for m in store.load_transcript(session_id)]
        times += [t for t in (session.started_at, session.ended_at) if t is not None]
        assert session.last_active_at == max(times), session_id

    a, b, c = (store.get_session(i) for i in (s.a, s.b, s.c))
    assert a.system_prompt == s.prompt  # from system_prompts, by system_prompt_hash
    assert c.system_prompt == s.prompt
    assert b.system_prompt == "Inline system prompt of b"
    assert b.model_settings is None
    assert b.metadata["hermes"]["model_config"] == "{temperature: 0.2"  # not JSON: kept
    assert a.metadata["hermes"]["message_count"] == 9  # Hermes' count, not ours
    assert a.message_count == 4  # the live rows stored in a
    assert a.metadata["hermes"]["zz_future_flag"] == "kept"

    assert (a.end_reason, b.end_reason, c.ended_at) == ("compression", "compression", None)
    assert [x.id for x in store.session_chain(s.c)] == [s.a, s.b, s.c]
    assert store.resolve_tip(s.a).id == s.c  # never the #history companion
    history = store.get_session(s.a + HISTORY_SUFFIX)
    assert history.parent_session_id is None
    assert history.ended_at is not None
    assert history.metadata["hermes"]["history_of"] == s.a
    assert (history.source, history.user_id) == ("telegram", "42")
    whole = store.load_transcript(s.c, include_ancestors=True)
    assert [m.session_id for m in whole].count(s.a) == 4


def test_values_that_cannot_be_stored_are_moved_aside_and_reported(
    modern: ModernHome, database_url: str, store: SessionRepository
) -> None:
    s = modern
    summary = run_import(database_url, s.home, expect=EXIT_ATTENTION)
    stored = by_row_id(store)

    bad_id = stored[s.ids["b_bad_id"]][1]
    assert bad_id.tool_call_id is None
    assert bad_id.extra["hermes"]["moved_aside"] == {"tool_call_id": repr("call\x07bad")}
    assert bad_id.content == "result with a bad id"

    surrogate = stored[s.ids["b_surrogate"]][1]
    assert surrogate.content == [{"type": "text", "text": "bad \ufffd half"}]

    bad_calls = stored[s.ids["b_bad_calls"]][1]
    assert bad_calls.tool_calls is None
    assert bad_calls.extra["hermes"]["moved_aside"] == {"tool_calls": repr("[{broken")}

    bad_utf8 = stored[s.ids["cron_bad_utf8"]][1]
    assert bad_utf8.content == "hi\ufffd!"
    original = bad_utf8.extra["hermes"]["moved_aside"]["content"]
    assert original == repr("hi\udcff!")  # the byte 0xFF, recoverable

    reported = {(p.where, p.field, p.stored_as) for p in summary.moved_aside}
    assert reported == {
        (
            f"state.db messages.id={s.ids['b_bad_id']}",
            "tool_call_id",
            "extra.hermes.moved_aside.tool_call_id",
        ),
        (
            f"state.db messages.id={s.ids['b_surrogate']}",
            "content",
            "extra.hermes.moved_aside.content",
        ),
        (
            f"state.db messages.id={s.ids['b_bad_calls']}",
            "tool_calls",
            "extra.hermes.moved_aside.tool_calls",
        ),
        (
            f"state.db messages.id={s.ids['cron_bad_utf8']}",
            "content",
            "extra.hermes.moved_aside.content",
        ),
    }
    assert all(p.session_id for p in summary.moved_aside)


def test_unusable_ids_roles_and_numbers_are_replaced_and_kept_aside(
    store: SessionRepository, tmp_path: Path
) -> None:
    (tmp_path / "hermes").mkdir()
    db = HermesDB(tmp_path / "hermes" / "state.db", version=30)
    bad_session = db.session("bad\x01id", source="cli\nx", estimated_cost_usd=float("inf"))
    child = db.session("child", parent_session_id=bad_session)
    weird = db.message(bad_session, "narrator", "a role sessionrepo has not", token_count=1.5)
    db.message(child, "user", "hello")
    db.close()

    summary = import_hermes(tmp_path / "hermes", store)

    assert summary.messages_inserted == 2
    (stored_id,) = [s.id for s in store.list_sessions().sessions if s.id.startswith("hermes-")]
    session = store.get_session(stored_id)
    assert session.source == "unknown"
    aside = session.metadata["hermes"]["moved_aside"]
    assert aside["id"] == repr("bad\x01id")
    assert aside["source"] == repr("cli\nx")
    assert aside["estimated_cost_usd"] == repr(float("inf"))
    assert session.metadata["hermes"]["estimated_cost_usd"] is None
    assert store.get_session("child").parent_session_id == stored_id  # the link survives
    (message,) = store.load_transcript(stored_id)
    assert message.extra["hermes"]["id"] == weird
    assert (message.role, message.token_count) == ("system", None)
    assert message.extra["hermes"]["moved_aside"] == {"role": "'narrator'", "token_count": "1.5"}
    fields = {(p.session_id, p.field) for p in summary.moved_aside}
    assert fields == {
        (stored_id, "id"),
        (stored_id, "source"),
        (stored_id, "estimated_cost_usd"),
        ("child", "parent_session_id"),
        (stored_id, "role"),
        (stored_id, "token_count"),
    }


# -- the spool ----------------------------------------------------------------------------


def test_spool_payloads_of_every_kind(
    modern: ModernHome, database_url: str, store: SessionRepository, tmp_path: Path
) -> None:
    s = modern
    report = tmp_path / "reports" / "inbound.jsonl"
    summary = run_import(database_url, s.home, report, expect=EXIT_ATTENTION)

    assert summary.spool_files == {
        "shutdown_pending": 1,
        "overflow_tail": 2,
        "transcript_cap_drop": 4,
        "agent_history_dump": 1,
        "unparseable": 2,
    }
    # Kinds 3 and 4 join their session after its state.db rows, in (ts, seq, name)
    # order (the file names sort the other way), every key of each dict kept.
    c = store.load_transcript(s.c)
    assert c[0].extra["hermes"]["id"] == s.ids["c_user"]
    order = [(m.extra["hermes"]["spool_file"], m.extra["hermes"].get("index", 0)) for m in c[1:]]
    assert order == [
        (s.files["drop_call"], 0),
        (s.files["drop_result"], 0),
        (s.files["dump"], 0),
        (s.files["dump"], 1),
    ]
    for message, name in zip(
        c[1:], ("drop_call", "drop_result", "dump_answer", "dump_user"), strict=True
    ):
        assert openai_without_provenance(message) == s.spooled[name]
    call = c[1]
    assert call.tool_calls == s.spooled["drop_call"]["tool_calls"]
    assert call.reasoning == "look for restaurants"
    assert call.extra["hermes"]["kind"] == 3
    assert c[2].tool_call_id == "call_dinner"
    # A dict's own timestamp is the message's; else the payload's ts.
    assert c[3].timestamp == datetime.fromtimestamp(s.spooled["dump_answer"]["timestamp"], UTC)
    assert c[1].timestamp == datetime.fromtimestamp(c[1].extra["hermes"]["ts"], UTC)

    # A session known only from the spool is created; a spooled message equal to a stored
    # row is stored anyway and reported.
    assert [m.content for m in store.load_transcript(s.spool_only)] == ["hello from a lost session"]
    assert [p.where for p in summary.possible_duplicates] == [
        f"pending_messages/{s.files['replayed']} data.message"
    ]

    # Kinds 1 and 2: not transcript messages; written out for re-delivery, in order.
    assert summary.inbound_messages == 3
    assert summary.inbound_report == str(report)
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    assert [line["file"] for line in lines] == [
        s.files["pending"],
        s.files["tail_0"],
        s.files["tail_1"],
    ]
    assert [line["text"] for line in lines] == [
        "are you still there?",
        "first queued line",
        "second queued line",
    ]
    assert lines[0]["payload"] == json.loads((s.spool.path / s.files["pending"]).read_bytes())
    contents = [m.content for ms in all_messages(store).values() for m in ms]
    assert "are you still there?" not in contents
    assert "first queued line" not in contents

    # Files that are not payloads are reported and left alone.
    assert {f.name for f in summary.unparseable_files} == {s.files["broken"], s.files["unknown"]}
    assert all(f.error for f in summary.unparseable_files)
    assert (s.spool.path / s.files["broken"]).exists()


def test_import_again_inserts_nothing(
    modern: ModernHome, database_url: str, store: SessionRepository, tmp_path: Path
) -> None:
    report = tmp_path / "inbound.jsonl"
    first = run_import(database_url, modern.home, report, expect=EXIT_ATTENTION)
    before = all_messages(store)
    written = report.read_bytes()

    again = run_import(database_url, modern.home, report, expect=EXIT_ATTENTION)

    assert again.messages_inserted == 0
    assert again.messages_already_present == first.messages_inserted == 28
    assert (again.messages_changed, again.sessions_new, again.history_sessions) == (0, 0, 0)
    assert all_messages(store) == before
    assert report.read_bytes() == written
    # A copy of the home elsewhere is the same source: keys do not depend on the path.
    copy = tmp_path / "elsewhere" / "hermes-copy"
    shutil.copytree(modern.home, copy)
    assert run_import(database_url, copy, expect=EXIT_ATTENTION).messages_inserted == 0
    assert all_messages(store) == before


def test_the_source_is_never_modified(
    modern: ModernHome, database_url: str, tmp_path: Path
) -> None:
    # The gateway still has state.db open (WAL): the import reads alongside it.
    before = snapshot(modern.home)
    run_import(database_url, modern.home, tmp_path / "inbound.jsonl", expect=EXIT_ATTENTION)
    after = snapshot(modern.home)
    # The -shm file is SQLite's shared-memory index, where readers register themselves.
    assert {k: v for k, v in after.items() if not k.endswith("-shm")} == {
        k: v for k, v in before.items() if not k.endswith("-shm")
    }


def test_a_stopped_gateways_home_keeps_its_files(database_url: str, tmp_path: Path) -> None:
    home = build_modern_home(tmp_path / "hermes")
    home.db.close()  # the gateway stopped: SQLite checkpointed and removed its -wal
    before = snapshot(home.home)
    assert "state.db-wal" not in before
    run_import(database_url, home.home, tmp_path / "inbound.jsonl", expect=EXIT_ATTENTION)
    after = snapshot(home.home)
    # Every file is unchanged; a read-only reader of a WAL database leaves SQLite's
    # (empty) side files behind, and nothing else.
    assert {k: after[k] for k in before} == before
    assert set(after) - set(before) <= {"state.db-wal", "state.db-shm"}
    assert after.get("state.db-wal", (b"",))[0] == b""


def test_a_gateway_writing_during_the_import(modern: ModernHome, store: SessionRepository) -> None:
    """The import reads one snapshot: rows written meanwhile come with the next run."""
    s = modern
    written: list[int] = []
    seen = 0

    def progress(count: int) -> None:
        nonlocal seen
        seen += count
        if not written:
            written.append(s.db.message(s.c, "assistant", "written during the import"))

    summary = import_hermes(s.home, store, progress=progress, batch_size=2)
    assert summary.rows_read == len(s.db.rows) - 1
    assert seen == summary.messages_read  # the progress calls add up

    again = import_hermes(s.home, store)
    assert again.messages_inserted == 1
    assert store.load_transcript(s.c)[-1].content == "written during the import"


# -- re-runs on a changed source, failures ------------------------------------------------


def test_rows_hermes_changed_since_an_earlier_import_are_reported(
    modern: ModernHome, database_url: str, store: SessionRepository
) -> None:
    s = modern
    run_import(database_url, s.home, expect=EXIT_ATTENTION)
    # Hermes compacts c in place and someone edits the cron answer.
    s.db.execute("UPDATE messages SET active = 0, compacted = 1 WHERE id = ?", s.ids["c_user"])
    s.db.message(s.c, "user", "Thanks! And dinner?")
    s.db.execute("UPDATE messages SET content = 'Edited.' WHERE id = ?", s.ids["cron_answer"])

    again = run_import(database_url, s.home, expect=EXIT_ATTENTION)

    assert again.messages_inserted == 2  # the copy, and the archived row in c#history
    assert [p.where for p in again.changed] == [f"state.db messages.id={s.ids['cron_answer']}"]
    assert [p.where for p in again.archived_since_import] == [
        f"state.db messages.id={s.ids['c_user']}"
    ]
    cron = {m.extra["hermes"].get("id"): m for m in store.load_transcript(s.cron)}
    assert cron[s.ids["cron_answer"]].content == "Nothing new today."  # stored row kept


def test_a_message_the_store_refuses_is_reported_and_the_rest_stored(
    modern: ModernHome, store: SessionRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = modern
    big = s.db.message(s.cron, "assistant", "x" * 5000)
    monkeypatch.setattr("sessionrepo.store.codec.MAX_MESSAGE_BYTES", 4096)  # fault injection

    summary = import_hermes(s.home, store)

    assert summary.messages_rejected == 1
    assert [p.where for p in summary.rejected] == [f"state.db messages.id={big}"]
    assert summary.needs_attention
    assert summary.messages_inserted == summary.messages_read - 1
    cron = [m.extra["hermes"].get("id") for m in store.load_transcript(s.cron)]
    assert big not in cron
    assert s.ids["cron_bad_utf8"] in cron  # the rest of its batch


def test_a_store_failure_stops_the_import_and_a_rerun_completes_it(
    modern: ModernHome,
    database_url: str,
    store: SessionRepository,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = modern
    calls = 0
    append = SessionRepository.append

    def failing(self: SessionRepository, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls >= 3:  # down from the third batch on, until the test says otherwise
            raise BackendUnavailable("the database went away", code="57P01")
        return append(self, *args, **kwargs)

    monkeypatch.setattr(SessionRepository, "append", failing)
    with pytest.raises(HermesImportError, match="run it again") as caught:
        import_hermes(s.home, store)
    partial = caught.value.summary.messages_inserted
    assert 0 < partial < 28

    result = invoke("--url", database_url, str(s.home))  # still failing: one clean line
    assert result.exit_code == 1
    error = result.stderr.splitlines()[-1]  # after the progress bar's label
    assert error.startswith("Error: the import stopped after")
    assert "run it again" in error

    monkeypatch.setattr(SessionRepository, "append", append)
    done = run_import(database_url, s.home, expect=EXIT_ATTENTION)
    assert done.messages_already_present + done.messages_inserted == 28
    assert len(by_row_id(store)) == len(s.db.rows)


# -- an old Hermes ------------------------------------------------------------------------


def test_a_version_2_state_db(database_url: str, store: SessionRepository, tmp_path: Path) -> None:
    v2 = build_v2_state_db(tmp_path / "old-hermes")
    v2.db.close()
    before = snapshot(v2.path.parent)

    summary = run_import(database_url, v2.path)

    assert (summary.schema_version, summary.spool_dir, summary.needs_attention) == (2, None, False)
    assert summary.messages_inserted == len(v2.db.rows) == 5
    stored = by_row_id(store)
    for row in v2.db.rows:
        session_id, message = stored[row["id"]]
        assert session_id == row["session_id"]
        assert_row_stored(row, message)
    assert set(stored[v2.ids["call"]][1].extra["hermes"]) == {"id", "timestamp"}
    parent = store.get_session(v2.parent)
    assert parent.system_prompt == "You are an old Hermes."
    assert parent.model_settings == {"temperature": 1}
    assert parent.metadata["hermes"]["message_count"] == 4
    assert store.resolve_tip(v2.parent).id == v2.child
    assert not any(sid.endswith(HISTORY_SUFFIX) for sid in all_messages(store))
    # A rollback-journal database: not one byte or file of the source changes.
    assert snapshot(v2.path.parent) == before
    assert run_import(database_url, v2.path).messages_inserted == 0


def test_a_state_db_given_alone_says_its_spool_was_not_read(
    database_url: str, tmp_path: Path
) -> None:
    v2 = build_v2_state_db(tmp_path / "hermes")
    Spool(tmp_path / "hermes").history_dump(v2.child, [{"role": "user", "content": "x"}])
    summary = run_import(database_url, v2.path)
    assert summary.spool_not_read == str(tmp_path / "hermes" / "pending_messages")
    assert summary.spool_messages_read == 0
    result = invoke("--url", database_url, str(v2.path))
    assert "was not read" in result.stdout


# -- the command --------------------------------------------------------------------------


def test_the_text_summary(modern: ModernHome, database_url: str, tmp_path: Path) -> None:
    result = invoke(
        "--url", database_url, "--inbound-report", str(tmp_path / "i.jsonl"), str(modern.home)
    )
    assert result.exit_code == EXIT_ATTENTION, result.output
    out = result.stdout
    assert "28 inserted, 0 already present, 0 changed, 0 rejected" in out
    assert "2 overflow tail" in out
    assert "1 agent-history dump" in out
    assert f"{modern.files['broken']}: cannot be parsed" in out
    assert "i.jsonl (re-deliver them)" in out
    assert "extra.hermes.moved_aside.tool_call_id" in out


def test_the_default_inbound_report_is_named_after_the_spool(
    modern: ModernHome, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    first = run_import(database_url, modern.home, expect=EXIT_ATTENTION)
    assert first.inbound_report is not None
    path = Path(first.inbound_report)
    assert path.parent == tmp_path
    assert path.name.startswith("hermes-inbound-")
    with open_hermes(modern.home) as source:
        assert source.total_messages == 28
    second = run_import(database_url, modern.home, expect=EXIT_ATTENTION)
    assert second.inbound_report == first.inbound_report


def test_under_the_sessionrepo_group_the_groups_url_is_used(
    modern: ModernHome, database_url: str, store: SessionRepository, tmp_path: Path
) -> None:
    """Registered with ``main.add_command``: ``sessionrepo --url URL import-hermes HOME``
    must import into URL even when SESSIONREPO_DATABASE_URL names another store."""

    @click.group()
    @click.option("--url", envvar="SESSIONREPO_DATABASE_URL")
    def group(url: str | None) -> None:
        """A stand-in for ``sessionrepo``."""

    group.add_command(command)
    elsewhere = f"sqlite:///{tmp_path / 'not-this-one.db'}"
    result = CliRunner().invoke(
        group,
        ["--url", database_url, "import-hermes", "--json", str(modern.home)],
        env={"SESSIONREPO_DATABASE_URL": elsewhere},
    )
    assert result.exit_code == EXIT_ATTENTION, result.output
    assert HermesImportSummary.model_validate_json(result.stdout).messages_inserted == 28
    assert len(by_row_id(store)) == len(modern.db.rows)
    assert not (tmp_path / "not-this-one.db").exists()


def test_help_has_an_example() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    assert "Example:" in result.stdout
    assert "import-hermes ~/.hermes" in result.stdout


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("not-a-db", "cannot read"),
        ("empty-dir", "is not a Hermes home"),
        ("other-sqlite", "is not a Hermes state.db"),
    ],
)
def test_an_unreadable_source_is_one_clean_line(setup: str, expected: str, tmp_path: Path) -> None:
    target = tmp_path / "source"
    if setup == "not-a-db":
        target.write_text("hello, not SQLite")
    elif setup == "empty-dir":
        target.mkdir()
    else:
        import sqlite3

        with sqlite3.connect(target) as conn:
            conn.execute("CREATE TABLE t (x)")
    result = invoke("--url", f"sqlite:///{tmp_path / 'store.db'}", str(target))
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    line = result.stderr.strip()
    assert "\n" not in line
    assert line.startswith("Error: ")
    assert expected in line


def test_a_store_url_password_is_never_printed(modern: ModernHome) -> None:
    result = invoke("--url", "postgresql://gateway:pa55-w0rd@127.0.0.1:1/chat", str(modern.home))
    assert result.exit_code == 1
    assert "pa55-w0rd" not in result.output
    assert result.stderr.startswith("Error: ")


def test_a_missing_path_is_a_usage_error(tmp_path: Path) -> None:
    result = invoke(str(tmp_path / "nowhere"))
    assert result.exit_code == 2
