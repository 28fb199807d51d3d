"""Edits through ``TranscriptWriter``: applied at once when nothing is parked, else parked
in the session's FIFO and replayed in their place (never reordered against the session's
parked appends). Both backends; the outbox in the primary or in its own SQLite file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sessionrepo import BackendUnavailable, Message, TranscriptWriter, ensure_key

from support.outbox_workers import FlakyRepository


class FlakyEditor(FlakyRepository):
    """A flaky primary whose edits fail too while it is down."""

    def rewind(self, /, session_id: str, to_seq: int) -> Any:
        if self.down:
            raise BackendUnavailable("the primary is down (injected)", code="injected")
        return super().rewind(session_id, to_seq)

    def retract(self, /, session_id: str, keys: Any) -> Any:
        if self.down:
            raise BackendUnavailable("the primary is down (injected)", code="injected")
        return super().retract(session_id, keys)


@pytest.fixture(params=["primary", "sqlite-file"])
def outbox_url(request: pytest.FixtureRequest, database_url: str, tmp_path: Path) -> str:
    return database_url if request.param == "primary" else f"sqlite:///{tmp_path / 'outbox.db'}"


@pytest.fixture
def primary(database_url: str) -> Iterator[FlakyEditor]:
    from sessionrepo import open_repository

    repository = FlakyEditor(open_repository(database_url, auto_migrate=True))
    yield repository
    repository.close()


@pytest.fixture
def writer(primary: FlakyEditor, outbox_url: str) -> Iterator[TranscriptWriter]:
    writer = TranscriptWriter(primary, outbox_url=outbox_url, backoff_base=0.0, max_attempts=1)
    yield writer
    writer.close()


def _turns(count: int, start: int = 0) -> list[dict[str, Any]]:
    messages = [{"role": "user", "content": f"turn {i}"} for i in range(start, start + count)]
    for message in messages:
        ensure_key(message)
    return messages


def _live(primary: FlakyEditor) -> list[str]:
    return [m.content for m in primary.load_transcript("s")]


def test_an_edit_with_nothing_parked_is_applied_at_once(
    primary: FlakyEditor, writer: TranscriptWriter
) -> None:
    writer.write("s", _turns(3))
    result = writer.rewind("s", 1)
    assert result.status == "stored"
    assert result.edit is not None
    assert len(result.edit.superseded) == 2
    assert _live(primary) == ["turn 0"]


def test_a_parked_rewind_keeps_its_place_among_parked_appends(
    primary: FlakyEditor, writer: TranscriptWriter
) -> None:
    turns = _turns(5)
    assert writer.write("s", turns[0:2]).status == "stored"
    primary.down = True
    assert writer.write("s", turns[2:4]).status == "parked"
    assert writer.rewind("s", 1).status == "parked"
    primary.down = False  # healthy again, but the session has parked rows
    assert writer.write("s", turns[4:5]).status == "parked"
    assert writer.pending("s") == 4  # two messages, the rewind, one message

    report = writer.drain()

    assert report.remaining == 0
    # In send order: turns 2 and 3 landed, the rewind took 1..3 out, turn 4 came after.
    assert _live(primary) == ["turn 0", "turn 4"]
    history = primary.load_transcript("s", include_retracted=True)
    assert [(m.content, m.superseded) for m in history] == [
        ("turn 0", None),
        ("turn 1", "retracted"),
        ("turn 2", "retracted"),
        ("turn 3", "retracted"),
        ("turn 4", None),
    ]
    assert primary.get_session("s").message_count == 2


def test_a_parked_compaction_replays_in_place(
    primary: FlakyEditor, writer: TranscriptWriter
) -> None:
    turns = _turns(4)
    writer.write("s", turns[0:2])
    primary.down = True
    writer.write("s", turns[2:3])
    primary.down = False
    summary = Message(role="system", content="summary of turns 0-2")
    assert writer.compact("s", 3, summary).status == "parked"
    writer.write("s", turns[3:4])
    writer.drain()
    assert _live(primary) == ["summary of turns 0-2", "turn 3"]


def test_a_parked_edit_the_primary_refuses_is_set_aside_and_holds_nothing_up(
    primary: FlakyEditor, writer: TranscriptWriter
) -> None:
    turns = _turns(3)
    writer.write("s", turns[0:1])
    primary.down = True
    writer.write("s", turns[1:2])
    stranger = Message(role="user", content="never stored")
    assert writer.retract("s", [stranger.client_msg_uuid]).status == "parked"
    primary.down = False
    writer.write("s", turns[2:3])

    report = writer.drain()

    assert report.dead == 1  # the retract of a key the session lacks, kept and visible
    assert _live(primary) == ["turn 0", "turn 1", "turn 2"]
    assert writer.status().dead == 1
