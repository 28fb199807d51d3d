"""``sessionrepo outbox status|drain|retry-dead``: what an operator and a monitoring script
rely on, on both backends, with the outbox in the primary database and in a SQLite file.

Exit statuses (documented in the commands' help): ``status`` 0 / 3 dead rows / 4 a pending
row older than ``--max-age``; ``drain`` 0 / 3 rows failed or went dead, kept parked; 1 for
any error (one line on stderr), 2 for a usage error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sessionrepo import (
    DrainReport,
    Message,
    NotFound,
    OutboxStatus,
    Session,
    TranscriptWriter,
    open_repository,
)
from sessionrepo.cli import main
from sessionrepo.cli.outbox import EXIT_DEAD, EXIT_INCOMPLETE, EXIT_STALE
from sessionrepo.models.message import utcnow
from sessionrepo.outbox.table import Outbox
from sessionrepo.outbox.writer import open_outbox_database
from sessionrepo.store.database import Database

#: Port 1 refuses connections at once: a primary that is down.
DOWN_PRIMARY = "postgresql://gateway:pa55-w0rd@127.0.0.1:1/chat"
PASSWORD = "pa55-w0rd"


@dataclass(frozen=True)
class Setup:
    """A primary database and where its outbox lives (``None``: in the primary)."""

    primary: str
    outbox_url: str | None

    def run(self, *command: str) -> Result:
        outbox = ["--outbox-url", self.outbox_url] if self.outbox_url else []
        return _invoke("--url", self.primary, "outbox", *outbox, *command)

    def outbox(self) -> Outbox:
        if self.outbox_url is None:
            return Outbox(Database(self.primary))
        return Outbox(open_outbox_database(self.outbox_url))


def _invoke(*args: str) -> Result:
    # The tests choose every database: nothing comes from the environment.
    return CliRunner().invoke(
        main,
        list(args),
        env={"SESSIONREPO_DATABASE_URL": None, "SESSIONREPO_OUTBOX_URL": None},
    )


@pytest.fixture(params=["outbox-in-primary", "outbox-in-sqlite-file"])
def setup(request: pytest.FixtureRequest, database_url: str, tmp_path: Path) -> Setup:
    if request.param == "outbox-in-primary":
        return Setup(database_url, None)
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    open_outbox_database(url).dispose()  # a gateway's writer made it when it started
    return Setup(database_url, url)


@pytest.fixture
def box(setup: Setup) -> Iterator[Outbox]:
    outbox = setup.outbox()
    yield outbox
    outbox.database.dispose()


def _park(box: Outbox, session_id: str, count: int) -> list[str]:
    """Park ``count`` messages as a writer would; their keys, in order."""
    messages = [Message(role="user", content=f"{session_id} #{i}") for i in range(count)]
    box.park(session_id, messages, Session(id=session_id, source="cli-test"), reason="test")
    return [str(message.client_msg_uuid) for message in messages]


def _kill_head(box: Outbox, session_id: str, error: str) -> None:
    """Set the session's oldest row aside as dead, as a drain does after ``max_attempts``."""
    owner = "test-drainer"
    claimed = box.claim(owner, limit=1, lease=60.0, session_id=session_id)
    assert claimed is not None
    assert len(claimed.positions) == 1
    box.fail(
        session_id,
        claimed.positions,
        owner=owner,
        error=error,
        code="22001",
        retry_at=utcnow(),
        rejected=True,
        dead=True,
    )


def _status(setup: Setup, *options: str) -> tuple[OutboxStatus, int]:
    result = setup.run("status", "--json", *options)
    assert result.exit_code in (0, EXIT_DEAD, EXIT_STALE), result.output
    return OutboxStatus.model_validate_json(result.stdout), result.exit_code


def _transcript(primary: str, session_id: str) -> list[str]:
    repository = open_repository(primary)
    try:
        return [str(m.client_msg_uuid) for m in repository.load_transcript(session_id)]
    except NotFound:
        return []  # nothing was ever stored for it
    finally:
        repository.close()


def _table_row(output: str, session_id: str) -> list[str]:
    rows = [line.split() for line in output.splitlines() if line.split()[:1] == [session_id]]
    assert len(rows) == 1, output
    return rows[0]


def _assert_error_line(result: Result, code: int) -> str:
    assert result.exit_code == code, result.output
    assert isinstance(result.exception, SystemExit)  # no library exception escaped
    assert "Traceback" not in result.output
    line = result.stderr.strip()
    assert "\n" not in line, line
    assert line.startswith("Error: ")
    return line


