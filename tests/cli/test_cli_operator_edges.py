"""The command line as a new operator meets it: one escaping rule for every column and
text (nothing a transcript holds can drive the terminal or hide itself), `sessions
reopen`, `search --since/--until` and every role, hit marks that cannot be taken for the
text's own brackets, and an export stopped by Ctrl-C that says what it left (exit 130)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from sessionrepo import Message, open_repository
from sessionrepo.cli import main
from sessionrepo.cli import ops as cli_ops
from sessionrepo.cli import search as cli_search

#: Characters that would reorder or hide what a terminal shows, and how they are shown.
HOSTILE = {
    "\u202e": "\\u202e",  # right-to-left override
    "\u2066": "\\u2066",  # left-to-right isolate
    "\u200b": "\\u200b",  # zero-width space
    "\u061c": "\\u061c",  # Arabic letter mark
    "\ufeff": "\\ufeff",  # byte order mark
    "\U000e0041": "\\U000e0041",  # tag letter A (invisible)
}
EVIL = "".join(HOSTILE)
SHOWN = "".join(HOSTILE.values())


def _run(url: str, *args: str, color: bool = False) -> Result:
    return CliRunner().invoke(main, ["--url", url, *args], color=color)


def _ok(result: Result) -> Result:
    assert result.exit_code == 0, result.output
    return result


def _assert_clean(text: str) -> None:
    for char in (*HOSTILE, "\x1b"):
        assert char not in text, f"{char!r} printed raw:\n{text}"


# -- one escaping rule -------------------------------------------------------------------


@pytest.fixture
def hostile_store(database_url: str) -> str:
    with open_repository(database_url) as repo:
        repo.create_session(
            f"s{EVIL}",
            source=f"discord{EVIL}",
            user_id=f"u{EVIL}",
            model=f"gpt{EVIL}",
            title=f"title{EVIL}",
            parent_session_id=f"p{EVIL}",
        )
        repo.append(
            f"s{EVIL}",
            [
                {"role": "user", "content": f"mochi says {EVIL}\x1b[2J hi"},
                {
                    "role": "tool",
                    "tool_call_id": f"call{EVIL}",
                    "tool_name": f"tool{EVIL}",
                    "content": "ok",
                },
            ],
        )
        repo.end_session(f"s{EVIL}", f"reason{EVIL}")
    return database_url


def test_sessions_show_escapes_its_header_and_every_message_field(hostile_store: str) -> None:
    out = _ok(_run(hostile_store, "sessions", "show", f"s{EVIL}")).stdout
    _assert_clean(out)
    assert f"session s{SHOWN} · source discord{SHOWN} · user u{SHOWN}" in out
    assert f"(reason{SHOWN})" in out
    assert f"model gpt{SHOWN} · title title{SHOWN} · continues p{SHOWN}" in out
    assert f"mochi says {SHOWN}\\x1b[2J hi" in out
    assert f"(tool{SHOWN}, call{SHOWN})" in out


def test_every_listing_and_message_escapes_the_same_way(hostile_store: str) -> None:
    listing = _ok(_run(hostile_store, "sessions", "list")).stdout
    _assert_clean(listing)
    assert f"discord{SHOWN}"[:15] + "…" in listing  # clipped to its column
    hits = _ok(_run(hostile_store, "search", "mochi")).stdout
    _assert_clean(hits)
    assert hits.startswith(f"s{SHOWN} #1 ")
    for result in (
        _run(hostile_store, "sessions", "reopen", f"s{EVIL}"),
        _run(hostile_store, "sessions", "end", f"s{EVIL}", "--reason", f"r{EVIL}"),
        _run(hostile_store, "sessions", "rewind", f"s{EVIL}", "--to-seq", "1"),
    ):
        _assert_clean(_ok(result).stdout)
        assert f"'s{SHOWN}'" in result.stdout


# -- sessions reopen ---------------------------------------------------------------------


def test_sessions_reopen_reopens_an_ended_session_once(database_url: str) -> None:
    with open_repository(database_url) as repo:
        repo.append("s", [{"role": "user", "content": "hi"}])
        repo.end_session("s", "done")

    assert _ok(_run(database_url, "sessions", "reopen", "s")).stdout == "reopened session 's'\n"
    again = _ok(_run(database_url, "sessions", "reopen", "s", "--json"))
    assert json.loads(again.stdout) == {"session_id": "s", "reopened": False}
    plain = _ok(_run(database_url, "sessions", "reopen", "s")).stdout
    assert plain == "session 's' is open; nothing changed\n"
    with open_repository(database_url) as repo:
        session = repo.get_session("s")
        assert (session.ended_at, session.end_reason) == (None, None)

    missing = _run(database_url, "sessions", "reopen", "nope")
    assert missing.exit_code == 1
    assert missing.stderr.startswith("Error: no session 'nope'")


# -- search: --since/--until, every role ---------------------------------------------------


def _at(day: int, hour: int = 12) -> datetime:
    return datetime(2025, 1, day, hour, tzinfo=UTC)


def _hits(url: str, *args: str) -> list[tuple[str, int]]:
    out = _ok(_run(url, "search", *args, "--json")).stdout
    return sorted((h["session_id"], h["seq"]) for h in map(json.loads, out.splitlines()))


def test_search_since_and_until_take_times_dates_and_ages(database_url: str) -> None:
    with open_repository(database_url) as repo:
        repo.append(
            "s",
            [
                Message(role="user", content="okapi early", timestamp=_at(10)),
                Message(role="user", content="okapi late", timestamp=_at(31, 23)),
                Message(
                    role="user",
                    content="okapi next",
                    timestamp=_at(31, 23).replace(month=2, day=1, hour=0),
                ),
            ],
        )
    assert _hits(database_url, "okapi", "--since", "2025-01-15") == [("s", 2), ("s", 3)]
    # A date for --until includes that whole day; a time is the exact instant.
    assert _hits(database_url, "okapi", "--until", "2025-01-31") == [("s", 1), ("s", 2)]
    assert _hits(database_url, "okapi", "--until", "2025-01-31T23:00:00Z") == [("s", 1)]
    window = ("--since", "2025-01-31T22:00:00+01:00", "--until", "2025-02-01T00:00:00Z")
    assert _hits(database_url, "okapi", *window) == [("s", 2)]
    assert _hits(database_url, "okapi", "--since", "7d") == []  # every one is older

    wrong = _run(database_url, "search", "okapi", "--since", "last tuesday")
    assert wrong.exit_code == 2
    assert "neither a date (2025-01-31), a time" in wrong.stderr


def test_search_filters_on_every_role(database_url: str) -> None:
    with open_repository(database_url) as repo:
        repo.append(
            "s",
            [
                {"role": "developer", "content": "okapi rules"},
                {"role": "function", "name": "lookup", "content": "okapi found"},
                {"role": "user", "content": "okapi?"},
            ],
        )
    assert _hits(database_url, "okapi", "--role", "developer") == [("s", 1)]
    assert _hits(database_url, "okapi", "--role", "function") == [("s", 2)]
    text = _ok(_run(database_url, "search", "okapi", "--role", "function")).stdout
    assert " function  [okapi] found" in text


# -- hit marks ------------------------------------------------------------------------------


@pytest.fixture
def bracketed_store(database_url: str) -> str:
    with open_repository(database_url) as repo:
        repo.append("s", [{"role": "user", "content": "see [mochi] and mochi\\ \x1b[1m bold"}])
    return database_url


def test_plain_marks_cannot_be_taken_for_the_texts_own_brackets(bracketed_store: str) -> None:
    out = _ok(_run(bracketed_store, "search", "mochi")).stdout
    assert out.endswith("user      see \\[[mochi]\\] and [mochi]\\\\ \\x1b\\[1m bold\n"), out


def test_on_a_terminal_matches_are_bold_and_nothing_else_is_an_escape(
    bracketed_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_search, "stdout_is_terminal", lambda: True)
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = _ok(_run(bracketed_store, "search", "mochi", color=True)).stdout
    bold, normal = "\x1b[1m", "\x1b[22m"
    assert out.endswith(f"see [{bold}mochi{normal}] and {bold}mochi{normal}\\ \\x1b[1m bold\n")
    assert out.count("\x1b") == 4  # the marks' own, none from the text

    monkeypatch.setenv("NO_COLOR", "1")
    assert "\x1b" not in _ok(_run(bracketed_store, "search", "mochi", color=True)).stdout


# -- export interrupted ------------------------------------------------------------------


def _interrupt_after(sessions: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C once the export has written ``sessions`` sessions."""
    real = cli_ops.export_sessions

    def export(*args: Any, on_session: Callable[[Any], None], **kwargs: Any) -> Any:
        written = 0

        def counted(session: Any) -> None:
            nonlocal written
            on_session(session)
            written += 1
            if written == sessions:
                raise KeyboardInterrupt

        return real(*args, on_session=counted, **kwargs)

    monkeypatch.setattr(cli_ops, "export_sessions", export)


