"""The unit of work, ``session_transaction``: on both backends, sync and async.

What it promises (``sessionrepo.contract.SessionStore.session_transaction``): one
transaction under the session's lock, the session created when missing (or ``NotFound``
with ``create=False``), ``append`` / ``retract`` / ``supersede`` / an extension's own
statements in it, all committed at the block's end or all rolled back by an exception,
and an object that cannot be used outside its block.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import EventLoopThread
from sqlalchemy import func, select, update

from sessionrepo import (
    AsyncSessionTransaction,
    ConflictError,
    InvalidArgument,
    InvalidMessage,
    Message,
    NotFound,
    RepoError,
    SessionRepository,
    SessionTransaction,
    open_async_repository,
    open_repository,
)
from sessionrepo.models.tables import messages_table, sessions_table

M = messages_table.c
S = sessions_table.c


class Boom(Exception):
    """The caller's own failure, inside the block."""


@pytest.fixture
def store(database_url: str) -> Iterator[SessionRepository]:
    repository = open_repository(database_url)
    yield repository
    repository.close()


def _user(text: str) -> Message:
    return Message(role="user", content=text)


def test_a_block_commits_what_it_did_at_its_end(store: SessionRepository) -> None:
    first, second = _user("one"), _user("two")
    with store.session_transaction("s", source="cli") as tx:
        assert isinstance(tx, SessionTransaction)
        assert tx.created
        assert tx.next_seq == 1
        result = tx.append([first, second])
        assert result.inserted == [first.client_msg_uuid, second.client_msg_uuid]
        assert result.first_seq == 1
        assert tx.next_seq == 3
        assert tx.session().message_count == 2
        again = tx.append([first])
        assert again.duplicates == [first.client_msg_uuid]
        assert tx.next_seq == 3
    session = store.get_session("s")
    assert (session.source, session.message_count) == ("cli", 2)
    assert [m.content for m in store.load_transcript("s")] == ["one", "two"]
    with store.session_transaction("s") as tx:
        assert not tx.created
        assert tx.next_seq == 3


def test_an_exception_rolls_everything_back_and_is_raised_as_it_was(
    store: SessionRepository,
) -> None:
    store.append("s", [_user("kept")])

    def failing_unit() -> None:
        with store.session_transaction("s") as tx:
            tx.append([_user("undone")])
            tx.execute(update(sessions_table).where(S.id == "s").values(title="undone"))
            raise Boom

    with pytest.raises(Boom):
        failing_unit()
    session = store.get_session("s")
    assert (session.message_count, session.title) == (1, None)
    assert [m.content for m in store.load_transcript("s")] == ["kept"]

    # A session the block created is gone with it.
    def failing_creation() -> None:
        with store.session_transaction("new") as tx:
            assert tx.created
            raise Boom

    with pytest.raises(Boom):
        failing_creation()
    with pytest.raises(NotFound):
        store.get_session("new")


def test_without_create_a_missing_session_is_not_found_and_nothing_written(
    store: SessionRepository,
) -> None:
    with pytest.raises(NotFound), store.session_transaction("absent", create=False):
        pytest.fail("the block must not run")
    with pytest.raises(NotFound):
        store.get_session("absent")
    with pytest.raises(InvalidArgument):
        store.session_transaction("absent", create=False, source="cli")
    store.append("present", [_user("hi")])
    with store.session_transaction("present", create=False) as tx:
        assert not tx.created


def test_arguments_are_checked_before_anything_is_opened(store: SessionRepository) -> None:
    with pytest.raises(InvalidMessage):
        store.session_transaction("s", message_count=3)
    with pytest.raises(InvalidMessage):
        store.session_transaction("")
    with pytest.raises(InvalidArgument):
        store.session_transaction("s", timeout=-1)


def test_it_cannot_outlive_its_block(store: SessionRepository) -> None:
    transaction = store.session_transaction("s")
    with pytest.raises(RepoError):
        transaction.append([_user("before")])
    with transaction as tx:
        connection = tx.connection
    with pytest.raises(RepoError):
        tx.append([_user("after")])
    with pytest.raises(RepoError):
        _ = tx.next_seq
    with pytest.raises(RepoError):
        tx.execute(select(func.count()).select_from(messages_table))
    with pytest.raises(RepoError):
        _ = tx.connection
    assert connection.closed
    with pytest.raises(RepoError), transaction:  # used once
        pass
    assert store.get_session("s").message_count == 0


def test_a_strict_append_refuses_the_batch_and_the_block_goes_on(
    store: SessionRepository,
) -> None:
    stored = _user("stored")
    store.append("s", [stored])
    changed = stored.model_copy(update={"content": "changed"})
    fresh = _user("fresh")
    with store.session_transaction("s") as tx:
        with pytest.raises(ConflictError) as refused:
            tx.append([fresh, changed], on_conflict="raise")
        assert refused.value.conflicts == [stored.client_msg_uuid]
        assert tx.next_seq == 2
        assert tx.append([fresh]).first_seq == 2
    assert [m.content for m in store.load_transcript("s")] == ["stored", "fresh"]
    with store.session_transaction("s") as tx:
        reported = tx.append([changed])
    assert reported.conflicts == [stored.client_msg_uuid]


