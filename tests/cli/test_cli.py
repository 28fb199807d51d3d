"""The ``sessionrepo`` command line: help everywhere, ``migrate`` on both backends, clean
errors, masked passwords, and a ``demo`` whose verification is real."""

from __future__ import annotations

import re
import sqlite3
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import make_url

from sessionrepo import SchemaOutOfDate, open_repository
from sessionrepo.cli import main
from sessionrepo.demo import GatewayReport, OutageReport, outbox_paths, run_demo
from sessionrepo.demo.verify import verify
from sessionrepo.store.schema import head_revision

from support.cli_tree import COMMAND_PATHS, command_at

if TYPE_CHECKING:
    from conftest import PostgresServer


def _run(*args: str, env: dict[str, str | None] | None = None) -> Result:
    # SESSIONREPO_DATABASE_URL unset unless a test sets it: the tests choose the database.
    return CliRunner().invoke(
        main, list(args), env={"SESSIONREPO_DATABASE_URL": None, **(env or {})}
    )


def _assert_clean_error(result: Result) -> str:
    """Exit 1, one line on stderr, no traceback; returns that line."""
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)  # not a library exception escaping
    assert "Traceback" not in result.output
    line = result.stderr.strip()
    assert "\n" not in line, line
    assert line.startswith("Error: ")
    return line


def test_the_command_tree_is_what_the_issue_names() -> None:
    assert {" ".join(path) for path in COMMAND_PATHS} >= {"", "migrate", "demo"}


@pytest.mark.parametrize("path", COMMAND_PATHS, ids=lambda p: " ".join(("sessionrepo", *p)))
def test_every_command_has_help_with_an_example(path: tuple[str, ...]) -> None:
    command = command_at(path)
    assert command.help
    assert command.help.strip()

    result = _run(*path, "--help")

    assert result.exit_code == 0, result.output
    assert "Example:" in result.stdout
    assert f"sessionrepo {' '.join(path)}".strip() in result.stdout.split("Example:", 1)[1]


@pytest.mark.parametrize("path", COMMAND_PATHS, ids=lambda p: " ".join(("sessionrepo", *p)))
def test_every_command_describes_itself_in_help_and_in_its_group_listing(
    path: tuple[str, ...],
) -> None:
    # The walk finds every registered command (sqlite-utils' pattern): one added to any
    # command module without a description fails here, whoever registers it.
    command = command_at(path)
    assert command.help is not None
    described = " ".join(command.help.split("\n\n", 1)[0].split())
    assert described

    result = _run(*path, "--help")

    assert result.exit_code == 0, result.output
    usage, _, rest = result.stdout.partition("\n\n")
    assert usage.startswith(f"Usage: sessionrepo {' '.join(path)}".rstrip())
    assert " ".join(rest.split("\n\n", 1)[0].split()) == described
    if path:
        listing = _run(*path[:-1], "--help").stdout.split("Commands:\n", 1)[1]
        row = next(line.split() for line in listing.splitlines() if line.split()[:1] == [path[-1]])
        assert len(row) > 1, f"{path[-1]} has no short help in its group's listing"


# -- migrate ------------------------------------------------------------------------


def test_migrate_upgrades_an_empty_database_and_a_second_run_is_a_no_op(
    empty_database_url: str,
) -> None:
    with pytest.raises(SchemaOutOfDate):
        open_repository(empty_database_url, auto_migrate=False)

    first = _run("--url", empty_database_url, "migrate")

    assert first.exit_code == 0, first.output
    assert f"upgraded from an empty database to revision {head_revision()} (head)" in first.stdout
    open_repository(empty_database_url, auto_migrate=False).close()

    second = _run("--url", empty_database_url, "migrate")

    assert second.exit_code == 0, second.output
    assert f"at revision {head_revision()} (head)" in second.stdout
    assert "upgraded" not in second.stdout
    open_repository(empty_database_url, auto_migrate=False).close()


