"""The command line's edges, as a user meets them: ``--url`` after the command, queries
that start with ``-``, a malformed URL, a prune that asks first, ``--json`` everywhere
with one timestamp format, progress when stderr is not a terminal, and an import that
stops half-way saying how far it got."""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from sessionrepo import InvalidArgument, SessionRepository, open_async_repository, open_repository
from sessionrepo.cli import _common, main, ops, search
from sessionrepo.store.schema import head_revision

from support.cli_tree import LEAVES, command_at


def _run(*args: str, input: Any = None, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(
        main,
        list(args),
        input=input,
        env={"SESSIONREPO_DATABASE_URL": None, "SESSIONREPO_OUTBOX_URL": None, **(env or {})},
    )


def _ok(result: Result) -> Result:
    assert result.exit_code == 0, result.output
    return result


def _error_line(result: Result, code: int = 1) -> str:
    """Exit ``code``, one ``Error:`` line on stderr, no traceback; returns the line."""
    assert result.exit_code == code, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    line = result.stderr.strip()
    assert "\n" not in line, line
    assert line.startswith("Error: "), line
    return line


def _options(command: click.Command) -> set[str]:
    return {opt for param in command.params for opt in getattr(param, "opts", ())}


def _store(url: str, sessions: int = 3, *, ended: bool = True) -> None:
    with open_repository(url) as repository:
        for i in range(sessions):
            repository.append(
                f"s{i}",
                [
                    {"role": "user", "content": f"mochi the dog, visit {i}"},
                    {"role": "assistant", "content": "mochi the cat is fine"},
                ],
                source="cli",
            )
            if ended:
                repository.end_session(f"s{i}", "done")


# -- --url / --outbox-url after the command -------------------------------------------


@pytest.mark.parametrize("path", [p for p in LEAVES if p != ("demo",)], ids=" ".join)
def test_every_command_takes_the_url_after_it_too(path: tuple[str, ...]) -> None:
    command = command_at(path)
    shown = _ok(_run(*path, "--help")).stdout

    assert "--url" in _options(command)
    assert "--url URL" in shown
    if path[0] == "outbox":
        assert "--outbox-url" in _options(command)


def test_migrate_with_the_url_after_the_command(tmp_path: Path) -> None:
    target = tmp_path / "new.db"

    result = _ok(_run("migrate", "--url", f"sqlite:///{target}"))

    assert "upgraded from an empty database" in result.stdout
    with open_repository(f"sqlite:///{target}") as repository:
        assert repository.list_sessions().sessions == []


def test_the_url_after_the_command_wins_over_the_one_before_and_the_environment(
    database_url: str, tmp_path: Path
) -> None:
    _store(database_url, sessions=1)
    missing = f"sqlite:///{tmp_path / 'missing.db'}"

    after = _ok(_run("--url", missing, "sessions", "list", "--url", database_url, "--json"))
    environment = _ok(
        _run("sessions", "list", "--json", "--url", database_url,
             env={"SESSIONREPO_DATABASE_URL": missing})
    )  # fmt: skip
    group = _ok(_run("sessions", "--url", database_url, "list", "--json"))

    for result in (after, environment, group):
        assert [s["id"] for s in json.loads(result.stdout)["sessions"]] == ["s0"]
    assert not (tmp_path / "missing.db").exists()


def test_outbox_status_with_the_outbox_url_after_the_command(tmp_path: Path) -> None:
    primary = tmp_path / "primary.db"
    _ok(_run("--url", str(primary), "migrate"))
    outbox = tmp_path / "outbox.db"
    missing = tmp_path / "missing-outbox.db"

    error = _error_line(_run("outbox", "status", "--outbox-url", str(missing)))
    shutil.copyfile(primary, outbox)  # a migrated store holds an (empty) outbox table
    status = _ok(_run("outbox", "status", "--outbox-url", str(outbox), "--json"))

    assert f"no outbox file at {missing}" in error
    assert json.loads(status.stdout)["pending"] == 0


# -- queries that start with - --------------------------------------------------------


@pytest.fixture
def searchable(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'search.db'}"
    _store(url, sessions=2)
    return url


def _hits(result: Result) -> list[tuple[str, int]]:
    return [(hit["session_id"], hit["seq"]) for hit in map(json.loads, result.stdout.splitlines())]


def test_a_query_that_starts_with_a_minus_is_a_query(searchable: str) -> None:
    plain = _hits(_ok(_run("--url", searchable, "search", "--json", "mochi -dog")))
    leading = _ok(_run("--url", searchable, "search", "-dog mochi", "--json"))
    dashes = _ok(_run("--url", searchable, "search", "--json", "--", "-dog mochi"))
    words = _ok(_run("--url", searchable, "search", "-dog", "mochi", "--json"))

    assert sorted(plain) == [("s0", 2), ("s1", 2)]  # the cat lines, not the dog ones
    for result in (leading, dashes, words):
        assert sorted(_hits(result)) == sorted(plain)


def test_an_option_value_may_start_with_a_minus_and_unknown_options_still_fail(
    searchable: str,
) -> None:
    other = _ok(_run("--url", searchable, "search", "--source", "-x", "mochi", "--json"))
    typo = _run("--url", searchable, "search", "--jsn", "mochi")

    assert other.stdout == ""  # no session has the source "-x"
    assert typo.exit_code == 2
    assert "No such option '--jsn'" in typo.stderr


def test_search_help_documents_the_double_dash() -> None:
    assert "search -- '-dog mochi'" in _ok(_run("search", "--help")).stdout


# -- a malformed URL ---------------------------------------------------------------


def test_a_sqlite_url_with_a_host_is_one_clear_line(tmp_path: Path) -> None:
    for args in (
        ("--url", "sqlite://file.db", "sessions", "list"),
        ("migrate", "--url", "sqlite://file.db"),
        ("doctor", "--url", "sqlite://file.db"),
    ):
        line = _error_line(_run(*args))
        assert "sqlite:///file.db" in line, line  # says how to write it
    with pytest.raises(InvalidArgument, match="three slashes"):
        open_repository("sqlite://file.db")
    assert not Path("file.db").exists()


def test_a_url_query_the_driver_cannot_take_is_a_clear_error(
    tmp_path: Path, event_loop_thread: Any
) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}?timeout=abc"

    line = _error_line(_run("migrate", "--url", url))
    with pytest.raises(InvalidArgument, match="timeout=abc cannot be used"):
        open_repository(url)
    with pytest.raises(InvalidArgument, match="timeout=abc cannot be used"):
        event_loop_thread.run(open_async_repository(url))

    assert "could not convert string to float" in line
    assert not (tmp_path / "x.db").exists()


