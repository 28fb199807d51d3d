"""``sessionrepo import-hermes``: a Hermes gateway's home, in the current format (schema
version 31), moves over with nothing dropped, nothing doubled, the source untouched,
message by message what Hermes' own reader presents, on both backends.

The Hermes homes are built by the tests (``support.hermes_fixtures``): the old (version 2) and
the current column sets, in-place compaction (inactive rows, a copied ``message_uid``), a
rewind, ``session_meta`` and hidden rows, a compression chain, tool calls, multimodal
content, a BLOB column, values sessionrepo cannot store as they are, a spool with the four
payload kinds (the agent-history dump with persisted entries), ``.json.bad``, a BOM, a
half-written ``.tmp``, files that are not payloads, profiles, a killed gateway's WAL, and
Hermes' own restart (its spool replayed into ``state.db``, the files deleted).
"""

from __future__ import annotations

import ast
import base64
import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from sessionrepo import BackendUnavailable, SessionRepository, StoredMessage, open_repository
from sessionrepo.cli.hermes import EXIT_ATTENTION, SHOWN
from sessionrepo.cli.hermes import import_hermes as command
from sessionrepo.importers.hermes import (
    HermesImportError,
    HermesImportReport,
    HermesImportSummary,
    HermesSourceError,
    content_key,
    copy_key,
    import_hermes,
    open_hermes,
    row_state,
    uid_key,
)