def test_migrate_takes_the_url_from_the_environment(empty_database_url: str) -> None:
    result = _run("migrate", env={"SESSIONREPO_DATABASE_URL": empty_database_url})

    assert result.exit_code == 0, result.output
    open_repository(empty_database_url, auto_migrate=False).close()


def test_migrate_sql_prints_the_schema_and_leaves_the_database_alone(
    empty_database_url: str,
) -> None:
    result = _run("--url", empty_database_url, "migrate", "--sql")

    assert result.exit_code == 0, result.output
    for table in ("alembic_version", "sessions", "messages"):
        assert re.search(rf"CREATE TABLE {table}\b", result.stdout), table
    assert f"-> {head_revision()}" in result.stdout
    engine = create_engine(empty_database_url)
    try:
        assert inspect(engine).get_table_names() == []
    finally:
        engine.dispose()


def test_migrate_sql_needs_no_server_and_never_shows_the_password() -> None:
    # Port 1 refuses connections: the SQL can only come from the URL's dialect.
    result = _run("--url", "postgresql://u:secret@127.0.0.1:1/x", "migrate", "--sql")

    assert result.exit_code == 0, result.output
    assert "CREATE TABLE messages" in result.stdout
    assert "secret" not in result.output


def test_an_unsupported_database_is_one_clean_line() -> None:
    result = _run("--url", "mysql://app@127.0.0.1/chat", "migrate")

    line = _assert_clean_error(result)
    assert "mysql" in line
    assert "SQLite and PostgreSQL" in line


@pytest.mark.postgres
def test_a_postgresql_database_that_does_not_exist_is_one_clean_line(
    postgres_server: PostgresServer,
) -> None:
    url = postgres_server.url_for(f"sessionrepo_missing_{uuid.uuid4().hex[:12]}")

    line = _assert_clean_error(_run("--url", url, "migrate"))

    assert "does not exist" in line


def test_a_password_is_masked_when_the_server_cannot_be_reached() -> None:
    result = _run("--url", "postgresql://u:secret@127.0.0.1:1/x", "migrate")

    _assert_clean_error(result)
    assert "secret" not in result.output


@pytest.mark.postgres
def test_a_password_is_masked_in_what_migrate_prints(postgres_server: PostgresServer) -> None:
    # The test server trusts local connections, so the password is accepted and ignored:
    # migrate succeeds and prints the URL it worked on.
    name = postgres_server.new_database(migrated=False)
    try:
        url = make_url(postgres_server.url_for(name)).set(password="pa55-w0rd%")
        result = _run("--url", url.render_as_string(hide_password=False), "migrate")

        assert result.exit_code == 0, result.output
        assert "***" in result.stdout
        assert "pa55" not in result.output
    finally:
        postgres_server.drop(name)


def test_a_url_that_does_not_parse_is_a_usage_error_that_hides_it() -> None:
    result = _run("--url", "postgresql://u:secret@db:notaport/x", "migrate")

    assert result.exit_code == 2, result.output
    assert "not a database URL" in result.output
    assert "secret" not in result.output


# -- demo ---------------------------------------------------------------------------