def test_an_unsupported_database_is_one_line_with_nothing_masked_wrongly() -> None:
    # A one-letter password must not blank out letters of the message.
    line = _error_line(_run("--url", "mysql://u:p@h/d", "sessions", "list"))

    assert (
        line
        == "Error: url: unsupported database 'mysql': sessionrepo runs on SQLite and PostgreSQL"
    )


# -- prune asks first ---------------------------------------------------------------


@pytest.fixture
def three_ended(database_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    _store(database_url, sessions=3)
    monkeypatch.setattr(ops, "PRUNE_CONFIRM_ABOVE", 2)
    return database_url


def _session_ids(url: str) -> list[str]:
    with open_repository(url) as repository:
        return sorted(s.id for s in repository.list_sessions().sessions)


def test_a_large_prune_without_a_terminal_is_refused_without_yes(
    three_ended: str, tmp_path: Path
) -> None:
    export = tmp_path / "pruned.jsonl"

    line = _error_line(
        _run("--url", three_ended, "prune", "--older-than", "0s", "--export", str(export))
    )

    assert "this deletes 3 ended sessions" in line
    assert "--yes" in line
    assert _session_ids(three_ended) == ["s0", "s1", "s2"]
    assert not export.exists()  # refused before anything was written

    done = _ok(_run("--url", three_ended, "prune", "--older-than", "0s", "--yes", "--json"))
    assert sorted(json.loads(done.stdout)["session_ids"]) == ["s0", "s1", "s2"]
    assert _session_ids(three_ended) == []


def test_a_large_prune_on_a_terminal_asks(
    three_ended: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ops, "stdin_is_terminal", lambda: True)

    declined = _run("--url", three_ended, "prune", "--older-than", "0s", input="n\n")
    assert declined.exit_code == 1
    assert "Continue?" in declined.stderr
    assert _session_ids(three_ended) == ["s0", "s1", "s2"]

    _ok(_run("--url", three_ended, "prune", "--older-than", "0s", input="y\n"))
    assert _session_ids(three_ended) == []


def test_a_small_prune_and_a_dry_run_do_not_ask(three_ended: str) -> None:
    dry = _ok(_run("--url", three_ended, "prune", "--older-than", "0s", "--dry-run"))
    assert "would prune 3 sessions" in dry.stdout

    # Only sessions older than a day would go: none, so nothing is asked.
    kept = _ok(_run("--url", three_ended, "prune", "--older-than", "1d"))
    assert "pruned 0 sessions" in kept.stdout
    assert _session_ids(three_ended) == ["s0", "s1", "s2"]


# -- --json on every command that reports, one timestamp format ----------------------

#: Commands that print no report: the console serves until stopped.
NO_REPORT = {("serve",)}


@pytest.mark.parametrize("path", [p for p in LEAVES if p not in NO_REPORT], ids=" ".join)
def test_every_reporting_command_has_json(path: tuple[str, ...]) -> None:
    assert "--json" in _options(command_at(path))


_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?")
_RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z")


def test_json_reports_parse_and_their_times_are_rfc3339_utc_with_z(
    database_url: str, tmp_path: Path
) -> None:
    _store(database_url, sessions=2, ended=False)
    u = ("--url", database_url)
    outputs = {
        "migrate": _run("migrate", *u, "--json"),
        "doctor": _run("doctor", *u, "--json"),
        "list": _run("sessions", "list", *u, "--json"),
        "show": _run("sessions", "show", "s0", *u, "--json"),
        "end": _run("sessions", "end", "s0", "--reason", "done", *u, "--json"),
        "rewind": _run("sessions", "rewind", "s1", "--to-seq", "1", *u, "--json"),
        "fork": _run("sessions", "fork", "s1", "--at-seq", "1", "--new-id", "f", *u, "--json"),
        "search": _run("search", "mochi", *u, "--json"),
        "reindex": _run("reindex", *u, "--json"),
        "status": _run("outbox", "status", *u, "--json"),
        "drain": _run("outbox", "drain", *u, "--json"),
        "retry-dead": _run("outbox", "retry-dead", *u, "--json"),
        "export": _run("export", str(tmp_path / "e.jsonl"), *u, "--json"),
        "prune": _run("prune", "--older-than", "0s", "--dry-run", *u, "--json"),
    }
    outputs["import"] = _run("import", str(tmp_path / "e.jsonl"), *u, "--json")
    times = []
    for name, result in outputs.items():
        assert result.exit_code == 0, f"{name}: {result.output}"
        text = result.stdout
        documents = [text] if text.lstrip().startswith("{\n") else text.splitlines()
        for document in documents:
            json.loads(document)  # every --json output parses
        times += [(name, moment) for moment in _TIMESTAMP.findall(text)]
    times += [("export file", t) for t in _TIMESTAMP.findall((tmp_path / "e.jsonl").read_text())]

    assert {name for name, _ in times} >= {"list", "show", "end", "fork", "search"}
    for name, moment in times:
        assert _RFC3339_UTC.fullmatch(moment), f"{name}: {moment}"
    assert json.loads(outputs["migrate"].stdout)["after"] == head_revision()
    assert json.loads(outputs["reindex"].stdout)["indexed"] >= 4
    assert json.loads(outputs["retry-dead"].stdout) == {"retried": 0, "session_id": None}


def test_demo_json_is_the_whole_result_and_its_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The demo's run itself (processes, outage, checks) is tested in test_cli.py; here,
    # what --json makes of a result, failed check included.
    from sessionrepo.cli import demo
    from sessionrepo.demo import Check, DemoResult, GatewayReport, OutageReport

    result = DemoResult(
        path=tmp_path / "demo.db",
        kept=True,
        gateways=[GatewayReport(name="gw1", sent=4, inserted=3, flushes={"turn": 2})],
        attempted=4,
        made=3,
        stored=3,
        skipped=1,
        sessions={"shared": 3},
        alternations={},
        overlap=0.5,
        outage=OutageReport(locked_at=1.0, released_at=2.0),
        parked_writes=0,
        drained=0,
        outbox_left=0,
        outboxes={"gw1": tmp_path / "gw1.outbox.db"},
        checks=[Check("no duplicates", True, "3 rows"), Check("counters", False, "2 != 3")],
        seconds=1.5,
    )
    monkeypatch.setattr(demo, "run_demo", lambda path, turns: result)

    ran = _run("demo", "--json")

    assert ran.exit_code == 1  # a check failed
    shown = json.loads(ran.stdout)
    assert shown["ok"] is False
    assert shown["path"] == str(tmp_path / "demo.db")
    assert shown["gateways"][0]["flushes"] == {"turn": 2}
    assert [check["ok"] for check in shown["checks"]] == [True, False]


def test_an_export_with_offset_times_still_imports(tmp_path: Path) -> None:
    # Older exports (and hand-made ones) may say +00:00: the format change is output only.
    source = f"sqlite:///{tmp_path / 'a.db'}"
    _store(source, sessions=1)
    export = tmp_path / "e.jsonl"
    _ok(_run("--url", source, "export", str(export)))
    export.write_text(export.read_text().replace('Z"', '+00:00"'))
    target = f"sqlite:///{tmp_path / 'b.db'}"

    _ok(_run("--url", target, "import", str(export)))

    with open_repository(target) as repository:
        assert [m.content for m in repository.load_transcript("s0")] == [
            "mochi the dog, visit 0",
            "mochi the cat is fine",
        ]


# -- progress when stderr is not a terminal ------------------------------------------


@pytest.fixture
def every_update(monkeypatch: pytest.MonkeyPatch) -> None:
    """A progress line at each update instead of every few seconds."""
    monkeypatch.setattr(_common, "PROGRESS_INTERVAL", 0.0)


def test_long_work_reports_progress_lines_on_stderr(
    tmp_path: Path, every_update: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    _store(url, sessions=3)
    export = tmp_path / "e.jsonl"
    target = f"sqlite:///{tmp_path / 'b.db'}"

    exported = _ok(_run("--url", url, "export", str(export)))
    imported = _ok(_run("--url", target, "import", str(export)))
    reindexed = _ok(_run("--url", target, "reindex"))
    pruned = _ok(_run("--url", url, "prune", "--older-than", "0s", "--yes"))

    assert "exporting sessions: 3 of 3 (100%), done" in exported.stderr
    size = export.stat().st_size
    assert f"importing: {size:,} of {size:,} bytes (100%), done" in imported.stderr
    assert re.search(r"reindexing: 6 of 6 \(100%\), done", reindexed.stderr), reindexed.stderr
    assert "pruning: 3 of 3 sessions (100%), done" in pruned.stderr
    for result in (exported, imported, reindexed, pruned):
        assert result.stdout.split()[0] in ("exported", "imported", "indexed", "pruned")


def test_short_work_is_quiet_on_stderr(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    _store(url, sessions=1)

    result = _ok(_run("--url", url, "export", str(tmp_path / "e.jsonl")))

    assert result.stderr == ""


def test_a_search_says_when_it_first_indexes_a_backlog(
    tmp_path: Path, every_update: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    _store(url, sessions=3)  # 3 appends: 6 messages waiting for the index
    monkeypatch.setattr(search, "CATCH_UP_NOTICE", 6)
    monkeypatch.setattr(search, "CATCH_UP_STEP", 1)

    result = _ok(_run("--url", url, "search", "cat", "--json"))

    assert len(result.stdout.splitlines()) == 3
    lines = result.stderr.splitlines()
    assert lines[0].startswith("indexing 6 messages appended since the index last caught up: ")
    assert lines[-1].endswith("6 of 6 (100%), done")
    with open_repository(url) as repository:
        assert repository.search_index_backlog() == 0


# -- an import that stops half-way -------------------------------------------------


class _Interrupted(io.BytesIO):
    """A stream that is Ctrl-C'd after ``lines`` lines."""

    def __init__(self, data: bytes, lines: int) -> None:
        super().__init__(data)
        self._left = lines

    def __next__(self) -> bytes:
        if self._left == 0:
            raise KeyboardInterrupt
        self._left -= 1
        return super().__next__()


@pytest.fixture
def export_of_three(tmp_path: Path) -> Path:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    _store(url, sessions=3)
    export = tmp_path / "e.jsonl"
    _ok(_run("--url", url, "export", str(export)))
    return export


def _messages(repository: SessionRepository) -> int:
    return sum(s.message_count for s in repository.list_sessions().sessions)


def test_an_interrupted_import_says_how_far_it_got_and_a_rerun_finishes(
    export_of_three: Path, tmp_path: Path
) -> None:
    target = f"sqlite:///{tmp_path / 'b.db'}"
    data = export_of_three.read_bytes()
    # header, then (session, message, message) x 3: stopped in the third session
    result = _run("--url", target, "import", "-", input=_Interrupted(data, lines=8))

    assert result.exit_code == 130, result.output
    line = result.stderr.strip()
    assert line.startswith("Error: import interrupted at line 8 of stdin: "), line
    assert "4 messages inserted" in line
    assert "in 2 sessions" in line
    assert "run the same import again" in line
    with open_repository(target) as repository:
        assert _messages(repository) == 4

    again = json.loads(_ok(_run("--url", target, "import", "-", "--json", input=data)).stdout)
    assert (again["messages_inserted"], again["messages_present"]) == (2, 4)
    with open_repository(target) as repository:
        assert _messages(repository) == 6


def test_a_damaged_line_says_what_was_committed_before_it(
    export_of_three: Path, tmp_path: Path
) -> None:
    lines = export_of_three.read_bytes().splitlines(keepends=True)
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_bytes(b"".join([*lines[:7], b'{"type": "message", \n', *lines[7:]]))
    target = f"sqlite:///{tmp_path / 'b.db'}"

    line = _error_line(_run("--url", target, "import", str(damaged)))

    assert "line 8: damaged" in line
    # s0 was committed, and s1's messages before the damaged line too.
    assert "4 messages inserted" in line, line
    assert "in 2 sessions," in line
    assert "run the same import again" in line
    again = json.loads(_ok(_run("--url", target, "import", str(export_of_three), "--json")).stdout)
    assert (again["messages_inserted"], again["messages_present"]) == (2, 4)


def test_a_file_cut_short_says_after_which_line(export_of_three: Path, tmp_path: Path) -> None:
    lines = export_of_three.read_bytes().splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"".join(lines[:-1]))  # without the end record
    target = f"sqlite:///{tmp_path / 'b.db'}"

    result = _run("--url", target, "import", str(cut))

    assert result.exit_code == 1
    assert "imported 3 sessions" in result.stdout
    assert f"was cut short after line {len(lines) - 1}" in result.stderr