# -- status ---------------------------------------------------------------------------


def test_status_of_an_empty_outbox_is_healthy(setup: Setup) -> None:
    text = setup.run("status")

    assert text.exit_code == 0, text.output
    assert "empty (nothing pending, nothing dead)" in text.stdout

    health, code = _status(setup)
    assert code == 0
    assert health == OutboxStatus(pending=0, dead=0, oldest_pending_age=0.0, sessions=[])


def test_status_shows_parked_messages_per_session(setup: Setup, box: Outbox) -> None:
    _park(box, "sess-a", 3)
    _park(box, "sess-b", 2)

    text = setup.run("status")

    assert text.exit_code == 0, text.output
    assert "5 pending" in text.stdout
    assert "0 dead" in text.stdout
    session_a = _table_row(text.stdout, "sess-a")
    assert session_a[1:3] == ["3", "0"]
    assert re.fullmatch(r"\d+s", session_a[3])  # the oldest row's age
    assert session_a[4:] == ["due", "-"]  # next attempt, last error
    assert _table_row(text.stdout, "sess-b")[1:3] == ["2", "0"]

    health, code = _status(setup)
    assert code == 0
    assert (health.pending, health.dead) == (5, 0)
    assert 0 < health.oldest_pending_age < 60
    assert [(s.session_id, s.pending, s.dead) for s in health.sessions] == [
        ("sess-a", 3, 0),
        ("sess-b", 2, 0),
    ]


def test_status_limit_lists_fewer_sessions_but_counts_all(setup: Setup, box: Outbox) -> None:
    for name in ("sess-a", "sess-b", "sess-c"):
        _park(box, name, 1)

    text = setup.run("status", "--limit", "1")

    assert text.exit_code == 0, text.output
    assert "3 pending" in text.stdout
    assert _table_row(text.stdout, "sess-a")
    assert "sess-b" not in text.stdout
    assert "2 rows in sessions not listed" in text.stdout
    health, _ = _status(setup, "--limit", "1")
    assert health.pending == 3
    assert [s.session_id for s in health.sessions] == ["sess-a"]


def test_status_max_age_flags_pending_rows_older_than_it(setup: Setup, box: Outbox) -> None:
    assert setup.run("status", "--max-age", "0").exit_code == 0  # nothing pending: healthy
    _park(box, "sess-a", 1)

    assert setup.run("status", "--max-age", "3600").exit_code == 0
    stale = setup.run("status", "--max-age", "0")
    assert stale.exit_code == EXIT_STALE == 4, stale.output
    assert "1 pending" in stale.stdout  # still the full report

    _kill_head(box, "sess-a", "rejected")
    _park(box, "sess-b", 1)
    # Dead rows outrank stale ones: an operator has to act.
    assert setup.run("status", "--max-age", "0").exit_code == EXIT_DEAD


# -- dead rows and retry-dead ---------------------------------------------------------


def test_a_dead_row_fails_status_and_retry_dead_puts_it_back(setup: Setup, box: Outbox) -> None:
    poisoned = _park(box, "sess-poison", 2)
    healthy = _park(box, "sess-ok", 1)
    _kill_head(box, "sess-poison", "value too long for type\nDETAIL:  at row 1\n\tmore")

    text = setup.run("status")

    assert text.exit_code == EXIT_DEAD == 3, text.output
    assert "2 pending" in text.stdout
    assert "1 dead" in text.stdout
    row = _table_row(text.stdout, "sess-poison")
    assert row[1:3] == ["1", "1"]
    # The last error, shortened to one line of the table.
    assert "value too long for type DETAIL: at row 1 more" in text.stdout
    assert "retry-dead" in text.stdout

    health, code = _status(setup)
    assert code == EXIT_DEAD
    assert (health.pending, health.dead) == (2, 1)
    poison = next(s for s in health.sessions if s.session_id == "sess-poison")
    assert poison.last_error == "value too long for type\nDETAIL:  at row 1\n\tmore"

    retried = setup.run("retry-dead")

    assert retried.exit_code == 0, retried.output
    assert retried.stdout.strip() == "1 dead row put back in line"
    health, code = _status(setup)
    assert code == 0
    assert (health.pending, health.dead) == (3, 0)
    assert setup.run("retry-dead").stdout.strip() == "0 dead rows put back in line"

    drained = setup.run("drain")

    assert drained.exit_code == 0, drained.output
    assert _transcript(setup.primary, "sess-poison") == poisoned  # the dead row kept its place
    assert _transcript(setup.primary, "sess-ok") == healthy


