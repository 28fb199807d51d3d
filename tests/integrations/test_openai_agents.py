"""``SessionRepoSession`` against the OpenAI Agents SDK's own session tests.

Each test that follows an upstream test names it (``tests/memory/test_session.py``,
``tests/memory/test_session_limit.py`` and ``tests/extensions/memory/
test_sqlalchemy_session.py`` in openai/openai-agents-python): the same behaviour, asserted on
this adapter, on SQLite and PostgreSQL. Where sessionrepo deliberately does better than the
SDK's reference backends (a retried ``add_items`` stores nothing twice), the test says so.
The Runner runs offline on a scripted model (``_openai_fake_model``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from _openai_fake_model import ScriptedModel, function_call, text_message
from agents import (
    Agent,
    RunConfig,
    Runner,
    SQLiteSession,
    function_tool,
    set_tracing_disabled,
)
from agents.memory import OpenAIResponsesCompactionSession, Session, SessionSettings
from agents.memory.session import _session_accepts_wrapper

from sessionrepo import (
    BackendUnavailable,
    InvalidArgument,
    InvalidMessage,
    open_async_repository,
    open_repository,
)
from sessionrepo.errors import ArgumentTypeError, RepoError
from sessionrepo.integrations.openai_agents import SessionRepoSession, item_key

from support.harness import holding_the_write_lock
from support.responses_items import RESPONSES_ITEMS

T = TypeVar("T")

Items = list[Any]


@pytest.fixture(autouse=True)
def _outbox_only_where_the_test_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SESSIONREPO_OUTBOX_URL", raising=False)


@pytest.fixture(autouse=True, scope="module")
def _offline() -> Iterator[None]:
    """No trace export (it would try the network): these runs are offline."""
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)


def run(coroutine: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await coroutine()

    return asyncio.run(main())


async def on_repository(
    session: SessionRepoSession, method: str, /, *args: Any, **kwargs: Any
) -> Any:
    """``method`` of the session's repository (sync for ``url=``, async when passed in)."""
    result = getattr(await session.repository(), method)(*args, **kwargs)
    return await result if inspect.isawaitable(result) else result


def contents(items: Items) -> list[Any]:
    return [item.get("content") for item in items]


# -- the Session methods (tests/memory/test_session.py, test_sqlalchemy_session.py) -------


def test_add_get_clear(database_url: str) -> None:
    """Follows ``test_sqlite_session_memory_direct`` and ``test_sqlalchemy_session_direct_ops``:
    items come back as added, in order; ``clear_session`` empties the session."""

    async def main() -> None:
        async with SessionRepoSession("direct", url=database_url) as session:
            assert isinstance(session, Session)
            # All four methods take the run context: the SDK passes it (and only then).
            assert _session_accepts_wrapper(session)
            items: Items = [
                {"role": "user", "content": "Hello"},
                {"role": "assistant", "content": "Hi there!"},
            ]
            await session.add_items(items)
            assert await session.get_items() == items
            await session.clear_session()
            assert await session.get_items() == []
            stored = await on_repository(session, "get_session", "direct")
            assert stored.source == "openai-agents"

    run(main)


def test_empty_session_and_empty_batch(database_url: str) -> None:
    """Follows ``test_pop_from_empty_session`` and ``test_add_empty_items_list``
    (test_sqlalchemy_session.py): a session never written to has no items and nothing to
    pop or clear; adding no items is a no-op."""

    async def main() -> None:
        async with SessionRepoSession("empty", url=database_url) as session:
            assert await session.get_items() == []
            assert await session.pop_item() is None
            await session.clear_session()
            await session.add_items([])
            assert await session.get_items() == []

    run(main)


