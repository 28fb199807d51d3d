"""An edit through the writer takes the same attempt-then-park path as a write
(``sessionrepo.outbox.attempt``): while the primary is known down it parks at once,
without trying it; an edit the primary cannot take trips the breaker as a write does; and
either way it keeps its place in the session's FIFO.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sessionrepo import BackendUnavailable, EditResult, TranscriptWriter, open_repository

from support.outbox_workers import FlakyRepository, keys_of, make_message


class EditsFlaky(FlakyRepository):
    """A primary whose edits, like its appends, fail while it is ``down``."""

    def __init__(self, repository: Any) -> None:
        super().__init__(repository)
        self.edits: list[str] = []

    @classmethod
    def open(cls, url: str) -> EditsFlaky:
        return cls(open_repository(url))

    def rewind(self, session_id: str, to_seq: int) -> EditResult:
        self.edits.append(session_id)
        if self.down:
            raise BackendUnavailable("the primary is down (injected)", code="injected")
        return super().rewind(session_id, to_seq)


def test_an_edit_while_the_primary_is_known_down_parks_at_once(
    database_url: str, tmp_path: Path
) -> None:
    primary = EditsFlaky.open(database_url)
    writer = TranscriptWriter(
        primary, outbox_url=f"sqlite:///{tmp_path / 'outbox.db'}", probe_interval=60
    )
    try:
        kept, dropped = make_message("e", 0), make_message("e", 1)
        assert writer.write("e", [kept, dropped]).status == "stored"
        primary.down = True
        assert writer.write("other", [make_message("other", 0)]).status == "parked"
        assert writer.primary_down is not None  # the breaker is tripped

        result = writer.rewind("e", 1)
        assert result.status == "parked"
        assert result.reason is not None
        assert "unavailable" in result.reason
        assert primary.edits == []  # not tried: the primary is known down

        primary.down = False
        report = writer.drain()  # its first replay that goes through closes the breaker
        assert (report.replayed, report.failed, report.remaining) == (2, 0, 0)
        assert primary.edits == ["e"]  # applied once, by the replay
        stored = [str(m.client_msg_uuid) for m in primary.load_transcript("e")]
        assert stored == keys_of([kept])
    finally:
        writer.close()
        primary.close()


def test_an_edit_the_primary_cannot_take_trips_the_breaker_like_a_write(
    database_url: str, tmp_path: Path
) -> None:
    primary = EditsFlaky.open(database_url)
    writer = TranscriptWriter(
        primary, outbox_url=f"sqlite:///{tmp_path / 'outbox.db'}", probe_interval=60
    )
    try:
        assert writer.write("e", [make_message("e", 0)]).status == "stored"
        primary.down = True
        result = writer.rewind("e", 0)
        assert result.status == "parked"
        assert primary.edits == ["e"]  # tried once, failed
        assert writer.primary_down is not None
        # So the next write parks at once too, without trying the primary.
        tried = len(primary.attempts)
        assert writer.write("e", [make_message("e", 1)]).status == "parked"
        assert len(primary.attempts) == tried
    finally:
        writer.close()
        primary.close()