def test_retry_dead_for_one_session_leaves_the_others_dead(setup: Setup, box: Outbox) -> None:
    for name in ("sess-a", "sess-b"):
        _park(box, name, 1)
        _kill_head(box, name, "rejected")

    retried = setup.run("retry-dead", "--session", "sess-a")

    assert retried.exit_code == 0, retried.output
    assert retried.stdout.strip() == "1 dead row of session 'sess-a' put back in line"
    health, code = _status(setup)
    assert code == EXIT_DEAD
    assert {s.session_id: (s.pending, s.dead) for s in health.sessions} == {
        "sess-a": (1, 0),
        "sess-b": (0, 1),
    }


# -- drain ----------------------------------------------------------------------------


def test_drain_stores_everything_in_order_and_leaves_the_outbox_empty(
    setup: Setup, box: Outbox
) -> None:
    first = _park(box, "sess-a", 3)
    second = _park(box, "sess-b", 2)
    first += _park(box, "sess-a", 2)  # parked later, behind the first three

    drained = setup.run("drain")

    assert drained.exit_code == 0, drained.output
    assert drained.stdout.splitlines()[0] == (
        "replayed 7, already stored 0, conflicting 0, failed 0, dead 0, remaining 0"
    )
    assert _transcript(setup.primary, "sess-a") == first
    assert _transcript(setup.primary, "sess-b") == second
    health, code = _status(setup)
    assert (health.pending, health.dead, health.sessions, code) == (0, 0, [], 0)
    assert "empty" in setup.run("status").stdout

    again = setup.run("drain", "--json")

    assert again.exit_code == 0, again.output
    assert DrainReport.model_validate_json(again.stdout) == DrainReport()


def test_drain_json_and_a_message_the_primary_already_has(setup: Setup, box: Outbox) -> None:
    keys = _park(box, "sess-a", 2)
    # An earlier attempt did commit the first one before its writer gave up on it.
    repository = open_repository(setup.primary)
    try:
        repository.append(
            "sess-a", [Message(role="user", content="sess-a #0", client_msg_uuid=keys[0])]
        )
    finally:
        repository.close()

    drained = setup.run("drain", "--json")

    assert drained.exit_code == 0, drained.output
    report = json.loads(drained.stdout)
    assert report == {
        "replayed": 1,
        "duplicates": 1,
        "conflicts": 0,
        "erased": 0,
        "failed": 0,
        "dead": 0,
        "remaining": 0,
    }
    assert _transcript(setup.primary, "sess-a") == keys


def test_drain_session_replays_only_that_session(setup: Setup, box: Outbox) -> None:
    wanted = _park(box, "sess-a", 3)
    _park(box, "sess-b", 2)

    drained = setup.run("drain", "--session", "sess-a", "--json")

    assert drained.exit_code == 0, drained.output
    report = DrainReport.model_validate_json(drained.stdout)
    assert (report.replayed, report.failed, report.dead) == (3, 0, 0)
    assert _transcript(setup.primary, "sess-a") == wanted
    assert _transcript(setup.primary, "sess-b") == []
    health, _ = _status(setup)
    assert [(s.session_id, s.pending) for s in health.sessions] == [("sess-b", 2)]


def test_drain_leaves_a_session_that_is_backing_off_and_says_so(setup: Setup, box: Outbox) -> None:
    waiting = _park(box, "sess-wait", 2)
    ready = _park(box, "sess-ready", 1)
    owner = "test-drainer"
    claimed = box.claim(owner, limit=2, lease=60.0, session_id="sess-wait")
    assert claimed is not None
    later = utcnow() + timedelta(hours=1)
    box.fail(
        "sess-wait",
        claimed.positions,
        owner=owner,
        error="timeout",
        code=None,
        retry_at=later,
        rejected=False,
        dead=False,
    )

    drained = setup.run("drain")

    assert drained.exit_code == 0, drained.output  # nothing failed in this run
    assert drained.stdout.splitlines() == [
        "replayed 1, already stored 0, conflicting 0, failed 0, dead 0, remaining 2",
        "2 rows still pending: not due yet (backing off after an earlier failure) or held "
        "by another drainer; see `sessionrepo outbox status`.",
    ]
    assert _transcript(setup.primary, "sess-ready") == ready
    assert _transcript(setup.primary, "sess-wait") == []
    row = _table_row(setup.run("status").stdout, "sess-wait")
    assert row[1:3] == ["2", "0"]
    assert row[4:6] in (["in", "59m"], ["in", "1h"])
    assert row[-1] == "timeout"
    health, code = _status(setup)
    assert code == 0
    assert health.sessions[0].next_attempt_at == later
    assert health.pending == 2

    forced = setup.run("drain", "--now")

    assert forced.exit_code == 0, forced.output
    assert forced.stdout.splitlines()[0].startswith("replayed 2,")
    assert _transcript(setup.primary, "sess-wait") == waiting