def test_pop_item(database_url: str) -> None:
    """Follows ``test_sqlite_session_memory_pop_item``: each pop returns the newest item and
    takes exactly that one; an empty session pops ``None``. Unlike the SDK's backends,
    nothing is deleted: the popped items stay stored as history."""

    async def main() -> None:
        async with SessionRepoSession("pop", url=database_url) as session:
            assert await session.pop_item() is None
            items: Items = [
                {"role": "user", "content": "Hello"},
                {"role": "assistant", "content": "Hi there!"},
                {"role": "user", "content": "How are you?"},
            ]
            await session.add_items(items)
            assert await session.pop_item() == items[2]
            assert await session.get_items() == items[:2]
            assert await session.pop_item() == items[1]
            assert await session.pop_item() == items[0]
            assert await session.pop_item() is None
            assert await session.get_items() == []
            kept = await on_repository(session, "load_transcript", "pop", include_retracted=True)
            assert [m.superseded for m in kept] == ["retracted"] * 3

    run(main)


def test_concurrent_pops_take_different_items(database_url: str) -> None:
    """Follows the SQLAlchemy ``test_concurrent_pop_item_returns_each_row_once`` and
    ``test_sqlite_fallback_reserves_writer_before_tail_claim``: two objects pop one session
    at once; each takes another item, and with one item left only one gets it. Here the
    race is forced: the first pop reads the newest item, then waits until the second pop
    has taken it out."""

    async def main() -> None:
        writer = SessionRepoSession("pops", url=database_url)
        other = SessionRepoSession("pops", url=database_url)
        read = asyncio.Event()
        taken = asyncio.Event()
        live = writer._live
        paused = False

        async def read_then_wait(limit: int | None) -> Any:
            nonlocal paused
            newest = await live(limit)
            if not paused:
                paused = True
                read.set()
                await taken.wait()
            return newest

        writer._live = read_then_wait  # type: ignore[method-assign]

        async def other_pops() -> Any:
            await read.wait()
            item = await other.pop_item()
            taken.set()
            return item

        await writer.add_items(
            [{"role": "user", "content": "first"}, {"role": "user", "content": "second"}]
        )
        mine, theirs = await asyncio.gather(writer.pop_item(), other_pops())
        assert (mine["content"], theirs["content"]) == ("first", "second")
        assert await other.get_items() == []

        await writer.add_items([{"role": "user", "content": "only"}])
        paused, read, taken = False, asyncio.Event(), asyncio.Event()
        mine, theirs = await asyncio.gather(writer.pop_item(), other_pops())
        assert (mine, theirs["content"]) == (None, "only")
        writer.close()
        other.close()

    run(main)


def test_pop_takes_one_item_not_a_tool_round(database_url: str) -> None:
    """The SDK's rewind pops and compares item by item: a pop after a tool output takes the
    output alone (sessionrepo's ``pop_last`` would take the call with it)."""

    async def main() -> None:
        async with SessionRepoSession("pop-tool", url=database_url) as session:
            items: Items = [
                {"role": "user", "content": "weather?"},
                {
                    "type": "function_call",
                    "id": "fc_1",
                    "call_id": "c1",
                    "name": "w",
                    "arguments": "{}",
                },
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            ]
            await session.add_items(items)
            assert await session.pop_item() == items[2]
            assert await session.get_items() == items[:2]

    run(main)


def test_pop_and_clear_touch_one_session(database_url: str) -> None:
    """Follows ``test_session_memory_pop_different_sessions`` (and the SQLAlchemy
    ``test_session_isolation``): pop and clear change only their own session."""

    async def main() -> None:
        async with await open_async_repository(database_url) as repository:
            one = SessionRepoSession("session_1", repository=repository)
            two = SessionRepoSession("session_2", repository=repository)
            await one.add_items([{"role": "user", "content": "Session 1 message"}])
            await two.add_items(
                [
                    {"role": "user", "content": "Session 2 message 1"},
                    {"role": "user", "content": "Session 2 message 2"},
                ]
            )
            popped = await two.pop_item()
            assert popped is not None
            assert popped["content"] == "Session 2 message 2"
            assert contents(await one.get_items()) == ["Session 1 message"]
            assert contents(await two.get_items()) == ["Session 2 message 1"]
            await two.clear_session()
            assert contents(await one.get_items()) == ["Session 1 message"]
            one.close()
            await two.aclose()
            # A repository passed in stays the caller's: still open.
            assert len(await repository.load_transcript("session_1")) == 1

    run(main)


