"""What an erasure's tombstones do to the copies that come back after it, beyond the
messages themselves: the usage records riding with a re-sent batch, and the bytes a
drain of a gateway's outbox file leaves behind.

- A batch re-sent after an erasure keeps the usage of its kept (new) messages and drops
  that of the erased ones; a batch whose every message was erased writes nothing, not
  even the session row, though it carries usage.
- A drain that refuses parked copies of erased messages deletes their rows and
  checkpoints the outbox file's WAL: a byte scan of the file and its ``-wal`` right after
  the drain, the gateway still running, finds none of the erased text.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from sessionrepo import (
    AsyncTranscriptWriter,
    Message,
    NotFound,
    Session,
    SessionRepository,
    TranscriptWriter,
    open_async_repository,
    open_repository,
)
from sessionrepo.models import AppendResult
from sessionrepo.models.message import utcnow
from sessionrepo.models.usage import Usage
from sessionrepo.ops.erase import scan_file
from sessionrepo.outbox.opening import open_outbox_database
from sessionrepo.outbox.table import Outbox
from sessionrepo.store import tombstones
from sessionrepo.store.codec import PreparedBatch

pytestmark = pytest.mark.contract

SECRET = "parkedpangolin"


@pytest.fixture
def setup(database_url: str) -> Iterator[SessionRepository]:
    repository = open_repository(database_url)
    yield repository
    repository.close()


def _erased_session(setup: SessionRepository) -> Message:
    """Session ``s`` with one message, erased; the message (its copy a gateway holds)."""
    old = Message(role="user", content=f"old {SECRET}")
    setup.append("s", [old], user_id="alice")
    setup.erase(session_id="s")
    return old


def _usage(message: Message, tokens: int) -> Usage:
    return Usage(
        usage_id=uuid.uuid4(),
        message_uuid=message.client_msg_uuid,
        model="m",
        input_tokens=tokens,
        output_tokens=1,
    )


def test_a_resent_batch_keeps_the_usage_of_its_kept_messages_only(
    repo: Any, setup: SessionRepository
) -> None:
    old = _erased_session(setup)
    new = Message(role="assistant", content="a new answer")  # made after the erasure
    usage = [_usage(old, 100), _usage(new, 7)]

    result = repo.append("s", [old, new], usage=usage)

    assert result.erased == [old.client_msg_uuid]
    assert result.inserted == [new.client_msg_uuid]
    assert [u.usage_id for u in setup.list_usage("s")] == [usage[1].usage_id]
    assert setup.get_session("s").input_tokens == 7


def test_a_resent_batch_of_erased_messages_with_usage_writes_nothing(
    repo: Any, setup: SessionRepository
) -> None:
    old = _erased_session(setup)

    result = repo.append("s", [old], usage=[_usage(old, 100)])

    assert result.erased == [old.client_msg_uuid]
    assert result.inserted == []
    with pytest.raises(NotFound):
        setup.get_session("s")  # not recreated, not even empty, by its usage
    assert setup.list_usage("s") == []


def test_screened_carries_the_kept_messages_usage_and_the_sessions_own(
    setup: SessionRepository,
) -> None:
    old = _erased_session(setup)
    new = Message(role="assistant", content="kept")
    batch = setup.prepare("s", [old, new], usage=[_usage(old, 100), _usage(new, 7)])
    own = Usage(usage_id=uuid.uuid4(), model="m", input_tokens=3)  # no message: the session's
    batch.usage = (*batch.usage, own)
    seen: list[PreparedBatch] = []

    def append(kept: PreparedBatch) -> AppendResult:
        seen.append(kept)
        return AppendResult(session_id="s")

    result = tombstones.screened(setup.database, batch, append)

    assert result is not None
    assert result.erased == [old.client_msg_uuid]
    (kept,) = seen
    assert kept.keys == [new.client_msg_uuid]
    assert [u.usage_id for u in kept.usage] == [batch.usage[1].usage_id, own.usage_id]


def _park(path: Path, session_id: str, messages: list[Message]) -> None:
    outbox = Outbox(open_outbox_database(f"sqlite:///{path}"))
    try:
        outbox.park(session_id, messages, Session(id=session_id, user_id="alice"), reason="down")
    finally:
        outbox.close()


@pytest.mark.parametrize("mode", ["sync", pytest.param("async", marks=pytest.mark.asyncapi)])
def test_a_drain_leaves_no_erased_text_in_the_outbox_files_bytes(
    mode: str, setup: SessionRepository, database_url: str, tmp_path: Path
) -> None:
    gateway = tmp_path / "gateway" / "outbox.db"
    gateway.parent.mkdir()
    made = utcnow() - timedelta(seconds=1)
    parked = [
        Message(role="user", content=f"parked {SECRET} {n} " + "x" * 2000, timestamp=made)
        for n in range(5)
    ]
    setup.append("s", [Message(role="user", content="stored before")], user_id="alice")
    _park(gateway, "s", parked)
    assert scan_file(gateway, [SECRET]) == {0: 5}  # the copies are in the file
    setup.erase(session_id="s")  # elsewhere: the gateway's file is out of its reach

    files = [gateway, gateway.with_name("outbox.db-wal")]
    if mode == "sync":
        writer = TranscriptWriter(setup, outbox_url=f"sqlite:///{gateway}")
        try:
            report = writer.drain()
            assert writer.pending() == 0
            found = {str(f): scan_file(f, [SECRET]) for f in files if f.exists()}
        finally:
            writer.close()
    else:
        report, found = asyncio.run(_drain_async(database_url, gateway, files))

    assert (report.replayed, report.erased) == (0, 5)
    assert found == {str(f): {} for f in files if str(f) in found}
    assert str(gateway) in found  # scanned while the gateway runs, its WAL too if any
    with pytest.raises(NotFound):
        setup.get_session("s")


async def _drain_async(
    url: str, gateway: Path, files: list[Path]
) -> tuple[Any, dict[str, dict[int, int]]]:
    repository = await open_async_repository(url)
    writer = AsyncTranscriptWriter(repository, outbox_url=f"sqlite:///{gateway}")
    try:
        report = await writer.drain()
        assert await writer.pending() == 0
        return report, {str(f): scan_file(f, [SECRET]) for f in files if f.exists()}
    finally:
        await writer.close()
        await repository.close()