from support.hermes_fixtures import (
    HermesDB,
    ModernHome,
    Spool,
    build_modern_home,
    build_profile,
    build_v2_state_db,
    conversation,
    decoded,
    hermes_restart,
    hermes_view,
    kill_a_writing_gateway,
    snapshot,
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


def run_report(url: str, source: Path, *args: str, expect: int = 0) -> HermesImportReport:
    """``import-hermes --json`` through the command; the report it printed."""
    result = invoke("--url", url, "--json", *args, str(source))
    assert result.exit_code == expect, result.output
    return HermesImportReport.model_validate_json(result.stdout)


def run_import(url: str, source: Path, *args: str, expect: int = 0) -> HermesImportSummary:
    """The summary of the (root) home of one ``import-hermes --json`` run."""
    return run_report(url, source, *args, expect=expect).homes[0]


@pytest.fixture(autouse=True)
def _nothing_in_the_cwd(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    # The command must never drop a file where it runs.
    cwd = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(cwd)
    yield
    assert list(cwd.iterdir()) == []


@pytest.fixture
def modern(tmp_path: Path) -> Iterator[ModernHome]:
    home = build_modern_home(tmp_path / "hermes")
    yield home
    home.db.close()


@pytest.fixture
def clean(tmp_path: Path) -> Iterator[ModernHome]:
    """A current home with nothing that needs a person (no junk files in the spool)."""
    home = build_modern_home(tmp_path / "hermes", junk=False)
    yield home
    home.db.close()


@pytest.fixture
def store(database_url: str) -> Iterator[SessionRepository]:
    repository = open_repository(database_url)
    yield repository
    repository.close()


def all_messages(
    repo: SessionRepository, *, include_retracted: bool = False
) -> dict[str, list[StoredMessage]]:
    """Every stored transcript (the live one, or every message), by session id."""
    found: dict[str, list[StoredMessage]] = {}
    cursor = None
    while True:
        page = repo.list_sessions(limit=100, cursor=cursor)
        for session in page.sessions:
            found[session.id] = repo.load_transcript(
                session.id, include_retracted=include_retracted
            )
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor


def provenance(message: StoredMessage) -> dict[str, Any]:
    hermes: dict[str, Any] = message.extra.get("hermes", {})
    return hermes


def by_row_id(repo: SessionRepository) -> dict[int, tuple[str, StoredMessage]]:
    """Stored messages that came from ``state.db`` rows, by Hermes row id (the retracted
    ones too)."""
    found: dict[int, tuple[str, StoredMessage]] = {}
    for session_id, messages in all_messages(repo, include_retracted=True).items():
        for message in messages:
            hermes = provenance(message)
            if "spool_file" not in hermes:
                assert hermes["id"] not in found, "a row stored twice"
                found[hermes["id"]] = (session_id, message)
    return found


def by_spool_place(repo: SessionRepository) -> dict[tuple[str, int], tuple[str, StoredMessage]]:
    found = {}
    for session_id, messages in all_messages(repo).items():
        for message in messages:
            hermes = provenance(message)
            if "spool_file" in hermes:
                found[hermes["spool_file"], hermes.get("index", 0)] = (session_id, message)
    return found


def presented(message: StoredMessage) -> dict[str, Any]:
    """A stored message as the conversation fields Hermes' reader has, with the values
    moved aside put back (they are kept as their repr)."""
    found = conversation(message.to_openai()) | {"timestamp": message.timestamp}
    for field, text in provenance(message).get("moved_aside", {}).items():
        value = ast.literal_eval(text)
        if field == "content":
            value = decoded(value)
        found[field] = value
    return found


def without_dumps(messages: list[StoredMessage]) -> list[StoredMessage]:
    """What Hermes never puts in a conversation, though sessionrepo keeps it: kind-4
    entries (left for manual recovery) and ``.json.bad`` payloads (its database refused
    them)."""
    return [
        m
        for m in messages
        if provenance(m).get("kind") != 4 and not provenance(m).get("refused_by_gateway_db")
    ]


def assert_row_stored(
    row: dict[str, Any], stored: StoredMessage, moved: frozenset[str] = frozenset()
) -> None:
    """Every non-NULL column of ``row`` is in ``stored``: in its field, or in
    ``extra["hermes"]`` under its name (a BLOB as its base64); ``moved`` columns as their
    repr, moved aside."""
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
        elif column == "role" and value == "session_meta":
            assert (stored.role, hermes["role"]) == ("system", "session_meta")
        elif column in FIELD_COLUMNS:
            assert getattr(stored, column) == value, column
        elif isinstance(value, bytes):
            assert base64.b64decode(hermes[column]["base64"]) == value, column  # reversible
        else:
            assert hermes[column] == value, column
    kept = {c for c, v in row.items() if v is not None and c not in FIELD_COLUMNS | {"session_id"}}
    added = {"id", "timestamp", "content_encoding", "moved_aside", "state", "role"}
    assert kept - {"id"} == set(hermes) - added, "columns missing or invented"
    assert hermes.get("state") == row_state(row)
    if isinstance(row["content"], str) and row["content"].startswith("\x00json:"):
        assert hermes["content_encoding"] == "json"


def openai_without_provenance(message: StoredMessage) -> dict[str, Any]:
    wire = message.to_openai()
    wire.pop("hermes")
    return wire


# -- a current Hermes home ----------------------------------------------------------------


def test_every_row_arrives_with_every_column(
    modern: ModernHome, database_url: str, store: SessionRepository
) -> None:
    s, db = modern, modern.db
    summary = run_import(database_url, s.home, expect=EXIT_ATTENTION)  # the junk files

    assert summary.schema_version == 31
    assert summary.profile == "default"
    assert summary.rows_read == len(db.rows) == 24
    states = [row_state(row) for row in db.rows]
    assert summary.set_aside_rows == {"archived": 4, "hidden": 1, "rewound": 1, "session_meta": 1}
    assert summary.inactive_rows == sum(row["active"] == 0 for row in db.rows) == 5
    # 3 inbound, 5 cap drops, 2 of the dump's 3 entries (one is already in state.db).
    assert summary.spool_messages_read == 10
    assert summary.messages_read == 34
    # The cap drop the gateway's replay already stored is the cron row: same uid, one key.
    assert (summary.messages_inserted, summary.messages_already_present) == (33, 1)
    assert summary.messages_seen_by_another_route == 1
    assert summary.messages_changed == 0
    assert summary.possible_duplicates == []
    assert summary.sessions_read == 4
    assert (summary.sessions_without_row, summary.sessions_only_in_spool) == (1, 1)

    # Each row once, in its own session (the rows that are not conversation retracted
    # there), with every column; the rows whose values could not be stored are checked
    # below.
    stored = by_row_id(store)
    assert set(stored) == {row["id"] for row in db.rows}
    moved = {
        s.ids["b_bad_id"]: frozenset({"tool_call_id"}),
        s.ids["b_surrogate"]: frozenset({"content"}),
        s.ids["b_bad_calls"]: frozenset({"tool_calls"}),
        s.ids["cron_bad_utf8"]: frozenset({"content"}),
    }
    for row, state in zip(db.rows, states, strict=True):
        session_id, message = stored[row["id"]]
        assert session_id == row["session_id"], row["id"]
        assert message.superseded == ("retracted" if state else None), row["id"]
        assert_row_stored(row, message, moved.get(row["id"], frozenset()))

    # Transcript order is Hermes' id order, the retracted rows where Hermes had them; the
    # live transcript has only conversation.
    transcripts = all_messages(store)
    everything = all_messages(store, include_retracted=True)
    assert set(everything) == set(transcripts) == {*db.sessions, s.ghost, s.spool_only}
    for session_id, messages in everything.items():
        ids = [m.extra["hermes"]["id"] for m in messages if "id" in m.extra["hermes"]]
        assert ids == [r["id"] for r in db.rows if r["session_id"] == session_id], session_id
        assert [m.seq for m in messages] == list(range(1, len(messages) + 1))
    live_a = [m.extra["hermes"]["id"] for m in transcripts[s.a]]
    assert live_a == [s.ids[n] for n in ("a_summary", "a_image_copy", "a_answer", "a_last")]
    retracted_a = [m for m in everything[s.a] if m.superseded is not None]
    assert [provenance(m)["id"] for m in retracted_a] == [
        s.ids[n] for n in ("a_user", "a_call", "a_tool", "a_image", "a_undone", "a_meta")
    ]
    assert [provenance(m)["state"] for m in retracted_a] == [
        "archived",
        "archived",
        "archived",
        "archived",
        "rewound",
        "session_meta",
    ]
    assert {m.superseded for m in retracted_a} == {"retracted"}
    retracted_c = [m for m in everything[s.c] if m.superseded is not None]
    assert [provenance(m)["id"] for m in retracted_c] == [s.ids["c_hidden"]]

    # The BLOB is stored as its bytes, not moved aside.
    assert not any(p.field == "display_identity" for p in summary.moved_aside)

    # What a gateway gets back: the OpenAI dict, tool calls and multimodal parts intact.
    image = stored[s.ids["a_image_copy"]][1].to_openai()
    assert image["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="},
    }
    calls = stored[s.ids["b_calls"]][1].to_openai()
    assert [call["id"] for call in calls["tool_calls"]] == ["call_a", "call_b"]
    assert calls["hermes"]["reasoning_content"] == "two searches in parallel"
    answer = stored[s.ids["a_answer"]][1]
    assert answer.platform_message_id == "tg-1001"
    assert json.loads(answer.extra["hermes"]["display_metadata"]) == {
        "edited": False,
        "chunks": [1, 2],
    }


def test_each_live_transcript_is_what_hermes_presents_message_by_message(
    clean: ModernHome, database_url: str, store: SessionRepository
) -> None:
    """Before a Hermes restart, a live transcript is Hermes' view plus the spool Hermes
    will replay into it; after the restart, exactly Hermes' view; the store is the same
    both times. (Kind-4 entries are for manual recovery: Hermes shows them nowhere.)"""
    s = clean
    run_import(database_url, s.home)
    stored = all_messages(store)
    everything = all_messages(store, include_retracted=True)
    sessions = [*s.db.sessions, s.ghost, s.spool_only]
    rows = list(s.db.rows)

    s.db.close()  # the gateway stops, starts again and replays its spool
    assert hermes_restart(s.home)
    again = run_import(database_url, s.home)

    assert again.messages_inserted == 0
    assert all_messages(store) == stored
    for session_id in sessions:
        expected = hermes_view(s.home / "state.db", session_id)
        if session_id == s.cron:
            # Hermes' replay stored the cap drop its crashed replay had stored already:
            # its view has the message twice; the store, once.
            twice = [m for m in expected if m["content"] == s.spooled["replayed"]["content"]]
            assert len(twice) == 2
            expected.remove(twice[1])
        live = [presented(m) for m in without_dumps(stored[session_id])]
        assert live == expected, session_id
        assert len(live) == len(expected) > 0
    # Every row is stored, in its own session in id order, the ones Hermes' reader does
    # not show retracted there; no companion session.
    assert all_messages(store, include_retracted=True) == everything
    assert sorted(everything) == sorted(sessions)
    marked: set[tuple[str, int]] = set()
    for session_id in sessions:
        from_rows = [m for m in everything[session_id] if "spool_file" not in provenance(m)]
        own = [row for row in rows if row["session_id"] == session_id]
        assert [provenance(m)["id"] for m in from_rows] == [row["id"] for row in own]
        for row, message in zip(own, from_rows, strict=True):
            assert message.superseded == ("retracted" if row_state(row) else None), row["id"]
            if message.superseded:
                marked.add((session_id, message.seq))
    assert len(marked) == 7
    # Search finds none of them (after catching up, too), and finds the conversation.
    store.catch_up_search_index()
    for query in ("oops wrong chat", "budget note", "sunny", "title_set"):
        assert store.search(query) == [], query
    tram = [provenance(m)["id"] for m in stored[s.a] if "tram" in str(m.content)]
    assert len(tram) == 2
    hits = {(hit.session_id, hit.seq) for hit in store.search("tram")}
    assert hits == {(s.a, m.seq) for m in stored[s.a] if "tram" in str(m.content)}
    for session_id, messages in everything.items():
        for message in messages:
            if message.superseded and isinstance(message.content, str):
                words = " ".join(re.findall(r"[^\W_]+", message.content))
                hits = store.search(words, session_id=session_id)
                assert not {(h.session_id, h.seq) for h in hits} & marked, message.content
    # Tool calls and multimodal parts are in the comparison.
    assert any(m["tool_calls"] for m in hermes_view(s.home / "state.db", s.c))
    assert any(isinstance(m["content"], list) for m in hermes_view(s.home / "state.db", s.a))


def test_keys_follow_message_uid_whatever_route_and_compaction_copies_get_their_own(
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
    assert key("a_image_copy") == copy_key(s.uids["u4"], 1)
    # A spooled message is keyed by its uid too: the same key once Hermes replays it.
    spooled = by_spool_place(store)
    dump_answer = spooled[s.files["dump"], 1][1]
    assert dump_answer.client_msg_uuid == uid_key(s.spooled["dump_answer"]["message_uid"])
    drop = spooled[s.files["drop_call"], 0][1]
    assert drop.client_msg_uuid == uid_key(s.spooled["drop_call"]["message_uid"])
    # A row without a uid: its session, role, content and rank among equal ones.
    bad_utf8 = key("cron_bad_utf8")
    assert bad_utf8 == content_key(s.cron, "assistant", "hi\udcff!", 0)


def test_sessions_keep_every_column_the_profile_and_the_compression_chain(
    modern: ModernHome, database_url: str, store: SessionRepository
) -> None:
    s, db = modern, modern.db
    run_import(database_url, s.home, expect=EXIT_ATTENTION)

    for session_id, row in db.sessions.items():
        session = store.get_session(session_id)
        hermes = session.metadata["hermes"]
        assert hermes["profile"] == "default"
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
        for column, value in row.items():
            if column in SESSION_FIELD_COLUMNS or value is None:
                continue
            if column == "model_config" and session.model_settings is not None:
                assert session.model_settings == json.loads(value)
            else:
                assert hermes[column] == value, (session_id, column)

    # Dated by their own history (newest message, or end), not by the import.
    for session_id in db.sessions:
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
    assert a.metadata["hermes"]["auto_archived"] == 0  # a version 31 column

    assert (a.end_reason, b.end_reason, c.ended_at) == ("compression", "compression", None)
    assert [x.id for x in store.session_chain(s.c)] == [s.a, s.b, s.c]
    assert store.resolve_tip(s.a).id == s.c
    for other in (s.ghost, s.spool_only):
        assert store.get_session(other).metadata["hermes"]["profile"] == "default"


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

    reported = {(p.where, p.field) for p in summary.moved_aside}
    assert reported == {
        (f"state.db messages.id={s.ids['b_bad_id']}", "tool_call_id"),
        (f"state.db messages.id={s.ids['b_surrogate']}", "content"),
        (f"state.db messages.id={s.ids['b_bad_calls']}", "tool_calls"),
        (f"state.db messages.id={s.ids['cron_bad_utf8']}", "content"),
    }
    assert all(p.session_id and p.stored_as for p in summary.moved_aside)


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
    modern: ModernHome, database_url: str, store: SessionRepository
) -> None:
    s = modern
    summary = run_import(database_url, s.home, expect=EXIT_ATTENTION)

    assert summary.spool_files == {
        "shutdown_pending": 1,
        "overflow_tail": 2,
        "transcript_cap_drop": 5,
        "agent_history_dump": 1,
        "unparseable": 2,
    }
    # c: its row, then what a restart replays in (ts, seq, file) order (the file names
    # sort the other way), kinds 1 and 2 as user messages, then the dump's unsaved entries.
    c = store.load_transcript(s.c)
    assert provenance(c[0])["id"] == s.ids["c_user"]
    order = [(provenance(m)["spool_file"], provenance(m).get("index", 0)) for m in c[1:]]
    assert order == [
        (s.files["drop_call"], 0),
        (s.files["drop_result"], 0),
        (s.files["pending"], 0),
        (s.files["tail_0"], 0),
        (s.files["tail_1"], 0),
        (s.files["dump"], 1),
        (s.files["dump"], 2),
    ]
    for message, name in zip(
        [c[1], c[2], c[6], c[7]],
        ("drop_call", "drop_result", "dump_answer", "dump_user"),
        strict=True,
    ):
        assert openai_without_provenance(message) == s.spooled[name]
    call = c[1]
    assert call.tool_calls == s.spooled["drop_call"]["tool_calls"]
    assert call.reasoning == "look for restaurants"
    assert provenance(call)["kind"] == 3
    assert c[2].tool_call_id == "call_dinner"
    assert c[6].timestamp == datetime.fromtimestamp(s.spooled["dump_answer"]["timestamp"], UTC)
    assert c[1].timestamp == datetime.fromtimestamp(provenance(c[1])["ts"], UTC)

    # Inbound user text is a user message of the session Hermes gives it to: data.session_id,
    # or the routing key (gateway_routing names a) followed to the tip of the chain (c).
    inbound = c[3:6]
    assert [(m.role, m.content) for m in inbound] == [
        ("user", "are you still there?"),
        ("user", "first queued line"),
        ("user", "second queued line"),
    ]
    for message in inbound:
        assert message.timestamp == datetime.fromtimestamp(provenance(message)["ts"], UTC)
    assert provenance(inbound[0])["data"]["sender_name"] == "Ana"
    assert (summary.inbound_messages, summary.inbound_inserted) == (3, 3)
    assert summary.inbound_undelivered == []

    # The dump's entry already in state.db is skipped and said so, not a "duplicate".
    assert [p.where for p in summary.dump_entries_persisted] == [
        f"pending_messages/{s.files['dump']} messages[0]"
    ]
    assert summary.possible_duplicates == []

    # A session known only from the spool (its file has a BOM) is created; a .json.bad
    # payload is imported; the half-written .tmp is noted, not read.
    assert [m.content for m in store.load_transcript(s.spool_only)] == ["hello from a lost session"]
    cron = store.load_transcript(s.cron)
    refused = [m for m in cron if provenance(m).get("spool_file") == s.files["refused"]]
    assert [m.content for m in refused] == ["digest: 0 items"]
    assert provenance(refused[0])["refused_by_gateway_db"] is True
    assert [f.refused_by_gateway_db for f in summary.files if f.name == s.files["refused"]] == [
        True
    ]
    assert s.files["tmp"] not in {f.name for f in summary.files}
    assert any(p.where.endswith(s.files["tmp"]) for p in summary.notes)

    # Files that are not payloads are reported and left alone: they need a person.
    assert {f.name for f in summary.unparseable_files} == {s.files["broken"], s.files["unknown"]}
    assert all(f.error for f in summary.unparseable_files)
    assert summary.needs_attention
    assert (s.spool.path / s.files["broken"]).exists()

    # The delegation result Hermes never delivered is mentioned, with its session.
    assert [(p.where, p.session_id) for p in summary.pending_delegations] == [
        ("state.db async_delegations delegation_id='dlg-1'", s.c)
    ]
    assert "(state 'completed')" in summary.pending_delegations[0].problem


def test_inbound_text_no_session_takes_needs_a_person(
    database_url: str, store: SessionRepository, tmp_path: Path
) -> None:
    home = tmp_path / "hermes"
    home.mkdir()
    db = HermesDB(home / "state.db")
    db.session("s1", session_key="agent:main:cli")
    db.message("s1", "user", "hi")
    db.close()
    spool = Spool(home)
    lost = spool.shutdown_pending("agent:main:nowhere", "anyone?", 1_800_000_000)
    spool.shutdown_pending("agent:main:cli", "routed", 1_800_000_001)

    summary = run_import(database_url, home, expect=EXIT_ATTENTION)

    assert [p.where for p in summary.inbound_undelivered] == [f"pending_messages/{lost}"]
    assert [m.content for m in store.load_transcript("s1")] == ["hi", "routed"]
    assert (spool.path / lost).exists()


def test_dump_entries_marked_persisted(
    database_url: str, store: SessionRepository, tmp_path: Path
) -> None:
    """Without a uid, ``_db_persisted`` is trusted; with one, state.db must hold it."""
    home = tmp_path / "hermes"
    home.mkdir()
    db = HermesDB(home / "state.db")
    db.session("s1")
    db.message("s1", "user", "hi", message_uid="a" * 32)
    db.close()
    dump = Spool(home).history_dump(
        "s1",
        [
            {"role": "user", "content": "hi", "_db_persisted": True, "message_uid": "a" * 32},
            {"role": "assistant", "content": "old gateway", "_db_persisted": True},
            {
                "role": "assistant",
                "content": "claims",
                "_db_persisted": True,
                "message_uid": "b" * 32,
            },
            {"role": "user", "content": "unsaved"},
        ],
    )

    summary = run_import(database_url, home)

    assert [p.where.rsplit(" ", 1)[1] for p in summary.dump_entries_persisted] == [
        "messages[0]",
        "messages[1]",
    ]
    assert [m.content for m in store.load_transcript("s1")] == ["hi", "claims", "unsaved"]
    assert any(p.where == f"pending_messages/{dump} messages[2]" for p in summary.notes)


# -- running it again, Hermes restarting --------------------------------------------------


def test_import_again_inserts_nothing(
    modern: ModernHome, database_url: str, store: SessionRepository, tmp_path: Path
) -> None:
    first = run_import(database_url, modern.home, expect=EXIT_ATTENTION)
    before = all_messages(store)
    everything = all_messages(store, include_retracted=True)

    again = run_import(database_url, modern.home, expect=EXIT_ATTENTION)

    assert again.messages_inserted == 0
    assert again.messages_already_present == first.messages_read == 34
    assert (again.messages_changed, again.sessions_new) == (0, 0)
    assert again.archived_since_import == []
    assert again.inbound_inserted == 0
    assert all_messages(store) == before
    assert all_messages(store, include_retracted=True) == everything
    # A copy of the home elsewhere is the same source: keys do not depend on the path.
    copy = tmp_path / "elsewhere" / "hermes-copy"
    shutil.copytree(modern.home, copy)
    assert run_import(database_url, copy, expect=EXIT_ATTENTION).messages_inserted == 0
    assert all_messages(store) == before


def test_import_twice_hermes_restarts_import_again_stores_every_message_once(
    clean: ModernHome, database_url: str, store: SessionRepository
) -> None:
    """The issue's "done when": exit 0 every time, nothing new after the restart, the
    gateway's home byte-for-byte unchanged by each import."""
    s = clean
    build_profile(s.home, "work").close()
    before = snapshot(s.home)
    first = run_report(database_url, s.home)
    second = run_report(database_url, s.home)
    assert snapshot(s.home) == before
    stored = all_messages(store)
    everything = all_messages(store, include_retracted=True)

    s.db.close()
    replayed = hermes_restart(s.home) + hermes_restart(s.home / "profiles" / "work")
    assert len(replayed) == 7 + 1  # 3 + 1 inbound, 4 cap drops (not the .bad one)
    restarted = snapshot(s.home)
    third = run_report(database_url, s.home)
    assert snapshot(s.home) == restarted

    assert [h.profile for h in first.homes] == ["default", "work"]
    assert sum(h.messages_inserted for h in first.homes) == 33 + 3
    for report in (second, third):
        assert sum(h.messages_inserted for h in report.homes) == 0
        assert not report.needs_attention
    root = third.homes[0]
    # The replayed rows were stored from the spool; the cap drop Hermes' crashed replay
    # had stored already is now in state.db twice, and kept once.
    assert root.messages_seen_by_another_route == 6
    assert [p.field for p in root.duplicate_rows] == ["message_uid"]
    assert all_messages(store) == stored
    assert all_messages(store, include_retracted=True) == everything
    assert sorted(everything) == sorted(
        [*s.db.sessions, s.ghost, s.spool_only, "work_20250105_0900"]
    )  # no companion session
    # Every message once: no key twice, and no content twice where Hermes had it once.
    for session_id, messages in stored.items():
        keys = [m.client_msg_uuid for m in messages]
        assert len(keys) == len(set(keys)), session_id
    work = store.get_session("work_20250105_0900")
    assert work.metadata["hermes"]["profile"] == "work"
    assert [m.content for m in store.load_transcript(work.id)] == [
        "hello from the work profile",
        "hi, work here",
        "queued for work",
    ]


def test_a_home_without_uids_restarts_without_doubling(
    database_url: str, store: SessionRepository, tmp_path: Path
) -> None:
    """A version 30 gateway mints no message_uid: content keys carry the restart."""
    home = tmp_path / "hermes"
    home.mkdir()
    db = HermesDB(home / "state.db", version=30)
    db.session("s1", session_key="agent:main:cli")
    db.message("s1", "user", "ok")
    db.message("s1", "assistant", "ok")
    db.close()
    spool = Spool(home)
    spool.cap_drop(
        "s1", {"role": "user", "content": "ok", "timestamp": 1_800_000_000.5}, 1_800_000_001, 1
    )
    spool.shutdown_pending("agent:main:cli", "ok", 1_800_000_002)
    spool.cap_drop("s1", {"role": "assistant", "content": "ok"}, 1_800_000_003, 2)

    first = run_import(database_url, home)
    stored = store.load_transcript("s1")
    # The rows, then the spool in replay order (ts): the cap drop, the inbound text, the
    # second cap drop.
    assert [(m.role, m.content) for m in stored] == [
        ("user", "ok"),
        ("assistant", "ok"),
        ("user", "ok"),
        ("user", "ok"),
        ("assistant", "ok"),
    ]
    assert first.messages_inserted == 5
    assert len(first.possible_duplicates) == 3  # no uid to tell equal messages apart

    hermes_restart(home)
    again = run_import(database_url, home)

    assert again.messages_inserted == 0
    assert again.messages_seen_by_another_route == 3
    assert store.load_transcript("s1") == stored
    expected = hermes_view(home / "state.db", "s1")
    assert [presented(m) for m in stored] == expected


def test_rows_hermes_changed_since_an_earlier_import_are_reported(
    modern: ModernHome, database_url: str, store: SessionRepository
) -> None:
    s = modern
    run_import(database_url, s.home, expect=EXIT_ATTENTION)
    # Hermes compacts c in place (the copy keeps the uid) and someone edits the cron answer.
    c_uid = next(row["message_uid"] for row in s.db.rows if row["id"] == s.ids["c_user"])
    s.db.execute("UPDATE messages SET active = 0, compacted = 1 WHERE id = ?", s.ids["c_user"])
    s.db.message(s.c, "user", "Thanks! And dinner?", message_uid=c_uid)
    s.db.execute("UPDATE messages SET content = 'Edited.' WHERE id = ?", s.ids["cron_answer"])

    again = run_import(database_url, s.home, expect=EXIT_ATTENTION)

    assert again.messages_inserted == 1  # the copy; the archived row is the one stored
    # Only the edit is a change; the archived row is retracted, not a conflict.
    assert [p.where for p in again.changed] == [f"state.db messages.id={s.ids['cron_answer']}"]
    assert [p.where for p in again.archived_since_import] == [
        f"state.db messages.id={s.ids['c_user']}"
    ]
    c = store.load_transcript(s.c, include_retracted=True)
    archived = next(m for m in c if provenance(m).get("id") == s.ids["c_user"])
    assert archived.superseded == "retracted"
    assert archived.client_msg_uuid == uid_key(c_uid)
    assert archived.extra["hermes"].get("state") is None  # the stored row, as it was stored
    assert s.ids["c_user"] not in [provenance(m).get("id") for m in store.load_transcript(s.c)]
    cron = {provenance(m).get("id"): m for m in store.load_transcript(s.cron)}
    assert cron[s.ids["cron_answer"]].content == "Nothing new today."  # stored row kept


def test_a_row_archived_since_an_earlier_import_is_retracted_and_needs_nobody(
    clean: ModernHome, database_url: str, store: SessionRepository
) -> None:
    s = clean
    run_import(database_url, s.home)
    s.db.execute("UPDATE messages SET active = 0 WHERE id = ?", s.ids["a_answer"])  # rewound

    again = run_import(database_url, s.home)  # exit 0: nothing needs a person

    assert (again.messages_inserted, again.messages_changed) == (0, 0)
    assert [p.where for p in again.archived_since_import] == [
        f"state.db messages.id={s.ids['a_answer']}"
    ]
    live = store.load_transcript(s.a)
    assert s.ids["a_answer"] not in [provenance(m)["id"] for m in live]
    assert [presented(m) for m in live] == hermes_view(s.home / "state.db", s.a)
    assert store.search("tram line") == []
    stored = {provenance(m)["id"]: m for m in store.load_transcript(s.a, include_retracted=True)}
    assert stored[s.ids["a_answer"]].superseded == "retracted"
    third = run_import(database_url, s.home)
    assert (third.messages_inserted, third.archived_since_import) == (0, [])


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
    assert summary.messages_inserted == 34 - 1
    cron = [provenance(m).get("id") for m in store.load_transcript(s.cron)]
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
    # Each batch is one unit of work of its session.
    transaction = SessionRepository.session_transaction

    def failing(self: SessionRepository, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls >= 3:  # down from the third batch on, until the test says otherwise
            raise BackendUnavailable("the database went away", code="57P01")
        return transaction(self, *args, **kwargs)

    monkeypatch.setattr(SessionRepository, "session_transaction", failing)
    with pytest.raises(HermesImportError, match="run it again") as caught:
        import_hermes(s.home, store)
    partial = caught.value.summary.messages_inserted
    assert 0 < partial < 33

    result = invoke("--url", database_url, str(s.home))  # still failing: one clean line
    assert result.exit_code == 1
    error = result.stderr.splitlines()[-1]  # after the progress bar's label
    assert error.startswith("Error: the import stopped after")
    assert "run it again" in error

    monkeypatch.setattr(SessionRepository, "session_transaction", transaction)
    done = run_import(database_url, s.home, expect=EXIT_ATTENTION)
    assert done.messages_already_present + done.messages_inserted == 34
    assert len(by_row_id(store)) == len(s.db.rows)


# -- the source is never modified ---------------------------------------------------------


def test_a_running_gateways_home_is_byte_for_byte_unchanged(
    modern: ModernHome, database_url: str
) -> None:
    # The gateway has state.db open (WAL, its -wal and -shm beside it).
    before = snapshot(modern.home)
    assert {"state.db-wal", "state.db-shm"} <= set(before)
    run_import(database_url, modern.home, expect=EXIT_ATTENTION)
    assert snapshot(modern.home) == before


def test_a_stopped_gateways_home_gets_no_side_files(database_url: str, tmp_path: Path) -> None:
    home = build_modern_home(tmp_path / "hermes")
    home.db.close()  # the gateway stopped: SQLite checkpointed and removed its -wal
    before = snapshot(home.home)
    assert "state.db-wal" not in before
    run_import(database_url, home.home, expect=EXIT_ATTENTION)
    assert snapshot(home.home) == before


def test_a_killed_gateways_wal_tail_is_imported_and_left_alone(
    database_url: str, store: SessionRepository, tmp_path: Path
) -> None:
    home = build_modern_home(tmp_path / "hermes", junk=False)
    home.db.close()
    kill_a_writing_gateway(home.home / "state.db", home.c, ["only in the WAL", "me too"])
    before = snapshot(home.home)
    assert len(before["state.db-wal"][0]) > 0
    assert "state.db-shm" in before

    summary = run_import(database_url, home.home)

    assert snapshot(home.home) == before
    assert summary.rows_read == len(home.db.rows) + 2
    contents = [m.content for m in store.load_transcript(home.c)]
    assert contents[1:3] == ["only in the WAL", "me too"]  # rows, before the spool


def test_a_copy_taken_while_the_gateway_writes_is_taken_again(
    modern: ModernHome, store: SessionRepository, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    s = modern
    copyfile = shutil.copyfile
    written: list[int] = []

    def copy_while_writing(source: Any, target: Any) -> Any:
        copied = copyfile(source, target)
        # The gateway commits a row once its WAL was copied: that copy misses it.
        if str(source).endswith("-wal") and not written:
            written.append(s.db.message(s.c, "assistant", "written during the copy"))
        return copied

    monkeypatch.setattr(shutil, "copyfile", copy_while_writing)
    summary = import_hermes(s.home, store)

    assert summary.rows_read == len(s.db.rows)  # the second copy has the row
    rows = [m.content for m in store.load_transcript(s.c) if "spool_file" not in provenance(m)]
    assert rows[-1] == "written during the copy"


def test_a_home_that_never_holds_still_is_one_clean_error(
    modern: ModernHome, store: SessionRepository, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    s = modern
    copyfile = shutil.copyfile

    def copy_while_writing(source: Any, target: Any) -> Any:
        copied = copyfile(source, target)
        s.db.message(s.c, "assistant", "again")
        return copied

    monkeypatch.setattr(shutil, "copyfile", copy_while_writing)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with pytest.raises(HermesSourceError, match="kept changing while it was copied"):
        import_hermes(s.home, store)
    assert list((tmp_path / "tmp").iterdir()) == []  # the private copy is gone


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
    rows = [m for m in store.load_transcript(s.c) if "spool_file" not in provenance(m)]
    assert rows[-1].content == "written during the import"


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
    assert sorted(all_messages(store)) == sorted(v2.db.sessions)  # no companion session
    for session_id in (v2.parent, v2.child):
        expected = hermes_view(v2.path, session_id)
        assert [presented(m) for m in store.load_transcript(session_id)] == expected
    # A rollback-journal database: not one byte or file of the source changes.
    assert snapshot(v2.path.parent) == before
    assert run_import(database_url, v2.path).messages_inserted == 0


def test_a_state_db_given_alone_says_its_spool_was_not_read(
    database_url: str, tmp_path: Path
) -> None:
    v2 = build_v2_state_db(tmp_path / "hermes")
    v2.db.close()
    Spool(tmp_path / "hermes").history_dump(v2.child, [{"role": "user", "content": "x"}])
    summary = run_import(database_url, v2.path)
    assert summary.spool_not_read == str(tmp_path / "hermes" / "pending_messages")
    assert summary.spool_messages_read == 0
    result = invoke("--url", database_url, str(v2.path))
    assert "was not read" in result.stdout


# -- profiles -----------------------------------------------------------------------------


def test_every_profile_is_imported_and_named(
    clean: ModernHome, database_url: str, store: SessionRepository
) -> None:
    build_profile(clean.home, "work").close()
    build_profile(clean.home, "family").close()

    report = run_report(database_url, clean.home)

    assert [h.profile for h in report.homes] == ["default", "family", "work"]
    assert [h.source for h in report.homes[1:]] == [
        str(clean.home / "profiles" / "family"),
        str(clean.home / "profiles" / "work"),
    ]
    for name in ("family", "work"):
        session = store.get_session(f"{name}_20250105_0900")
        assert session.metadata["hermes"]["profile"] == name
        assert session.source == "slack"
    # A profile given on its own is named by its folder.
    again = run_import(database_url, clean.home / "profiles" / "work")
    assert (again.profile, again.messages_inserted) == ("work", 0)


def test_with_no_profiles_each_one_is_listed_with_its_command(
    clean: ModernHome, database_url: str, store: SessionRepository
) -> None:
    build_profile(clean.home, "work").close()

    result = invoke("--url", database_url, "--no-profiles", str(clean.home))

    assert result.exit_code == 0, result.output
    command_line = f"sessionrepo import-hermes {clean.home / 'profiles' / 'work'}"
    assert f"work: {command_line}" in result.stdout
    with pytest.raises(Exception, match="no session"):
        store.get_session("work_20250105_0900")
    report = run_report(database_url, clean.home, "--no-profiles")
    assert report.profiles_not_imported == [("work", command_line)]


def test_a_session_id_in_two_profiles_needs_a_person(database_url: str, tmp_path: Path) -> None:
    home = tmp_path / "hermes"
    home.mkdir()
    for root in (home, home / "profiles" / "work"):
        root.mkdir(parents=True, exist_ok=True)
        db = HermesDB(root / "state.db")
        db.session("same-id")
        db.message("same-id", "user", f"from {root.name}")
        db.close()
    report = run_report(database_url, home, expect=EXIT_ATTENTION)
    assert report.shared_session_ids == ["same-id"]


# -- the command --------------------------------------------------------------------------


def test_the_text_summary_leads_with_what_needs_a_person(
    modern: ModernHome, database_url: str
) -> None:
    s = modern
    for index in range(SHOWN + 2):  # more unparseable files than the summary shows
        s.spool.raw(f"pending-{index:04d}broken.json", b"{")
    result = invoke("--url", database_url, str(s.home))
    assert result.exit_code == EXIT_ATTENTION, result.output
    out = result.stdout
    lines = out.splitlines()
    # Counts first: the line after the header says how many things need a person.
    assert lines[2] == "  needs a person   7"
    assert lines[3] == "    spool files not imported (left in place, unchanged): 7"
    examples = lines[4 : 4 + SHOWN + 1]
    assert all(line.startswith("      pending-") for line in examples[:SHOWN])
    assert examples[SHOWN] == "      … 4 more"
    assert "33 inserted, 1 already present (1 of them stored earlier by another route)" in out
    assert "4 archived, 1 hidden, 1 rewound, 1 session_meta" in out
    assert "2 overflow tail" in out
    assert "1 agent-history dump" in out
    assert "3 in their sessions (3 appended now), 0 undelivered" in out
    assert "agent-history dump entries already in state.db (skipped): 1" in out
    assert "Every item of every list: --json, or --report FILE." in out
    assert len(lines) < 60  # never a list of a thousand lines


def test_a_clean_home_exits_0(clean: ModernHome, database_url: str) -> None:
    result = invoke("--url", database_url, str(clean.home))
    assert result.exit_code == 0, result.output
    assert "needs a person   0 (nothing)" in result.stdout


def test_the_whole_report_goes_where_the_user_says(
    modern: ModernHome, database_url: str, tmp_path: Path
) -> None:
    target = tmp_path / "reports" / "import.json"
    target.parent.mkdir()
    result = invoke("--url", database_url, "--report", str(target), str(modern.home))
    assert result.exit_code == EXIT_ATTENTION, result.output
    report = HermesImportReport.model_validate_json(target.read_text())
    (home,) = report.homes
    assert len(home.moved_aside) == 4
    assert home.unparseable_files
    assert f"The whole report is in {target}." in result.stdout
    assert list(target.parent.iterdir()) == [target]  # no temporary file left


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
    report = HermesImportReport.model_validate_json(result.stdout)
    assert report.homes[0].messages_inserted == 33
    assert len(by_row_id(store)) == len(modern.db.rows)
    assert not (tmp_path / "not-this-one.db").exists()


def test_open_hermes_counts_what_an_import_goes_through(modern: ModernHome) -> None:
    with open_hermes(modern.home) as source:
        assert source.total_messages == 34
        assert source.profile is None


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