def test_get_items_with_limit(database_url: str) -> None:
    """Follows ``test_sqlite_session_get_items_with_limit`` and
    ``test_session_limit_negative_returns_empty``: the latest N items, oldest first; all
    when N is larger; none for 0 or a negative N."""

    async def main() -> None:
        async with SessionRepoSession("limit", url=database_url) as session:
            items: Items = [
                {"role": "user" if i % 2 == 0 else "assistant", "content": f"Item {i}"}
                for i in range(6)
            ]
            await session.add_items(items)
            assert await session.get_items() == items
            assert await session.get_items(limit=2) == items[4:]
            assert await session.get_items(limit=4) == items[2:]
            assert await session.get_items(limit=10) == items
            assert await session.get_items(limit=0) == []
            assert await session.get_items(limit=-1) == []

    run(main)


def test_session_settings(database_url: str) -> None:
    """Follows ``test_session_settings_default``, ``test_session_settings_constructor``,
    ``test_get_items_uses_session_settings_limit`` and
    ``test_get_items_explicit_limit_overrides_session_settings``."""
    assert SessionRepoSession("s").session_settings == SessionSettings()
    assert SessionRepoSession("s", session_settings={"limit": 5}).session_settings == (
        SessionSettings(limit=5)
    )

    async def main() -> None:
        async with SessionRepoSession(
            "settings", url=database_url, session_settings=SessionSettings(limit=3)
        ) as session:
            await session.add_items(
                [{"role": "user", "content": f"Message {i}"} for i in range(10)]
            )
            assert contents(await session.get_items()) == [f"Message {i}" for i in (7, 8, 9)]
            assert contents(await session.get_items(limit=2)) == ["Message 8", "Message 9"]

    run(main)


def test_text_is_stored_exactly(database_url: str) -> None:
    """Follows ``test_sqlite_session_unicode_content`` and
    ``test_sqlite_session_special_characters_and_sql_injection``."""

    async def main() -> None:
        async with SessionRepoSession("text", url=database_url) as session:
            texts = [
                "こんにちは",
                "😊👍",
                "Привет",
                "O'Reilly",
                "DROP TABLE sessions;",
                '"SELECT * FROM users WHERE name = "admin";"',
                "Robert'); DROP TABLE students;--",
                "nul \x00 and \u2028 too",
            ]
            await session.add_items([{"role": "user", "content": text} for text in texts])
            assert contents(await session.get_items()) == texts

    run(main)


def test_every_responses_item_round_trips(database_url: str) -> None:
    """Items are stored losslessly: one of every Responses-API input item type comes back
    equal, keys in the same order (the SDK's backends keep ``json.dumps`` of the item)."""

    async def main() -> None:
        async with SessionRepoSession("items", url=database_url) as session:
            items = [item for _, item in RESPONSES_ITEMS]
            await session.add_items(items)
            back = await session.get_items()
            assert back == items
            assert [list(item) for item in back] == [list(item) for item in items]

    run(main)


def test_concurrent_adds(database_url: str) -> None:
    """Follows ``test_sqlite_session_concurrent_access`` (and the SQLAlchemy
    ``test_add_items_concurrent_first_access_with_create_tables``): concurrent first
    writes to one session lose nothing."""

    async def main() -> None:
        async with SessionRepoSession("concurrent", url=database_url) as session:
            await asyncio.gather(
                *(
                    session.add_items([{"role": "user", "content": f"Message {i}"}])
                    for i in range(10)
                )
            )
            assert sorted(contents(await session.get_items())) == sorted(
                f"Message {i}" for i in range(10)
            )

    run(main)