def test_invalid_messages_are_refused_before_anything_is_written(
    store: SessionRepository,
) -> None:
    with store.session_transaction("s") as tx:
        tx.append([_user("ok")])
        with pytest.raises(InvalidMessage):
            tx.append([{"role": "user", "content": "bad \ud800"}])
    assert [m.content for m in store.load_transcript("s")] == ["ok"]


def test_supersede_and_retract_edit_in_the_same_transaction(store: SessionRepository) -> None:
    messages = [_user("a"), _user("b"), _user("c")]
    store.append("s", messages)
    keys = [m.client_msg_uuid for m in messages]
    with store.session_transaction("s") as tx:
        # An unknown key is skipped by supersede, refused by retract.
        assert tx.supersede([keys[1], str(_user("x").client_msg_uuid)]) == [keys[1]]
        assert tx.supersede([keys[1]]) == []  # not live any more
        with pytest.raises(NotFound):
            tx.retract([_user("y").client_msg_uuid])
        edited = tx.retract([str(keys[2])])
        assert edited.superseded == [keys[2]]
        assert edited.message_count == 1
        assert tx.supersede([keys[0]], "compacted") == [keys[0]]
        with pytest.raises(InvalidArgument):
            tx.supersede([keys[0]], "deleted")  # type: ignore[arg-type]
    stored = store.load_transcript("s", include_retracted=True)
    assert [m.superseded for m in stored] == ["compacted", "retracted", "retracted"]
    assert store.get_session("s").message_count == 0


def test_an_extensions_statement_runs_in_the_transaction(store: SessionRepository) -> None:
    with store.session_transaction("s") as tx:
        tx.append([_user("hi")])
        tx.execute(update(sessions_table).where(S.id == "s").values(title="mine"))
        counted = tx.execute(
            select(func.count()).select_from(messages_table).where(M.session_id == "s")
        ).scalar_one()
        assert counted == 1
        assert tx.connection.execute(select(S.title).where(S.id == "s")).scalar() == "mine"
    assert store.get_session("s").title == "mine"

    # A statement the database refuses leaves the block as the RepoError it means
    # (translated, chained), and nothing of the block stays.
    def refused_unit() -> None:
        with store.session_transaction("s") as tx:
            tx.append([_user("undone")])
            tx.execute(update(sessions_table).where(S.id == "s").values(message_count=None))

    with pytest.raises(RepoError) as refused:
        refused_unit()
    assert refused.value.__cause__ is not None
    assert store.get_session("s").message_count == 1


def test_the_async_unit_of_work(database_url: str, event_loop_thread: EventLoopThread) -> None:
    async def scenario() -> None:
        repository = await open_async_repository(database_url)
        try:
            first, second = _user("one"), _user("two")
            async with repository.session_transaction("s", source="cli") as tx:
                assert isinstance(tx, AsyncSessionTransaction)
                assert tx.created
                assert (await tx.append([first, second])).first_seq == 1
                assert tx.next_seq == 3
                assert await tx.supersede([second.client_msg_uuid]) == [second.client_msg_uuid]
                title = await tx.execute(select(S.source).where(S.id == "s"))
                assert title.scalar() == "cli"
                assert (await tx.session()).message_count == 1

                def synchronously(sync: SessionTransaction) -> Any:
                    return sync.connection.execute(select(S.next_seq).where(S.id == "s")).scalar()

                assert await tx.run_sync(synchronously) == 3
            assert (await repository.get_session("s")).message_count == 1

            async def failing_unit() -> None:
                async with repository.session_transaction("s") as failing:
                    await failing.append([_user("undone")])
                    raise Boom

            with pytest.raises(Boom):
                await failing_unit()
            assert len(await repository.load_transcript("s", include_retracted=True)) == 2
            with pytest.raises(NotFound):
                async with repository.session_transaction("absent", create=False):
                    pytest.fail("the block must not run")
            with pytest.raises(RepoError):
                await tx.append([_user("after")])
        finally:
            await repository.close()

    event_loop_thread.run(scenario())


def test_an_async_caller_cancelled_mid_block_leaves_nothing_and_no_lock(
    database_url: str, event_loop_thread: EventLoopThread
) -> None:
    async def scenario() -> None:
        repository = await open_async_repository(database_url)
        try:
            inside = asyncio.Event()

            async def unit() -> None:
                async with repository.session_transaction("s") as tx:
                    await tx.append([_user("undone")])
                    inside.set()
                    await asyncio.Event().wait()  # until cancelled

            task = asyncio.get_running_loop().create_task(unit())
            await inside.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # Rolled back, and the lock released: the next append goes through.
            assert (await repository.append("s", [_user("next")])).first_seq == 1
            assert [m.content for m in await repository.load_transcript("s")] == ["next"]
        finally:
            await repository.close()

    event_loop_thread.run(scenario())
