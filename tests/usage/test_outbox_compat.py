"""The outbox's usage column is added compatibly: an outbox file parked by the code of
revision 0009 (no ``usage`` column) is migrated when a writer opens it and drains as it
was; revision 0012 downgrades cleanly, keeping the parked messages."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from sqlalchemy import inspect, text

from sessionrepo import Message, TranscriptWriter, open_repository
from sessionrepo.store.database import Database
from sessionrepo.store.schema import downgrade, upgrade


def _park_as_0009(outbox: Path, session_id: str, messages: list[Message]) -> None:
    """Rows as the 0009 outbox held them, written with plain SQL."""
    database = Database(f"sqlite:///{outbox}")
    try:
        upgrade(database, "0009")
        columns = {
            c["name"]
            for c in database.read(lambda conn: inspect(conn).get_columns("pending_outbox"))
        }
        assert "usage" not in columns  # the fault: an outbox from before the column
        for position, message in enumerate(messages, start=1):
            database.write(
                lambda conn, position=position, message=message: conn.execute(
                    text(
                        "INSERT INTO pending_outbox (session_id, position, client_msg_uuid,"
                        " message, session_defaults, reason, state, attempts, rejections,"
                        " next_attempt_at, created_at) VALUES (:sid, :pos, :key, :message,"
                        " :defaults, 'down', 'pending', 0, 0, '2026-01-01 00:00:00.000000',"
                        " '2026-01-01 00:00:00.000000')"
                    ),
                    {
                        "sid": session_id,
                        "pos": position,
                        "key": message.client_msg_uuid.hex,
                        "message": json.dumps(message.model_dump(mode="json")),
                        "defaults": json.dumps({"source": "cli"}),
                    },
                )
            )
    finally:
        database.dispose()


def test_an_outbox_file_of_0009_still_drains(database_url: str, tmp_path: Path) -> None:
    outbox = tmp_path / "outbox.db"
    messages = [Message(role="user", content="q"), Message(role="assistant", content="a")]
    _park_as_0009(outbox, "old", messages)
    with open_repository(database_url) as repo:
        writer = TranscriptWriter(repo, outbox_url=f"sqlite:///{outbox}")
        try:
            assert writer.pending("old") == 2
            report = writer.drain(ignore_backoff=True)
            assert (report.replayed, report.remaining) == (2, 0)
        finally:
            writer.close()
        stored = [m.client_msg_uuid for m in repo.load_transcript("old")]
        assert stored == [m.client_msg_uuid for m in messages]
        assert repo.list_usage("old") == []


def test_0012_downgrades_and_upgrades_keeping_parked_messages(
    empty_database_url: str,
) -> None:
    database = Database(empty_database_url)
    try:
        upgrade(database, "head")
        key = uuid.uuid4()
        database.write(
            lambda conn: conn.execute(
                text(
                    "INSERT INTO pending_outbox (session_id, position, client_msg_uuid,"
                    " message, reason, state, attempts, rejections, next_attempt_at,"
                    " created_at, usage) VALUES ('s', 1, :key, '{}', 'down', 'pending',"
                    " 0, 0, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, '[]')"
                ),
                {"key": key if database.backend != "sqlite" else key.hex},
            )
        )
        downgrade(database, "0009")
        tables = set(database.read(lambda conn: inspect(conn).get_table_names()))
        assert not {"usage_records", "usage_prices"} & tables
        count = database.read(
            lambda conn: conn.execute(text("SELECT count(*) FROM pending_outbox")).scalar_one()
        )
        assert count == 1
        upgrade(database, "head")
        tables = set(database.read(lambda conn: inspect(conn).get_table_names()))
        assert {"usage_records", "usage_prices"} <= tables
    finally:
        database.dispose()