def test_a_retried_batch_is_stored_once(database_url: str, tmp_path: Path) -> None:
    """Deliberately unlike the SDK: its ``SQLiteSession`` (and ``SQLAlchemySession``) store a
    re-sent batch again; here an item with an ``id`` has a key derived from it, so a retried
    ``add_items`` is a no-op. Items without an ``id`` still append on every call, as the SDK
    says separate ``add_items`` calls do."""
    batch: Items = [
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "hi", "annotations": []}],
        },
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "w", "arguments": "{}"},
    ]
    unkeyed: Items = [{"role": "user", "content": "again"}]

    async def reference() -> int:
        sdk = SQLiteSession("retry", tmp_path / "sdk.db")
        await sdk.add_items(batch)
        await sdk.add_items(batch)
        count = len(await sdk.get_items())
        sdk.close()
        return count

    assert run(reference) == 4, "the SDK's own backend stores a retried batch twice"

    async def main() -> None:
        async with SessionRepoSession("retry", url=database_url) as session:
            await session.add_items(batch)
            await session.add_items(batch)
            assert await session.get_items() == batch
            await session.add_items(unkeyed)
            await session.add_items(unkeyed)
            assert await session.get_items() == batch + unkeyed + unkeyed
            stored = await on_repository(session, "load_transcript", "retry")
            assert stored[0].client_msg_uuid == item_key("retry", "msg_1")
            # The caller's dicts were not stamped with a key.
            assert all("client_msg_uuid" not in item for item in batch + unkeyed)

    run(main)


def test_an_item_added_back_after_pop_or_clear_returns(database_url: str) -> None:
    """The SDK adds popped items back when a rewind finds the tail is not what it expected,
    and a compaction clears the session and adds items that keep their ids: those come back
    (a new generation of the derived key), in the batch's order, and a retry of that batch
    is still a no-op. Also when another object (another process, after a restart) took
    them out: then what the add inserted first is moved behind them."""
    items: Items = [
        {"role": "user", "content": "q"},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "w", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]

    async def main() -> None:
        async with await open_async_repository(database_url) as repository:
            session = SessionRepoSession("back", repository=repository)
            await session.add_items(items)
            popped = [await session.pop_item(), await session.pop_item()]
            await session.add_items(list(reversed(popped)))
            assert await session.get_items() == items
            await session.clear_session()
            await session.add_items(items)
            await session.add_items(items[1:2])  # a retry of what came back
            assert await session.get_items() == items
            stored = await repository.load_transcript("back")
            assert stored[1].client_msg_uuid == item_key("back", "fc_1", 2)
            # Only what the edits took out is history: nothing was written twice.
            assert len(await repository.load_transcript("back", include_retracted=True)) == 8

            await session.clear_session()
            restarted = SessionRepoSession("back", repository=repository)
            await restarted.add_items(items)
            assert await restarted.get_items() == items
            await restarted.add_items(items[1:2])
            assert await restarted.get_items() == items
            assert (await repository.load_transcript("back"))[1].client_msg_uuid == item_key(
                "back", "fc_1", 3
            )

    run(main)


def test_bad_input_is_refused_before_anything_is_written(database_url: str) -> None:
    async def main() -> None:
        async with SessionRepoSession("bad", url=database_url) as session:
            await session.add_items([{"role": "user", "content": "kept"}])
            with pytest.raises(InvalidMessage):
                await session.add_items(
                    [{"role": "user", "content": "fine"}, {"role": "user", "content": "\ud800"}]
                )
            with pytest.raises(InvalidMessage):
                await session.add_items(["not an item"])  # type: ignore[list-item]
            assert contents(await session.get_items()) == ["kept"]

    run(main)


def test_constructor_arguments(database_url: str) -> None:
    with pytest.raises(InvalidArgument):
        SessionRepoSession("")
    with pytest.raises(ArgumentTypeError):
        SessionRepoSession(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="not both"):
        SessionRepoSession("s", url=database_url, repository=object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="use_outbox"):
        SessionRepoSession("s", url=database_url, outbox_url="sqlite:///x.db")
    with pytest.raises(InvalidArgument, match="deadlne"):
        SessionRepoSession("s", use_outbox=True, writer_options={"deadlne": 1.0})
    with pytest.raises(ArgumentTypeError, match="SessionRepository"):
        SessionRepoSession("s", repository=object())  # type: ignore[arg-type]
    SessionRepoSession("s", use_outbox=True, writer_options={"workers": 2})

    async def over_an_async_repository() -> None:
        async with await open_async_repository(database_url) as repository:
            # The async writer has no thread pool: its calls are tasks.
            with pytest.raises(
                InvalidArgument, match="workers: not an option of AsyncTranscriptWriter"
            ):
                SessionRepoSession(
                    "s", repository=repository, use_outbox=True, writer_options={"workers": 2}
                )

    run(over_an_async_repository)


