"""A drainer's claim on a session's parked rows, when its holder dies and when the
outbox's disk is full.

- A drainer killed (SIGKILL) in the middle of a replay lets go of its session within one
  lease of a few seconds, because the live drainer renews its lease every second (a
  heartbeat) instead of taking a long one: another writer's drain then replays the
  session. The child holds the claim, renewed, when it is killed; the test proves both.
- A drain a caller asks for while the writer's own background round replays the same
  session waits for that replay (one batch) instead of finding the session leased and
  reporting its rows as still pending: the lease keeps *other* drainers out.
- With the outbox's disk full (SQLite's ``SQLITE_FULL``: every connection of the outbox
  capped at the pages the file has, ``PRAGMA max_page_count``, so a write that needs a
  new page is refused, as on a full disk), a claim, which lengthens rows, is refused;
  a drain still replays (under its transaction's lock, deleting, which needs no page)
  and a write to a session with parked rows still reaches the primary.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select

from sessionrepo import (
    AsyncTranscriptWriter,
    BackendUnavailable,
    NotFound,
    SessionRepository,
    TranscriptWriter,
    open_async_repository,
    open_repository,
)
from sessionrepo.models.message import utcnow
from sessionrepo.models.tables import outbox_table

from support import outbox_workers as workers
from support.harness import SPAWN, held_until, holding_the_write_lock, until_primary_back
from support.outbox_workers import FlakyRepository, keys_of, make_message

#: Upper bound for a child to start and report (a healthy one takes a second or two).
CHILD_TIMEOUT = 60.0
#: Upper bound for another drain to replay the dead drainer's session: generous, yet
#: well inside the 60 s lease claims used to have.
TAKEOVER_TIMEOUT = 30.0
#: The dying drainer's lease (seconds). Renewed every second, so the claim checked after
#: the first lease's end has 2 s left: a child whose heartbeat a loaded machine stalls for
#: a second still holds it (at 1.5 s, renewed every 0.5 s, a CI run saw it lapse).
LEASE = 3.0

O = outbox_table.c  # noqa: E741


@pytest.fixture(autouse=True)
def _outbox_only_where_the_test_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SESSIONREPO_OUTBOX_URL", raising=False)


@pytest.fixture
def outbox_url(database_url: str, backend: str, tmp_path: Path) -> str:
    """A SQLite primary's outbox in a file of its own (the deployment that survives the
    primary), a PostgreSQL primary's in the primary itself: both claim kinds."""
    return f"sqlite:///{tmp_path / 'outbox.db'}" if backend == "sqlite" else database_url


def _stored(repository: SessionRepository, session_id: str) -> list[str]:
    try:
        return [str(m.client_msg_uuid) for m in repository.load_transcript(session_id)]
    except NotFound:
        return []


def _claims(writer: TranscriptWriter, session_id: str) -> set[tuple[str | None, datetime | None]]:
    """The session's rows' (claimed_by, claimed_until)."""
    query = select(O.claimed_by, O.claimed_until).where(O.session_id == session_id)
    return set(writer.outbox.database.read(lambda conn: conn.execute(query).all()))


def _receive(reader: Any, kind: str) -> Any:
    if not reader.poll(CHILD_TIMEOUT):
        pytest.fail(f"the child did not report {kind!r}")
    got, value = reader.recv()
    assert got == kind, (got, value)
    return value


@pytest.mark.slow
def test_a_killed_drainers_claim_ends_within_seconds(
    database_url: str, outbox_url: str, tmp_path: Path
) -> None:
    batch = [make_message("s", index) for index in range(3)]
    with open_repository(database_url) as repository:
        # Parked while the primary is down.
        flaky = FlakyRepository(repository)
        flaky.down = True
        parker = TranscriptWriter(flaky, outbox_url=outbox_url)
        assert parker.write("s", batch).status == "parked"
        parker.close()

        reader, sender = SPAWN.Pipe(duplex=False)
        child = SPAWN.Process(
            target=workers.drain_until_killed,
            kwargs={"url": database_url, "outbox_url": outbox_url, "lease": LEASE, "conn": sender},
            daemon=True,
        )
        child.start()
        sender.close()
        writer = TranscriptWriter(repository, outbox_url=outbox_url)
        try:
            owner = _receive(reader, "owner")
            assert _receive(reader, "replaying") == "s"
            # The child holds the claim...
            ((by, first_until),) = _claims(writer, "s")
            assert by == owner
            assert first_until is not None
            assert first_until > utcnow()
            # ... past the end of the lease it first took, renewed by its heartbeat,
            # and meanwhile nobody else gets the session.
            give_up = time.monotonic() + CHILD_TIMEOUT
            while utcnow() < first_until + timedelta(seconds=0.2):
                assert time.monotonic() < give_up
                time.sleep(0.05)
            ((by, until),) = _claims(writer, "s")
            assert by == owner
            assert until is not None
            assert until > utcnow()
            report = writer.drain()
            assert (report.replayed, report.duplicates) == (0, 0)
            assert writer.pending("s") == len(batch)
            assert child.is_alive()
            child.kill()
            child.join(CHILD_TIMEOUT)
            assert child.exitcode == -signal.SIGKILL

            give_up = time.monotonic() + TAKEOVER_TIMEOUT
            while writer.pending("s"):
                assert time.monotonic() < give_up, f"still claimed: {_claims(writer, 's')}"
                writer.drain()
                time.sleep(0.1)
            assert _stored(repository, "s") == keys_of(batch)
        finally:
            writer.close()
            if child.is_alive():
                child.kill()
                child.join()


