"""``async_delegations``: a delegated result Hermes never delivered to its session is
listed by its id and with its session, whatever the version names those columns
(``delegation_id`` / ``origin_session`` / ``state`` from version 31, ``id`` /
``session_id`` / ``status`` before), in the root home and in a profile."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from sessionrepo.cli.hermes import import_hermes as command
from sessionrepo.importers.hermes import HermesImportReport, import_hermes, open_hermes
from sessionrepo.store.repository import open_repository

from support.hermes_fixtures import HermesDB

#: The columns before version 31.
OLD_TABLE = (
    "CREATE TABLE async_delegations (id TEXT PRIMARY KEY, session_id TEXT, status TEXT, "
    "result TEXT, created_at REAL, completed_at REAL, delivered_at REAL)"
)


def v31_home(path: Path, session_id: str) -> None:
    path.mkdir(parents=True)
    db = HermesDB(path / "state.db")
    db.session(session_id)
    db.message(session_id, "user", "research this for me")
    for delegation, delivered in (("dlg-done", db.clock), ("dlg-open", None)):
        db.execute(
            "INSERT INTO async_delegations (delegation_id, origin_session, state, "
            "dispatched_at, updated_at, delivered_at) VALUES (?, ?, 'running', ?, ?, ?)",
            delegation,
            session_id,
            db.clock,
            db.clock,
            delivered,
        )
    db.close()


def test_version_31_columns_in_the_root_home_and_a_profile(
    database_url: str, tmp_path: Path
) -> None:
    root = tmp_path / "hermes"
    v31_home(root, "root_session")
    v31_home(root / "profiles" / "work", "work_session")

    result = CliRunner().invoke(
        command,
        ["--url", database_url, "--json", str(root)],
        env={"SESSIONREPO_DATABASE_URL": None, "SESSIONREPO_OUTBOX_URL": None},
    )

    assert result.exit_code == 0, result.output
    report = HermesImportReport.model_validate_json(result.stdout)
    found = [
        (home.profile, p.where, p.session_id)
        for home in report.homes
        for p in home.pending_delegations
    ]
    assert found == [
        ("default", "state.db async_delegations delegation_id='dlg-open'", "root_session"),
        ("work", "state.db async_delegations delegation_id='dlg-open'", "work_session"),
    ]
    assert all(
        "(state 'running')" in p.problem for home in report.homes for p in home.pending_delegations
    )


@pytest.mark.parametrize("version", [2, 30])
def test_the_columns_older_versions_have(version: int, database_url: str, tmp_path: Path) -> None:
    home = tmp_path / "hermes"
    home.mkdir()
    db = HermesDB(home / "state.db", version=version)
    db.session("s1")
    db.execute(OLD_TABLE)
    db.execute("INSERT INTO async_delegations VALUES ('d1', 's1', 'completed', 'x', 1, 2, 3)")
    db.execute("INSERT INTO async_delegations VALUES ('d2', 's1', 'completed', 'y', 1, 2, NULL)")
    db.close()

    repository = open_repository(database_url)
    try:
        with open_hermes(home) as source:
            summary = import_hermes(source, repository)
    finally:
        repository.close()

    assert [(p.where, p.session_id) for p in summary.pending_delegations] == [
        ("state.db async_delegations id='d2'", "s1")
    ]
    assert "'completed'" in summary.pending_delegations[0].problem