def test_the_default_store_is_the_embedded_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without ``url=`` it opens what ``open_repository()`` opens: here the file named by
    ``SESSIONREPO_DATABASE_URL`` (the embedded SQLite default when that is unset)."""
    monkeypatch.setenv("SESSIONREPO_DATABASE_URL", f"sqlite:///{tmp_path / 'default.db'}")

    async def main() -> None:
        async with SessionRepoSession("default") as session:
            await session.add_items([{"role": "user", "content": "hi"}])
            assert (await session.repository()).backend == "sqlite"

    run(main)
    check = open_repository(f"sqlite:///{tmp_path / 'default.db'}")
    try:
        assert [m.content for m in check.load_transcript("default")] == ["hi"]
    finally:
        check.close()


class _CompactingClient:
    """What ``OpenAIResponsesCompactionSession`` calls: ``client.responses.compact``,
    answering with a scripted compacted history (and recording what it was sent)."""

    def __init__(self, output: Items) -> None:
        self.responses = self
        self.output = output
        self.sent: list[dict[str, Any]] = []

    async def compact(self, **request: Any) -> Any:
        self.sent.append(request)
        return SimpleNamespace(output=self.output, usage=None)


def test_compaction_replaces_the_live_history_and_keeps_the_old_one(database_url: str) -> None:
    """Wrapped in the SDK's ``OpenAIResponsesCompactionSession`` (which clears the session
    and adds the compacted items): the live history is the compacted one, items the
    compaction kept with their ids (a reasoning item and its message) come back, and,
    unlike the SDK's backends (openai-agents-python issue 5010), the history before the
    compaction is not lost: it stays stored, marked ``retracted``."""
    history: Items = [
        {"role": "user", "content": "q1"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "a1", "annotations": []}],
        },
    ]
    compacted: Items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q1"}]},
        {"type": "compaction", "id": "cmp_1", "encrypted_content": "opaque"},
        history[1],
        history[2],
    ]

    async def main() -> None:
        async with SessionRepoSession("compacted", url=database_url) as session:
            await session.add_items(history)
            client = _CompactingClient(compacted)
            wrapped = OpenAIResponsesCompactionSession(
                "compacted",
                session,
                client=client,
                compaction_mode="input",  # type: ignore[arg-type]
            )
            await wrapped.run_compaction({"force": True})
            assert client.sent[0]["input"][0] == history[0]
            assert await session.get_items() == compacted
            kept = await on_repository(
                session, "load_transcript", "compacted", include_retracted=True
            )
            assert [m.to_item() for m in kept if m.superseded] == history
            assert [m.to_item() for m in kept if not m.superseded] == compacted

    run(main)


# -- the Runner (test_session.py, test_session_limit.py), restarts and outages -----------


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def _agent(model: ScriptedModel) -> Agent[Any]:
    return Agent(name="assistant", model=model, tools=[weather])


#: ``Runner.run_sync`` calls ``loop.shutdown_asyncgens()`` after every run and keeps the
#: loop for the next one; asyncio then warns about each async generator started on it
#: (psycopg's ``AsyncConnection.transaction`` is one). The SDK's choice, harmless here:
#: the generators are run to their end.
_RUN_SYNC_WARNING = "ignore:asynchronous generator.*shutdown_asyncgens:ResourceWarning"


@pytest.mark.parametrize(
    "runner_method",
    [
        "run",
        pytest.param("run_sync", marks=pytest.mark.filterwarnings(_RUN_SYNC_WARNING)),
        "run_streamed",
    ],
)
def test_runner_turns_resume_after_a_restart(database_url: str, runner_method: str) -> None:
    """Follows ``test_session_memory_basic_functionality_parametrized`` and
    ``test_session_memory_different_sessions_parametrized`` (and the SQLAlchemy
    ``test_runner_integration``): each turn's model input holds the history; sessions do
    not share it. Then a restart (a new session object on a new repository) resumes it."""
    model = ScriptedModel()
    model.then(function_call("weather", '{"city": "Kyoto"}', "call_1", "fc_1"))
    model.then(text_message("Sunny in Kyoto.", "msg_1"))
    model.then(text_message("I like cats too.", "msg_2"))
    model.then(text_message("You asked about Kyoto.", "msg_3"))
    agent = _agent(model)
    # One loop for everything, as the sessions' repositories want; run_sync reuses the
    # thread's default loop, so it is that one.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    go = loop.run_until_complete
    try:
        first = SessionRepoSession("user-1", url=database_url)
        other = SessionRepoSession("user-2", url=database_url)
        for text, session in (("Weather in Kyoto?", first), ("I like cats", other)):
            if runner_method == "run":
                go(Runner.run(agent, text, session=session))
            elif runner_method == "run_sync":
                Runner.run_sync(agent, text, session=session)
            else:
                go(_streamed(agent, text, session))

        history = go(first.get_items())
        assert [item.get("type") for item in history] == [
            None,
            "function_call",
            "function_call_output",
            "message",
        ]
        assert history[0] == {"content": "Weather in Kyoto?", "role": "user"}
        assert history[2]["output"] == "sunny in Kyoto"
        assert model.inputs[1] == history[:3]  # the tool round went back to the model
        assert contents(go(other.get_items())) == [
            "I like cats",
            [{"annotations": [], "text": "I like cats too.", "type": "output_text"}],
        ]
        first.close()
        other.close()

        restarted = SessionRepoSession("user-1", url=database_url)
        result = go(Runner.run(agent, "What did I ask?", session=restarted))
        assert result.final_output == "You asked about Kyoto."
        assert model.inputs[-1] == [*history, {"content": "What did I ask?", "role": "user"}]
        assert len(go(restarted.get_items())) == 6
        restarted.close()
    finally:
        asyncio.set_event_loop(None)
        loop.close()


async def _streamed(agent: Agent[Any], text: str, session: SessionRepoSession) -> Any:
    result = Runner.run_streamed(agent, text, session=session)
    async for _event in result.stream_events():
        pass
    return result


def test_one_session_object_serves_every_event_loop(database_url: str) -> None:
    """A sync web server's worker pool runs each turn with ``asyncio.run`` in whichever
    thread is free, on one cached session object (as the SDK's own sessions allow): every
    turn sees the history, and the object keeps one repository (one engine) for all the
    loops, which ``close()`` (sync, as ``SQLiteSession.close()``) releases."""
    model = ScriptedModel([[text_message(f"Reply {turn}", f"msg_{turn}")] for turn in range(4)])
    agent = _agent(model)
    session = SessionRepoSession("pool", url=database_url)
    repositories: set[int] = set()

    def turn(number: int) -> list[Any]:
        async def serve() -> list[Any]:
            await Runner.run(agent, f"Turn {number}", session=session)
            repositories.add(id(await session.repository()))
            return await session.get_items()

        return asyncio.run(serve())

    # One worker per turn, each turn after the last: a thread and a loop of its own each.
    for number in range(4):
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as worker:
            items = worker.submit(turn, number).result()
        assert len(items) == 2 * (number + 1)
        assert model.inputs[-1] == items[:-1]
    assert len(repositories) == 1
    assert session.close() is None
    session.close()  # again: nothing to do
    with pytest.raises(RepoError, match="closed"):
        run(session.get_items)


def test_concurrent_turns_from_several_loops(database_url: str) -> None:
    """Several threads, each on a loop of its own, writing through one object at once:
    every item is stored once, each thread's in its own order."""
    session = SessionRepoSession("threads", url=database_url)
    start = threading.Barrier(4)

    def writer(thread: int) -> None:
        async def write() -> None:
            for index in range(5):
                await session.add_items(
                    [{"role": "user", "content": f"{thread}:{index}", "id": f"m{thread}-{index}"}]
                )

        start.wait()
        asyncio.run(write())

    threads = [threading.Thread(target=writer, args=(thread,)) for thread in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stored = contents(run(session.get_items))
    assert sorted(stored) == sorted(f"{t}:{i}" for t in range(4) for i in range(5))
    for thread in range(4):
        mine = [text for text in stored if text.startswith(f"{thread}:")]
        assert mine == [f"{thread}:{index}" for index in range(5)]
    session.close()


def test_close_is_sync_and_aclose_awaits_it(database_url: str) -> None:
    """``close()`` is a plain method, as ``SQLiteSession.close()`` is, so swapping the
    SDK's session for this one does not leave a coroutine unawaited; ``aclose()`` (and
    ``async with``) is the awaited form."""
    assert not inspect.iscoroutinefunction(SessionRepoSession.close)
    session = SessionRepoSession("closing", url=database_url)
    run(lambda: session.add_items([{"role": "user", "content": "hi"}]))
    session.close()
    with pytest.raises(RepoError, match="closed"):
        run(session.get_items)

    async def awaited() -> None:
        other = SessionRepoSession("closing", url=database_url)
        assert contents(await other.get_items()) == ["hi"]
        await other.aclose()
        with pytest.raises(RepoError, match="closed"):
            await other.get_items()

    run(awaited)


def test_an_async_repository_ties_the_session_to_its_loop(database_url: str) -> None:
    """An ``AsyncSessionRepository`` passed in has its connections on its own loop:
    another loop is refused with a clear error, not a failure deep in the driver."""
    loop = asyncio.new_event_loop()
    try:
        repository = loop.run_until_complete(open_async_repository(database_url))
        session = SessionRepoSession("loops", repository=repository)
        loop.run_until_complete(session.add_items([{"role": "user", "content": "hi"}]))
        with pytest.raises(RuntimeError, match="another event loop"):
            run(session.get_items)
        assert contents(loop.run_until_complete(session.get_items())) == ["hi"]
        session.close()
        # With the outbox its writer is an asyncio one too: closed awaited, on its loop.
        writing = SessionRepoSession("loops", repository=repository, use_outbox=True)
        loop.run_until_complete(writing.add_items([{"role": "user", "content": "again"}]))
        with pytest.raises(RepoError, match="aclose"):
            writing.close()
        loop.run_until_complete(writing.aclose())
        with pytest.raises(RepoError, match="closed"):
            loop.run_until_complete(writing.get_items())
        loop.run_until_complete(repository.close())
    finally:
        loop.close()


def test_a_closed_session_says_so(database_url: str) -> None:
    """After close, every call fails with a RepoError naming it (as a closed
    TranscriptWriter does), an empty add included."""

    async def scenario() -> None:
        session = SessionRepoSession("closed", url=database_url)
        await session.add_items([{"role": "user", "content": "hi"}])
        session.close()
        with pytest.raises(RepoError, match="closed"):
            await session.get_items()
        with pytest.raises(RepoError, match="closed"):
            await session.add_items([])

    asyncio.run(scenario())


def test_runner_session_limit(database_url: str) -> None:
    """Follows ``test_session_limit_parameter``, ``test_session_limit_zero`` and
    ``test_runner_with_session_settings_override``: ``RunConfig.session_settings`` limits
    the history the model gets, over the session's own default."""
    model = ScriptedModel([[text_message(f"Reply {i}", f"msg_{i}")] for i in range(1, 6)])
    agent = _agent(model)

    async def main() -> None:
        async with SessionRepoSession(
            "limited", url=database_url, session_settings=SessionSettings(limit=100)
        ) as session:
            for i in (1, 2, 3):
                await Runner.run(agent, f"Message {i}", session=session)
            assert len(await session.get_items()) == 6
            config = RunConfig(session_settings=SessionSettings(limit=2))
            await Runner.run(agent, "Message 4", session=session, run_config=config)
            last = model.inputs[-1]
            assert len(last) == 3
            assert last[0]["content"] == "Message 3"
            assert last[1]["content"][0]["text"] == "Reply 3"
            assert last[2]["content"] == "Message 4"
            config = RunConfig(session_settings=SessionSettings(limit=0))
            await Runner.run(agent, "Message 5", session=session, run_config=config)
            assert model.inputs[-1] == [{"content": "Message 5", "role": "user"}]

    run(main)


def test_runner_turn_parks_in_the_outbox_during_an_outage(
    database_url: str, backend: str, tmp_path: Path
) -> None:
    """With ``use_outbox=True`` a turn taken while the primary cannot write (another
    connection holds the session's write lock) parks its items and completes. The process
    then restarts (a new session object, a new repository, the same outbox file): its
    next turn drains what was parked first, and the history is complete, in order,
    nothing doubled."""
    model = ScriptedModel(
        [
            [text_message("Hello.", "msg_1")],
            [function_call("weather", '{"city": "Oslo"}', "call_2", "fc_2")],
            [text_message("Sunny in Oslo.", "msg_2")],
            [text_message("Oslo, sunny.", "msg_3")],
        ]
    )
    agent = _agent(model)

    def gateway() -> SessionRepoSession:
        return SessionRepoSession(
            "outage",
            url=database_url,
            use_outbox=True,
            outbox_url=f"sqlite:///{tmp_path / 'outbox.db'}",
            writer_options={"deadline": 1.5},
        )

    async def main() -> None:
        async with gateway() as session:
            await Runner.run(agent, "Hi", session=session)
            writer = await session.writer()
            assert writer is not None
            with holding_the_write_lock(database_url, backend, "outage"):
                result = await Runner.run(agent, "Weather in Oslo?", session=session)
                assert result.final_output == "Sunny in Oslo."
                parked = writer.pending("outage")
                primary = await on_repository(session, "load_transcript", "outage")
            assert parked > 0, "the outage did not happen: nothing was parked"
            assert len(primary) == 2, "the turn reached the primary during the outage"

        async with gateway() as session:
            result = await Runner.run(agent, "Summary?", session=session)
            assert result.final_output == "Oslo, sunny."
            writer = await session.writer()
            assert writer is not None
            assert writer.pending("outage") == 0
            history = await session.get_items()
            assert [item.get("content") for item in history if item.get("role") == "user"] == [
                "Hi",
                "Weather in Oslo?",
                "Summary?",
            ]
            assert [item.get("type") for item in history] == [
                None,
                "message",
                None,
                "function_call",
                "function_call_output",
                "message",
                None,
                "message",
            ]
            assert model.inputs[-1] == history[:-1]
            stored = await on_repository(
                session, "load_transcript", "outage", include_retracted=True
            )
            keys = [m.client_msg_uuid for m in stored]
            assert len(keys) == len(set(keys)) == len(history)

    run(main)


@pytest.mark.parametrize("backend", [pytest.param("sqlite", marks=pytest.mark.sqlite)])
def test_an_outage_without_the_outbox_raises(database_url: str, backend: str) -> None:
    """Without the outbox, a write the primary cannot take raises (the SDK then fails the
    turn), and nothing of it is stored. (SQLite: a held write lock there ends in "database
    is locked" after the busy timeout; on PostgreSQL an append waits for a held row lock.)"""

    async def main() -> None:
        async with await open_async_repository(
            database_url, busy_timeout=0.2, attempts=1
        ) as repository:
            session = SessionRepoSession("down", repository=repository)
            await session.add_items([{"role": "user", "content": "first"}])
            with (
                holding_the_write_lock(database_url, backend, "down"),
                pytest.raises(BackendUnavailable),
            ):
                await session.add_items([{"role": "user", "content": "second"}])
            assert contents(await session.get_items()) == ["first"]

    run(main)