@pytest.mark.parametrize("output", ["text", "json"])
def test_drain_with_the_primary_down_exits_3_and_keeps_every_row(
    database_url: str, output: str
) -> None:
    # What a gateway leaves behind while its primary is down; its outbox is a database
    # of the test's backend (the primary itself being down, the outbox must be apart).
    outbox = Setup(DOWN_PRIMARY, database_url)
    repository = open_repository(DOWN_PRIMARY, require_connection=False)
    writer = TranscriptWriter(repository, outbox_url=database_url)
    try:
        parked = writer.write("sess-a", [Message(role="user", content=f"#{i}") for i in range(3)])
    finally:
        writer.close()
        repository.close()
    assert parked.status == "parked"

    drained = outbox.run("drain", *(["--json"] if output == "json" else []))

    line = _assert_error_line(drained, EXIT_INCOMPLETE)
    assert EXIT_INCOMPLETE == 3
    assert "3 failed" in line
    assert "3 still pending" in line
    assert PASSWORD not in drained.output
    if output == "json":
        report = DrainReport.model_validate_json(drained.stdout)  # stdout is the JSON alone
        assert (report.replayed, report.failed, report.remaining) == (0, 3, 3)
    else:
        assert drained.stdout.splitlines()[0] == (
            "replayed 0, already stored 0, conflicting 0, failed 3, dead 0, remaining 3"
        )

    # Status needs only the outbox: it works while the primary is down, and says why.
    text = outbox.run("status")
    assert text.exit_code == 0, text.output  # rows that failed to replay are pending, not dead
    assert _table_row(text.stdout, "sess-a")[1:3] == ["3", "0"]
    assert "Connection refused" in text.stdout
    assert PASSWORD not in text.output
    health, _ = _status(outbox)
    assert health.pending == 3
    assert "Connection refused" in (health.sessions[0].last_error or "")


@pytest.mark.parametrize("command", ["status", "drain", "retry-dead"])
def test_an_outbox_in_a_primary_that_is_down_is_one_clean_line(command: str) -> None:
    line = _assert_error_line(_invoke("--url", DOWN_PRIMARY, "outbox", command), 1)

    assert "connection" in line.lower()
    assert PASSWORD not in line


@pytest.mark.parametrize("command", ["status", "drain", "retry-dead"])
def test_a_missing_outbox_file_is_an_error_never_an_empty_outbox(
    command: str, tmp_path: Path
) -> None:
    missing = tmp_path / "typo" / "outbox.db"

    result = _invoke("--url", DOWN_PRIMARY, "outbox", "--outbox-url", str(missing), command)

    line = _assert_error_line(result, 1)
    assert f"no outbox file at {missing}" in line
    assert not missing.exists()
    assert not missing.parent.exists()


def test_the_outbox_url_comes_from_the_environment(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    box = Outbox(open_outbox_database(url))
    try:
        _park(box, "sess-a", 2)
    finally:
        box.database.dispose()

    result = CliRunner().invoke(
        main,
        ["outbox", "status", "--json"],
        env={"SESSIONREPO_DATABASE_URL": DOWN_PRIMARY, "SESSIONREPO_OUTBOX_URL": url},
    )

    assert result.exit_code == 0, result.output
    assert OutboxStatus.model_validate_json(result.stdout).pending == 2


def test_passwords_are_masked_in_what_status_prints(database_url: str) -> None:
    # A driver that echoed the primary's URL into an error the outbox recorded.
    outbox = Setup(DOWN_PRIMARY, database_url)
    box = outbox.outbox()
    try:
        _park(box, "sess-a", 1)
        _kill_head(box, "sess-a", f"cannot reach {DOWN_PRIMARY}")
    finally:
        box.database.dispose()

    for options in ((), ("--json",)):
        result = outbox.run("status", *options)

        assert result.exit_code == EXIT_DEAD, result.output
        assert PASSWORD not in result.output
        assert "gateway:***@127.0.0.1:1/chat" in result.output
