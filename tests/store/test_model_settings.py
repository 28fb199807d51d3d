"""A session's model parameters have one name: ``model_settings``, the Python field, the
column (revision 0009 renamed it from ``model_config``, the name Pydantic reserves) and
the key of the export and the console's JSON. The old name is still read."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest
from sqlalchemy import inspect, text

from sessionrepo import Message, open_repository
from sessionrepo.ops import export_sessions, import_sessions
from sessionrepo.store.database import Database
from sessionrepo.store.schema import downgrade, upgrade

SETTINGS = {"temperature": 0.2, "top_p": None, "stop": ["\n"]}


@pytest.fixture
def empty_database(empty_database_url: str) -> Iterator[Database]:
    database = Database(empty_database_url)
    yield database
    database.dispose()


def _columns(database: Database) -> set[str]:
    return {c["name"] for c in database.read(lambda conn: inspect(conn).get_columns("sessions"))}


def test_the_rename_keeps_the_stored_settings_both_ways(
    empty_database: Database, empty_database_url: str
) -> None:
    upgrade(empty_database, "0008")
    empty_database.write(
        lambda conn: conn.execute(
            text(
                "INSERT INTO sessions (id, source, started_at, last_active_at, model_config)"
                " VALUES ('s1', 'cli', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, :settings)"
            ),
            {"settings": json.dumps(SETTINGS)},
        )
    )
    upgrade(empty_database, "head")  # through 0009, and the later revisions the store needs
    assert "model_settings" in _columns(empty_database)
    assert "model_config" not in _columns(empty_database)
    with open_repository(empty_database_url) as repo:
        assert repo.get_session("s1").model_settings == SETTINGS
    downgrade(empty_database, "0008")
    assert "model_config" in _columns(empty_database)
    stored = empty_database.read(
        lambda conn: conn.execute(text("SELECT model_config FROM sessions")).scalar_one()
    )
    assert json.loads(stored) == SETTINGS


def test_the_field_the_column_and_the_json_share_one_name(database_url: str) -> None:
    with open_repository(database_url) as store:
        session = store.create_session("s1", source="cli", model_settings=SETTINGS)
        assert session.model_settings == SETTINGS
        assert session.model_dump(mode="json", by_alias=True)["model_settings"] == SETTINGS
        assert "model_config" not in session.model_dump(by_alias=True)
        stored = store.database.read(
            lambda conn: conn.execute(text("SELECT model_settings FROM sessions")).scalar_one()
        )
        assert json.loads(stored) == SETTINGS
        out = io.BytesIO()
        export_sessions(store, out)
        [record] = [
            json.loads(line)
            for line in out.getvalue().splitlines()
            if json.loads(line)["type"] == "session"
        ]
        assert record["session"]["model_settings"] == SETTINGS


def test_the_old_name_is_still_read(database_url: str) -> None:
    """A keyword argument, a fork's override and an export written before the rename."""
    with open_repository(database_url) as store:
        old = store.create_session("s1", model_config={"temperature": 1})
        assert old.model_settings == {"temperature": 1}
        store.append("s1", [Message(role="user", content="hi")])
        fork = store.fork_session("s1", 1, "s2", model_config={"temperature": 0})
        assert fork.model_settings == {"temperature": 0}
        assert store.fork_session("s1", 1, "s3").model_settings == {"temperature": 1}
        exported = io.BytesIO()
        export_sessions(store, exported)
    lines = []
    for line in exported.getvalue().splitlines():
        record = json.loads(line)
        if record["type"] == "session":
            record["session"]["id"] = "old:" + record["session"]["id"]
            record["session"]["model_config"] = record["session"].pop("model_settings")
        elif record["type"] == "message":
            record["session_id"] = "old:" + record["session_id"]
        lines.append(json.dumps(record).encode())
    with open_repository(database_url) as store:
        import_sessions(store, io.BytesIO(b"\n".join(lines) + b"\n"))
        assert store.get_session("old:s1").model_settings == {"temperature": 1}
        assert store.get_session("old:s2").model_settings == {"temperature": 0}