@pytest.mark.sqlite
@pytest.mark.slow
def test_demo_runs_gateway_processes_through_an_outage_and_reports_ok(tmp_path: Path) -> None:
    path = tmp_path / "demo.db"

    result = _run("demo", "--path", str(path), "--turns", "4")

    assert result.exit_code == 0, result.output
    assert "OK: nothing lost, nothing doubled, the outage drained" in result.stdout
    assert "FAILED" not in result.stdout

    def figure(label: str) -> int:
        found = re.search(rf"{label}\s+([\d,]+)", result.stdout)
        assert found, label
        return int(found.group(1).replace(",", ""))

    attempted = figure(r"attempted sends \(re-sends included\)")
    made, stored = figure("distinct messages made"), figure("rows stored")
    assert attempted > made == stored > 0
    # Parked messages are neither inserted nor skipped when sent; the drains insert them.
    assert figure("duplicates skipped") < attempted - stored
    # Every gateway flushed during the outage and every one of those writes was parked.
    for name in ("discord", "telegram", "cli"):
        outage = re.search(rf"^  {name}\s+(\d+) of (\d+) writes parked", result.stdout, re.M)
        assert outage, name
        assert int(outage.group(1)) == int(outage.group(2)) > 0
    # What the writers logged about the outage is in the report, not loose on stderr.
    assert result.stdout.count("its writer logged (expected in an outage): ") == 3
    assert figure("writes parked in an outbox") >= 3
    assert figure("parked messages drained") > 0
    assert figure("messages left in the outboxes") == 0
    engine = create_engine(f"sqlite:///{path}")  # the kept files say the same
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT COUNT(*) FROM messages")).scalar() == stored
    finally:
        engine.dispose()
    for outbox in outbox_paths(path).values():
        engine = create_engine(f"sqlite:///{outbox}")
        try:
            with engine.connect() as conn:
                assert conn.execute(text("SELECT COUNT(*) FROM pending_outbox")).scalar() == 0
        finally:
            engine.dispose()


def test_demo_refuses_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "taken.db"
    path.write_bytes(b"")

    result = _run("demo", "--path", str(path))

    assert result.exit_code == 2
    assert "already exists" in result.output


def test_demo_refuses_an_existing_outbox_file(tmp_path: Path) -> None:
    path = tmp_path / "demo.db"
    outbox_paths(path)["cli"].write_bytes(b"")

    result = _run("demo", "--path", str(path))

    assert result.exit_code == 2
    assert "already exists" in result.output
    assert not path.exists()


@pytest.mark.sqlite
@pytest.mark.slow
def test_the_demo_checks_catch_loss_reordering_no_outage_and_a_full_outbox(
    tmp_path: Path,
) -> None:
    path = tmp_path / "demo.db"
    demo = run_demo(path, turns=2)
    assert demo.ok, demo.checks
    url = f"sqlite:///{path}"

    def failing(
        reports: list[GatewayReport],
        outage: OutageReport = demo.outage,
        outboxes: dict[str, Path] = demo.outboxes,
    ) -> set[str]:
        return {
            check.name for check in verify(url, reports, outage, outboxes).checks if not check.ok
        }

    def copies() -> list[GatewayReport]:
        return [GatewayReport(**vars(r)) for r in demo.gateways]

    assert failing(demo.gateways) == set()

    lost = copies()
    lost[0].made = {sid: [*keys, str(uuid.uuid4())] for sid, keys in lost[0].made.items()}
    assert "every message made is stored, and nothing else" in failing(lost)

    reordered = copies()
    reordered[1].made = {sid: keys[::-1] for sid, keys in reordered[1].made.items()}
    assert failing(reordered) == {"each writer's messages are in the order it made them"}

    # An outage that parked nothing (the lock came too late) is a failed demo, not a pass.
    no_outage = copies()
    for report in no_outage:
        report.outage_parked = 0
    assert "the outage parked every write made while the primary was locked" in failing(no_outage)
    early = OutageReport(locked_at=demo.outage.locked_at, released_at=demo.gateways[0].outage_first)
    assert failing(demo.gateways, outage=early) == {
        "the lock was held through every gateway's outage flushes"
    }

    undrained = copies()
    undrained[2].parked_keys = {"cli:dave": [str(uuid.uuid4())]}
    assert "every parked message was drained into the primary" in failing(undrained)

    # A row left in an outbox file is found by counting the file's rows.
    leftover = tmp_path / "leftover.db"
    with sqlite3.connect(leftover) as conn:
        conn.execute("CREATE TABLE pending_outbox (id INTEGER)")
        conn.execute("INSERT INTO pending_outbox VALUES (1)")
    conn.close()
    outboxes = {**demo.outboxes, "cli": leftover}
    assert failing(demo.gateways, outboxes=outboxes) == {
        "every outbox is empty (rows counted in each outbox file)"
    }