@pytest.fixture
def three_sessions(database_url: str) -> str:
    with open_repository(database_url) as repo:
        for n in range(3):
            repo.append(f"s{n}", [{"role": "user", "content": f"hello {n}"}])
    return database_url


def test_an_interrupted_export_removes_its_file_says_so_and_exits_130(
    three_sessions: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _interrupt_after(2, monkeypatch)
    target = tmp_path / "backup.jsonl"
    result = _run(three_sessions, "export", str(target))
    assert result.exit_code == 130, result.output
    assert result.stderr == (
        f"Error: export interrupted after 2 of 3 sessions: {target} was removed (an export "
        "is written whole or not at all); run it again\n"
    )
    assert "Aborted" not in result.output
    assert not target.exists()


def test_an_interrupted_export_to_stdout_says_what_went_out(
    three_sessions: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _interrupt_after(1, monkeypatch)
    result = _run(three_sessions, "export", "-")
    assert result.exit_code == 130, result.output
    assert result.stderr.startswith("Error: export interrupted after 1 of 3 sessions: ")
    assert "what went to stdout lacks the end record" in result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert records  # the header and the first session went out


def test_a_hit_on_a_responses_item_prints_as_an_item(database_url: str) -> None:
    with open_repository(database_url) as repo:
        item = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "okapi"}
        repo.append("s", [item])
    out = _ok(_run(database_url, "search", "okapi")).stdout
    assert out.endswith(" item      f([okapi])\n"), out