def test_an_async_drainer_renews_its_claim_while_its_replay_waits(
    database_url: str, backend: str, tmp_path: Path
) -> None:
    """The asyncio writer's heartbeat is a task: a replay held up by the primary (a held
    lock) for longer than the lease keeps its claim, and no other drainer takes the
    session meanwhile."""
    outbox_url = f"sqlite:///{tmp_path / 'outbox.db'}"
    # A renewal every third of it: at 0.6 s a loaded 2-core CI machine once starved the
    # heartbeat for a whole lease.
    lease = 1.2

    async def main() -> None:
        async with (
            await open_async_repository(database_url) as repository,
            AsyncTranscriptWriter(
                repository, outbox_url=outbox_url, deadline=2.0, lease=lease
            ) as writer,
        ):
            assert (await writer.write("s", [make_message("s", 0)])).status == "stored"
            later = [make_message("s", 1)]
            with open_repository(database_url) as other_primary:
                other = TranscriptWriter(other_primary, outbox_url=outbox_url)
                try:
                    with holding_the_write_lock(database_url, backend, "s"):
                        assert (await writer.write("s", later)).status == "parked"
                        replay = asyncio.ensure_future(writer.drain(ignore_backoff=True))
                        give_up = time.monotonic() + CHILD_TIMEOUT
                        while not (claims := _claims(other, "s")) or None in dict(claims):
                            assert time.monotonic() < give_up, "never claimed"
                            await asyncio.sleep(0.02)
                        ((owner, first_until),) = claims
                        assert first_until is not None
                        while utcnow() < first_until + timedelta(seconds=0.2):
                            await asyncio.sleep(0.02)
                        ((by, until),) = _claims(other, "s")
                        assert by == owner
                        assert until is not None
                        assert until > utcnow()  # renewed past the lease it first took
                        taken = other.drain()
                        assert (taken.replayed, taken.duplicates, taken.failed) == (0, 0, 0)
                    report = await replay
                    # (A duplicate: the write abandoned at its deadline committed first.)
                    assert (report.replayed + report.duplicates, report.remaining) == (1, 0)
                finally:
                    other.close()
            stored = [str(m.client_msg_uuid) for m in await repository.load_transcript("s")]
            assert stored[1:] == keys_of(later)

    asyncio.run(main())


def _held_after_commit(writer: Any, go: threading.Event, *, on_loop: bool) -> threading.Event:
    """Hold the first replay that reaches the primary's commit (the background round's)
    until ``go``: its rows are stored but still leased, not yet taken out of the outbox.
    Returns the event set once it is held."""
    held = threading.Event()

    def hook(step: str) -> None:
        if step != "drain_after_primary_commit" or held.is_set():
            return
        held.set()
        held_until(go, CHILD_TIMEOUT, on_loop=on_loop)

    writer.fault_hook = hook
    return held


def _parked_while_down(database_url: str, outbox_url: str, batch: list[Any]) -> None:
    with open_repository(database_url) as repository:
        flaky = FlakyRepository(repository)
        flaky.down = True
        with TranscriptWriter(flaky, outbox_url=outbox_url) as parker:
            assert parker.write("s", batch).status == "parked"


def test_a_drain_waits_for_the_background_rounds_replay(database_url: str, tmp_path: Path) -> None:
    outbox_url = f"sqlite:///{tmp_path / 'outbox.db'}"
    batch = [make_message("s", index) for index in range(3)]
    _parked_while_down(database_url, outbox_url, batch)
    with (
        open_repository(database_url) as repository,
        TranscriptWriter(repository, outbox_url=outbox_url) as writer,
    ):
        go = threading.Event()
        held = _held_after_commit(writer, go, on_loop=False)
        writer.start(interval=60.0)  # startup recovery: the round replays at once
        assert held.wait(CHILD_TIMEOUT), "the background round never replayed"
        reports: list[Any] = []
        asked = threading.Thread(target=lambda: reports.append(writer.drain()))
        asked.start()
        asked.join(0.3)  # (it has claimed, or is waiting to, by now on any machine)
        go.set()
        asked.join(CHILD_TIMEOUT)
        assert not asked.is_alive()
        (report,) = reports
        # Stored by the round, so nothing for this drain to replay, and nothing left.
        assert (report.replayed, report.remaining) == (0, 0)
        assert writer.pending() == 0
        assert _stored(repository, "s") == keys_of(batch)


