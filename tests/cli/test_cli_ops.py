"""The operators' commands: ``doctor``, ``sessions list|show|end``, ``export``, ``import`` and
``prune``, through the command line, on both backends.

What an operator relies on: a transcript readable in a terminal and exact in JSON; an
export that an import into an empty database turns back into the very same store, and
that can be imported again without adding anything; a prune that never deletes an open
session; a doctor whose exit status and verdict say what is wrong and how to fix it.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import text

from sessionrepo import Message, Session, SessionRepository
from sessionrepo.cli import main
from sessionrepo.models.message import utcnow
from sessionrepo.outbox.table import Outbox
from sessionrepo.store.database import Database
from sessionrepo.store.schema import current_revision, downgrade, head_revision

from support.corpus import BIG, assert_same_store, build_corpus, set_times, snapshot

#: Port 1 refuses connections at once: a server that is down.
DOWN = "postgresql://ops:s3cr3t-pw@127.0.0.1:1/chat"
PASSWORD = "s3cr3t-pw"


def _run(*args: str, input: bytes | None = None) -> Result:
    # The tests choose every database: nothing comes from the environment.
    return CliRunner().invoke(
        main,
        list(args),
        input=input,
        env={"SESSIONREPO_DATABASE_URL": None, "SESSIONREPO_OUTBOX_URL": None},
    )


def _ok(result: Result) -> Result:
    assert result.exit_code == 0, result.output
    return result


def _error_line(result: Result, code: int = 1) -> str:
    assert result.exit_code == code, result.output
    assert isinstance(result.exception, SystemExit)  # no library exception escaped
    assert "Traceback" not in result.output
    line = result.stderr.strip()
    assert "\n" not in line, line
    assert line.startswith("Error: ")
    return line


def _migrate(url: str) -> None:
    _ok(_run("--url", url, "migrate"))


# -- sessions list --------------------------------------------------------------------


def test_sessions_list_filters_and_pages_with_the_printed_cursor(
    repo: SessionRepository, database_url: str
) -> None:
    for i in range(5):
        repo.append(f"discord:{i}", [Message(role="user", content=f"hello {i}")], source="discord")
    repo.append(
        "telegram:x", [Message(role="user", content="privet")], source="telegram", user_id="u-7"
    )
    repo.end_session("discord:1", "done")

    text_page = _ok(
        _run("--url", database_url, "sessions", "list", "--source", "discord", "--limit", "2")
    )

    lines = text_page.stdout.splitlines()
    assert lines[0].split()[:4] == ["session", "source", "user", "status"]
    assert [line.split()[0] for line in lines[1:3]] == ["discord:4", "discord:3"]
    assert "hello 4" in lines[1]
    assert lines[-1].startswith("next page: --cursor ")
    seen = [line.split()[0] for line in lines[1:3]]
    cursor = lines[-1].removeprefix("next page: --cursor ")
    while cursor:
        page = json.loads(
            _ok(
                _run(
                    "--url",
                    database_url,
                    "sessions",
                    "list",
                    "--source",
                    "discord",
                    "--limit",
                    "2",
                    "--cursor",
                    cursor,
                    "--json",
                )
            ).stdout
        )
        seen += [s["id"] for s in page["sessions"]]
        cursor = page["next_cursor"]
    assert seen == [f"discord:{i}" for i in (4, 3, 2, 1, 0)]  # newest activity first, once each

    ended = json.loads(
        _ok(_run("--url", database_url, "sessions", "list", "--status", "ended", "--json")).stdout
    )
    assert [s["id"] for s in ended["sessions"]] == ["discord:1"]
    assert ended["next_cursor"] is None
    mine = _ok(_run("--url", database_url, "sessions", "list", "--user", "u-7"))
    assert [line.split()[0] for line in mine.stdout.splitlines()[1:]] == ["telegram:x"]
    assert "next page" not in mine.stdout


def test_sessions_list_of_an_empty_store_and_a_bad_cursor(database_url: str) -> None:
    assert _ok(_run("--url", database_url, "sessions", "list")).stdout == "no sessions\n"

    line = _error_line(_run("--url", database_url, "sessions", "list", "--cursor", "garbage"))
    assert "cursor" in line


def test_a_missing_sqlite_file_is_an_error_and_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"

    for command in (
        ["sessions", "list"],
        ["sessions", "show", "x"],
        ["export", str(tmp_path / "o.jsonl")],
    ):
        line = _error_line(_run("--url", str(missing), *command))
        assert f"no database file at {missing}" in line
    assert not missing.exists()


# -- sessions show --------------------------------------------------------------------


def test_sessions_show_prints_a_readable_transcript(
    repo: SessionRepository, database_url: str
) -> None:
    repo.create_session(
        "s", source="discord", user_id="u-1", title="Weather\x1b[2J chat", model="gpt-x"
    )
    repo.append(
        "s",
        [
            Message.from_openai(
                {"role": "user", "content": "What is the weather in Paris?\x1b[31m"}
            ),
            Message.from_openai(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                        }
                    ],
                }
            ),
            Message.from_openai(
                {
                    "role": "tool",
                    "tool_call_id": "call_1",
                    "tool_name": "get_weather",
                    "content": "18C",
                }
            ),
            Message.from_openai({"role": "assistant", "content": "word " * 400}),
            Message.from_openai(
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "and this?"},
                        {"type": "image_url", "image_url": {"url": "x"}},
                    ],
                }
            ),
        ],
    )

    out = _ok(
        _run("--url", database_url, "sessions", "show", "s", "--width", "60", "--lines", "3")
    ).stdout

    assert "session s · source discord · user u-1" in out
    assert "5 messages · 1 tool call · open" in out
    assert "title Weather\\x1b[2J chat" in out
    assert "\x1b" not in out  # nothing the transcript says can drive the terminal
    lines = out.splitlines()
    headers = [line for line in lines if line.startswith("#")]
    assert [h.split()[0] for h in headers] == ["#1", "#2", "#3", "#4", "#5"]
    assert [h.split()[3] for h in headers] == ["user", "assistant", "tool", "assistant", "user"]
    assert "    What is the weather in Paris?\\x1b[31m" in lines
    assert '    → get_weather({"city":"Paris"})  [call_1]' in lines
    assert headers[2].endswith("tool  (get_weather, call_1)")
    long = lines.index(headers[3])
    assert all(len(line) <= 60 for line in lines[long + 1 : long + 4])
    assert lines[long + 4].startswith("    … 3")
    assert lines[long + 4].endswith("more lines (--full shows them)")
    assert "    and this?" in lines
    assert "    [image_url]" in lines

    full = _ok(
        _run("--url", database_url, "sessions", "show", "s", "--width", "60", "--full")
    ).stdout
    assert "more lines" not in full
    assert full.count("word") == 400


def test_sessions_show_json_is_the_stored_messages_exactly(
    repo: SessionRepository, database_url: str
) -> None:
    build_corpus(repo)
    stored = repo.load_transcript("discord:chan-1")

    result = _ok(_run("--url", database_url, "sessions", "show", "discord:chan-1", "--json"))

    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["seq"] for r in records] == [m.seq for m in stored]
    for record, message in zip(records, stored, strict=True):
        assert list(record) == ["seq", "timestamp", "message"]
        assert json.dumps(record["message"]) == json.dumps(message.to_openai(include_key=True))
        assert record["timestamp"] == message.timestamp.isoformat().replace("+00:00", "Z")
    # Flushing those dicts again (a resumed gateway) stores nothing new.
    again = repo.append("discord:chan-1", [r["message"] for r in records])
    assert again.inserted == []
    assert again.conflicts == []


def test_sessions_show_pages_tail_and_after(
    repo: SessionRepository, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo.append("s", [Message(role="user", content=f"m{i}") for i in range(1, 12)])
    monkeypatch.setattr("sessionrepo.cli.sessions.TRANSCRIPT_PAGE", 4)  # so that paging shows

    def seqs(*options: str) -> list[int]:
        out = _ok(_run("--url", database_url, "sessions", "show", "s", "--json", *options)).stdout
        return [json.loads(line)["seq"] for line in out.splitlines()]

    assert seqs() == list(range(1, 12))
    assert seqs("--after", "5") == list(range(6, 12))
    assert seqs("--after", "2", "--limit", "5") == [3, 4, 5, 6, 7]
    assert seqs("--tail", "3") == [9, 10, 11]
    assert (
        _run(
            "--url", database_url, "sessions", "show", "s", "--tail", "3", "--after", "1"
        ).exit_code
        == 2
    )


def test_sessions_show_of_a_missing_session_is_one_line(database_url: str) -> None:
    assert "no session 'nope'" in _error_line(
        _run("--url", database_url, "sessions", "show", "nope")
    )


# -- sessions end ---------------------------------------------------------------------


def test_sessions_end_says_whether_this_call_ended_it_and_the_first_reason_wins(
    repo: SessionRepository, database_url: str
) -> None:
    repo.append("s", [Message(role="user", content="hi")])

    first = _ok(_run("--url", database_url, "sessions", "end", "s", "--reason", "user_left"))
    second = _ok(
        _run("--url", database_url, "sessions", "end", "s", "--reason", "cleanup", "--json")
    )

    assert first.stdout.strip() == "ended session 's' (reason: user_left)"
    outcome = json.loads(second.stdout)
    assert (outcome["ended"], outcome["end_reason"]) == (False, "user_left")
    assert repo.get_session("s").end_reason == "user_left"
    third = _ok(_run("--url", database_url, "sessions", "end", "s", "--reason", "again"))
    assert "had already ended" in third.stdout
    assert "(reason: user_left); nothing changed" in third.stdout

    repo.reopen_session("s")
    fresh = json.loads(
        _ok(_run("--url", database_url, "sessions", "end", "s", "--reason", "r2", "--json")).stdout
    )
    assert (fresh["ended"], fresh["end_reason"]) == (True, "r2")
    assert "no session 'nope'" in _error_line(
        _run("--url", database_url, "sessions", "end", "nope", "--reason", "x")
    )
    assert (
        _run("--url", database_url, "sessions", "end", "s").exit_code == 2
    )  # --reason is required


# -- export and import ----------------------------------------------------------------


def test_export_then_import_into_an_empty_database_reproduces_everything(
    repo: SessionRepository, database_url: str, empty_database_url: str, tmp_path: Path
) -> None:
    build_corpus(repo)
    path = tmp_path / "backup.jsonl"

    exported = _ok(_run("--url", database_url, "export", str(path)))
    assert exported.stdout.strip() == f"exported 4 sessions with {7 + 2 + BIG:,} messages to {path}"
    _migrate(empty_database_url)
    imported = _ok(_run("--url", empty_database_url, "import", str(path)))

    assert imported.stdout.strip() == (
        "imported 4 sessions (4 new, 0 already present, 0 merged into changed sessions); "
        f"messages: {7 + 2 + BIG:,} inserted, 0 already present, 0 conflicting"
    )
    assert_same_store(database_url, empty_database_url)

    again = _ok(_run("--url", empty_database_url, "import", str(path), "--json"))

    report = json.loads(again.stdout)
    assert report["messages_inserted"] == 0
    assert report["messages_present"] == 7 + 2 + BIG
    assert (report["sessions_restored"], report["sessions_present"], report["complete"]) == (
        0,
        4,
        True,
    )
    assert_same_store(database_url, empty_database_url)


def test_export_to_stdout_and_import_from_stdin(
    repo: SessionRepository, database_url: str, target_url: str
) -> None:
    build_corpus(repo)

    exported = _ok(_run("--url", database_url, "export", "--session", "discord:chan-1", "-"))
    data = exported.stdout_bytes
    assert data.startswith(b'{"type":"header"')
    assert "exported 1 session with 7 messages to stdout" in exported.stderr

    imported = _ok(_run("--url", target_url, "import", "-", "--json", input=data))
    assert json.loads(imported.stdout)["messages_inserted"] == 7
    assert_same_store(database_url, target_url, ["discord:chan-1"])


@pytest.fixture
def target_url(empty_database_url: str) -> str:
    _migrate(empty_database_url)
    return empty_database_url


def test_export_filters(repo: SessionRepository, database_url: str, tmp_path: Path) -> None:
    build_corpus(repo)

    def ids(*options: str) -> list[str]:
        path = tmp_path / f"{len(list(tmp_path.iterdir()))}.jsonl"
        _ok(_run("--url", database_url, "export", str(path), *options))
        records = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
        return [r["session"]["id"] for r in records if r["type"] == "session"]

    assert ids("--source", "discord", "--status", "ended") == ["discord:chan-1:rotated"]
    assert ids("--user", "user-2") == ["telegram:empty"]
    assert ids("--ended-before", "0s") == ["discord:chan-1:rotated", "telegram:empty"]
    assert ids("--ended-before", "2000-01-01") == []
    assert ids("--session", "cli:long", "--session", "telegram:empty") == [
        "cli:long",
        "telegram:empty",
    ]


def test_export_refuses_to_overwrite_and_names_a_missing_session(
    repo: SessionRepository, database_url: str, tmp_path: Path
) -> None:
    repo.append("s", [Message(role="user", content="hi")])
    taken = tmp_path / "taken.jsonl"
    taken.write_text("precious")

    refused = _run("--url", database_url, "export", str(taken))

    assert refused.exit_code == 2, refused.output
    assert "already exists" in refused.output
    assert taken.read_text() == "precious"
    missing = tmp_path / "m.jsonl"
    assert "no session 'nope'" in _error_line(
        _run("--url", database_url, "export", "--session", "nope", str(missing))
    )
    assert not missing.exists()
    assert (
        _run(
            "--url", database_url, "export", "--session", "s", "--source", "x", str(missing)
        ).exit_code
        == 2
    )


def test_import_of_a_cut_short_file_imports_what_it_holds_and_exits_1(
    repo: SessionRepository, database_url: str, target_url: str, tmp_path: Path
) -> None:
    build_corpus(repo)
    whole = tmp_path / "whole.jsonl"
    _ok(_run("--url", database_url, "export", str(whole)))
    lines = whole.read_bytes().split(b"\n")
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"\n".join(lines[: len(lines) - 40]) + b"\n")

    partial = _run("--url", target_url, "import", str(cut))

    line = _error_line(partial)
    assert "was cut short" in line
    # Sessions go by id: the long one first, whole; the file ends inside its messages.
    assert partial.stdout.startswith("imported 1 session (1 new,")
    finished = json.loads(_ok(_run("--url", target_url, "import", str(whole), "--json")).stdout)
    assert finished["messages_inserted"] > 0
    assert_same_store(database_url, target_url)


def test_import_of_something_else_is_one_clean_line(target_url: str, tmp_path: Path) -> None:
    other = tmp_path / "other.jsonl"
    other.write_text('{"role": "user", "content": "hi"}\n')

    assert "line 1: not a sessionrepo export" in _error_line(
        _run("--url", target_url, "import", str(other))
    )
    assert _run("--url", target_url, "import", str(tmp_path / "absent.jsonl")).exit_code == 2


@pytest.mark.postgres
def test_import_into_an_unmigrated_postgresql_database_names_the_fix(
    repo: SessionRepository, database_url: str, postgres_server: Any, tmp_path: Path
) -> None:
    # PostgreSQL-only: an embedded SQLite store migrates itself when opened.
    repo.append("s", [Message(role="user", content="hi")])
    path = tmp_path / "e.jsonl"
    _ok(_run("--url", database_url, "export", str(path)))
    name = postgres_server.new_database(migrated=False)
    try:
        line = _error_line(_run("--url", postgres_server.url_for(name), "import", str(path)))
    finally:
        postgres_server.drop(name)
    assert "sessionrepo migrate" in line


# -- prune ----------------------------------------------------------------------------


def _prune_setup(repo: SessionRepository, url: str) -> dict[str, str]:
    """One session of each kind prune must tell apart; what each must do."""
    long_ago = utcnow() - timedelta(days=200)
    recently = utcnow() - timedelta(days=10)
    cases = {
        "ended-old": ("prune", long_ago, long_ago),
        "ended-old-2": ("prune", long_ago, long_ago),
        "open-old": ("keep", None, long_ago),  # live, however idle
        "ended-recently": ("keep", recently, long_ago),
        "ended-old-late-message": ("keep", long_ago, recently),
    }
    for sid, (_, ended_at, last_active_at) in cases.items():
        repo.append(
            sid, [Message(role="user", content=f"{sid} #{n}") for n in range(3)], source="test"
        )
        if ended_at is not None:
            repo.end_session(sid, "done")
        set_times(url, sid, ended_at=ended_at, last_active_at=last_active_at)
    return {sid: action for sid, (action, _, _) in cases.items()}


def _messages_of(url: str, session_id: str) -> int:
    database = Database(url)
    try:
        return int(
            database.read(
                lambda c: c.execute(
                    text("SELECT COUNT(*) FROM messages WHERE session_id = :s"), {"s": session_id}
                ).scalar_one()
            )
        )
    finally:
        database.dispose()


def test_prune_dry_run_lists_what_would_go_and_deletes_nothing(
    repo: SessionRepository, database_url: str
) -> None:
    cases = _prune_setup(repo, database_url)
    before = snapshot(database_url)

    result = _ok(_run("--url", database_url, "prune", "--older-than", "90d", "--dry-run"))

    listed = [
        line.split()[2]
        for line in result.stdout.splitlines()
        if line.startswith("would prune ") and "  ended " in line
    ]
    assert listed == ["ended-old", "ended-old-2"]
    assert result.stdout.splitlines()[-1].startswith("would prune 2 sessions with 6 messages")
    assert snapshot(database_url) == before
    as_json = json.loads(
        _ok(
            _run("--url", database_url, "prune", "--older-than", "90d", "--dry-run", "--json")
        ).stdout
    )
    assert (as_json["dry_run"], as_json["session_ids"], as_json["messages"]) == (
        True,
        ["ended-old", "ended-old-2"],
        6,
    )
    assert sorted(sid for sid, action in cases.items() if action == "prune") == listed


def test_prune_deletes_only_old_ended_sessions_with_their_messages(
    repo: SessionRepository, database_url: str
) -> None:
    cases = _prune_setup(repo, database_url)
    before = snapshot(database_url)

    result = _ok(_run("--url", database_url, "prune", "--older-than", "90d", "--json"))

    report = json.loads(result.stdout)
    assert report["session_ids"] == ["ended-old", "ended-old-2"]
    assert (report["messages"], report["kept"], report["outbox_rows"]) == (6, [], 0)
    after = snapshot(database_url)
    for sid, action in cases.items():
        if action == "prune":
            assert sid not in after
            assert _messages_of(database_url, sid) == 0
        else:
            assert after[sid] == before[sid]  # untouched, to the last field
    assert _ok(_run("--url", database_url, "prune", "--older-than", "90d")).stdout.startswith(
        "pruned 0 sessions"
    )


def test_prune_never_deletes_an_open_session_however_old(
    repo: SessionRepository, database_url: str
) -> None:
    _prune_setup(repo, database_url)

    _ok(_run("--url", database_url, "prune", "--older-than", "0s"))

    left = snapshot(database_url)
    assert sorted(left) == ["open-old"]
    assert left["open-old"]["seqs"] == [1, 2, 3]


def test_prune_export_writes_what_it_deletes_first(
    repo: SessionRepository, database_url: str, target_url: str, tmp_path: Path
) -> None:
    _prune_setup(repo, database_url)
    before = snapshot(database_url)
    path = tmp_path / "pruned.jsonl"

    result = _ok(
        _run(
            "--url",
            database_url,
            "prune",
            "--older-than",
            "90d",
            "--export",
            str(path),
            "--batch-size",
            "1",
        )
    )

    assert result.stdout.splitlines() == [
        result.stdout.splitlines()[0],
        f"exported 2 sessions to {path} first",
    ]
    assert result.stdout.startswith("pruned 2 sessions with 6 messages")
    _ok(_run("--url", target_url, "import", str(path)))
    assert snapshot(target_url) == {sid: before[sid] for sid in ("ended-old", "ended-old-2")}
    assert (
        _run("--url", database_url, "prune", "--older-than", "90d", "--export", str(path)).exit_code
        == 2
    )


def test_prune_dry_run_with_export_writes_the_file_and_deletes_nothing(
    repo: SessionRepository, database_url: str, tmp_path: Path
) -> None:
    _prune_setup(repo, database_url)
    before = snapshot(database_url)
    path = tmp_path / "preview.jsonl"

    _ok(
        _run(
            "--url",
            database_url,
            "prune",
            "--older-than",
            "90d",
            "--dry-run",
            "--export",
            str(path),
        )
    )

    records = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    assert [r["session"]["id"] for r in records if r["type"] == "session"] == [
        "ended-old",
        "ended-old-2",
    ]
    assert snapshot(database_url) == before


def test_prune_reports_outbox_rows_it_leaves(repo: SessionRepository, database_url: str) -> None:
    _prune_setup(repo, database_url)
    Outbox(repo.database).park(
        "ended-old", [Message(role="user", content="late")], Session(id="ended-old"), reason="test"
    )

    result = _ok(_run("--url", database_url, "prune", "--older-than", "90d"))

    assert "note: 1 message of 1 pruned session still wait in pending_outbox" in result.stdout
    assert Outbox(repo.database).count("ended-old") == 1


@pytest.mark.parametrize("age", ["90", "d", "1.5d", "-3d", "3w"])
def test_prune_needs_an_age_with_a_unit(database_url: str, age: str) -> None:
    result = _run("--url", database_url, "prune", "--older-than", age)

    assert result.exit_code == 2, result.output
    assert "not a duration" in result.output


# -- doctor ---------------------------------------------------------------------------


def _doctor(url: str, *options: str) -> tuple[dict[str, Any], Result]:
    result = _run("--url", url, "doctor", "--json", *options)
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout), result


def _statuses(report: dict[str, Any]) -> dict[str, str]:
    return {check["name"]: check["status"] for check in report["checks"]}


def test_doctor_on_a_healthy_store_exits_0(database_url: str, backend: str) -> None:
    result = _ok(_run("--url", database_url, "doctor"))

    assert result.stdout.splitlines()[-1] == "verdict: healthy"
    report, _ = _doctor(database_url)
    statuses = _statuses(report)
    assert set(statuses.values()) == {"ok"}
    assert {"connection", "schema", "outbox"} <= set(statuses)
    assert f"at revision {head_revision()} (head)" in result.stdout
    settings = {name.split(".", 1)[1] for name in statuses if "." in name}
    expected = {
        "sqlite": {"journal_mode", "synchronous", "foreign_keys", "busy_timeout"},
        "postgres": {"server_version", "synchronous_commit", "fsync", "timezone", "writable"},
    }[backend]
    assert expected <= settings


def test_doctor_on_an_empty_database_fails_and_names_migrate(empty_database_url: str) -> None:
    database = Database(empty_database_url)  # the database exists, with no schema in it
    try:
        database.read(lambda c: c.execute(text("SELECT 1")).scalar())
    finally:
        database.dispose()

    result = _run("--url", empty_database_url, "doctor")

    assert result.exit_code == 1, result.output
    assert "FAIL  schema" in result.stdout
    assert "empty database (no schema)" in result.stdout
    assert "fix: run `sessionrepo migrate`" in result.stdout
    assert result.stdout.splitlines()[-1] == "verdict: UNHEALTHY (schema)"
    report, _ = _doctor(empty_database_url)
    assert _statuses(report)["schema"] == "fail"
    assert _statuses(report)["outbox"] == "skip"
    database = Database(empty_database_url)
    try:
        assert current_revision(database) is None  # doctor changed nothing
    finally:
        database.dispose()

    _migrate(empty_database_url)
    assert _ok(_run("--url", empty_database_url, "doctor")).stdout.endswith("verdict: healthy\n")


def test_doctor_on_an_out_of_date_schema_fails_and_names_migrate(database_url: str) -> None:
    database = Database(database_url)
    try:
        downgrade(database, "0001")
    finally:
        database.dispose()

    report, result = _doctor(database_url)

    assert result.exit_code == 1
    schema = next(c for c in report["checks"] if c["name"] == "schema")
    assert schema["status"] == "fail"
    assert f"at revision 0001; this sessionrepo needs {head_revision()}" in schema["detail"]
    assert "sessionrepo migrate" in schema["fix"]
    _migrate(database_url)
    _ok(_run("--url", database_url, "doctor"))


def test_doctor_on_a_missing_sqlite_file_fails_without_creating_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "store.db"

    report, result = _doctor(str(missing))

    assert result.exit_code == 1
    assert _statuses(report) == {
        "connection": "fail",
        "schema": "skip",
        "settings": "skip",
        "outbox": "skip",
        "search": "skip",
    }
    assert f"no database file at {missing}" in report["checks"][0]["detail"]
    assert not missing.parent.exists()


def test_doctor_on_a_server_that_is_down_masks_the_password() -> None:
    result = _run("--url", DOWN, "doctor")

    assert result.exit_code == 1, result.output
    assert "FAIL  connection" in result.stdout
    assert "ops:***@127.0.0.1:1/chat" in result.stdout
    assert PASSWORD not in result.output


def test_doctor_reports_the_outbox(repo: SessionRepository, database_url: str) -> None:
    box = Outbox(repo.database)
    box.park("s", [Message(role="user", content="parked")], Session(id="s"), reason="test")

    report, result = _doctor(database_url)

    assert result.exit_code == 0  # a backlog alone is a warning
    outbox = next(c for c in report["checks"] if c["name"] == "outbox")
    assert outbox["status"] == "warn"
    assert outbox["detail"].startswith("1 pending, 0 dead")
    assert _run("--url", database_url, "doctor", "--strict").exit_code == 1
    stale, result = _doctor(database_url, "--max-outbox-age", "0")
    assert result.exit_code == 1
    assert "outbox drain" in next(c for c in stale["checks"] if c["name"] == "outbox")["fix"]

    claimed = box.claim("test", limit=1, lease=60.0, session_id="s")
    assert claimed is not None
    box.fail(
        "s",
        claimed.positions,
        owner="test",
        error="rejected",
        code="22001",
        retry_at=utcnow(),
        rejected=True,
        dead=True,
    )

    dead, result = _doctor(database_url)

    assert result.exit_code == 1
    check = next(c for c in dead["checks"] if c["name"] == "outbox")
    assert (check["status"], check["detail"]) == ("fail", "0 pending, 1 dead")
    assert "retry-dead" in check["fix"]


def test_doctor_checks_a_separate_outbox_file(database_url: str, tmp_path: Path) -> None:
    missing = tmp_path / "outbox.db"

    report, result = _doctor(database_url, "--outbox-url", str(missing))

    assert result.exit_code == 1
    assert report["outbox"].endswith("outbox.db")
    check = next(c for c in report["checks"] if c["name"] == "outbox")
    assert (check["status"], check["detail"]) == ("fail", f"no outbox file at {missing}")
    assert not missing.exists()