def test_an_async_drain_waits_for_the_background_rounds_replay(
    database_url: str, tmp_path: Path
) -> None:
    outbox_url = f"sqlite:///{tmp_path / 'outbox.db'}"
    batch = [make_message("s", index) for index in range(3)]
    _parked_while_down(database_url, outbox_url, batch)

    async def main() -> None:
        async with (
            await open_async_repository(database_url) as repository,
            AsyncTranscriptWriter(repository, outbox_url=outbox_url) as writer,
        ):
            go = threading.Event()
            held = _held_after_commit(writer, go, on_loop=True)
            writer.start(interval=60.0)
            give_up = time.monotonic() + CHILD_TIMEOUT
            while not held.is_set():
                assert time.monotonic() < give_up, "the background round never replayed"
                await asyncio.sleep(0.01)
            asked = asyncio.ensure_future(writer.drain())
            await asyncio.sleep(0.3)
            go.set()
            report = await asyncio.wait_for(asked, CHILD_TIMEOUT)
            assert (report.replayed, report.remaining) == (0, 0)
            assert await writer.pending() == 0
            stored = [str(m.client_msg_uuid) for m in await repository.load_transcript("s")]
            assert stored == keys_of(batch)

    asyncio.run(main())


# -- a full outbox disk ---------------------------------------------------------------


def _disk_full(writer: TranscriptWriter) -> Callable[[], None]:
    """Cap every connection of the writer's SQLite outbox at the pages the file has now:
    a write that needs a new page gets SQLITE_FULL, as on a full disk. Returns the
    repair."""
    engine = writer.outbox.database.engine

    def cap(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        pages = cursor.execute("PRAGMA page_count").fetchone()[0]
        cursor.execute(f"PRAGMA max_page_count = {pages}")
        cursor.close()

    event.listen(engine, "connect", cap)
    engine.dispose()

    def repair() -> None:
        event.remove(engine, "connect", cap)
        engine.dispose()

    return repair


@pytest.fixture
def full_outbox(database_url: str, tmp_path: Path) -> Iterator[tuple[Any, TranscriptWriter]]:
    with open_repository(database_url) as repository:
        primary = FlakyRepository(repository)
        writer = TranscriptWriter(primary, outbox_url=f"sqlite:///{tmp_path / 'outbox.db'}")
        try:
            yield primary, writer
        finally:
            writer.close()


def _big(session_id: str, index: int) -> dict[str, Any]:
    """A message that needs pages of its own (overflow pages), whatever room is left."""
    message = make_message(session_id, index)
    message["content"] = "x" * 50_000
    return message


def _full_of_parked(primary: Any, writer: TranscriptWriter) -> dict[str, list[str]]:
    """Park rows for two sessions, the primary down, then fill the outbox's disk; prove
    it is full: a claim and a park are refused with SQLITE_FULL."""
    primary.down = True
    parked: dict[str, list[str]] = {}
    for session_id in ("s", "t"):
        for start in range(0, 150, 50):
            batch = [make_message(session_id, start + index) for index in range(50)]
            assert writer.write(session_id, batch).status == "parked"
            parked.setdefault(session_id, []).extend(keys_of(batch))
    _disk_full(writer)
    with pytest.raises(BackendUnavailable) as claim:
        writer.outbox.claim("someone", limit=500, lease=5.0, session_id="t")
    assert claim.value.code == "SQLITE_FULL"
    with pytest.raises(BackendUnavailable) as park:
        writer.write("u", [_big("u", 0)])
    assert isinstance(park.value.__cause__, BackendUnavailable)
    assert park.value.__cause__.code == "SQLITE_FULL"
    primary.down = False
    until_primary_back(writer)
    return parked


def test_a_full_outbox_still_drains(full_outbox: tuple[Any, TranscriptWriter]) -> None:
    primary, writer = full_outbox
    parked = _full_of_parked(primary, writer)

    report = writer.drain()

    assert (report.replayed, report.failed, report.remaining) == (300, 0, 0)
    for session_id, keys in parked.items():
        assert _stored(primary, session_id) == keys
    # The space the replayed rows held is the outbox's again: it parks what it refused.
    primary.down = True
    assert writer.write("u", [_big("u", 0)]).status == "parked"


def test_a_full_outbox_still_takes_writes_behind_parked_messages(
    full_outbox: tuple[Any, TranscriptWriter],
) -> None:
    primary, writer = full_outbox
    parked = _full_of_parked(primary, writer)
    later = [_big("s", 1000)]  # more than the outbox could park

    result = writer.write("s", later)

    assert result.status == "stored"
    assert _stored(primary, "s") == parked["s"] + keys_of(later)
    assert writer.pending("s") == 0
    assert writer.pending("t") == 50 * 3  # another session's rows wait for the drain
    assert writer.drain().replayed == 150
    assert _stored(primary, "t") == parked["t"]
