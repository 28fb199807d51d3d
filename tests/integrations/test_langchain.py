"""``sessionrepo.integrations.langchain.SessionRepoChatMessageHistory``, on both backends.

The tests named after an upstream test follow langchain-core's own tests of a chat
history (``libs/core/tests/unit_tests/chat_history/test_chat_history.py``) and of
``RunnableWithMessageHistory`` (``libs/core/tests/unit_tests/runnables/test_history.py``)
in langchain-ai/langchain, with this history where they use ``InMemoryChatMessageHistory``
and the stored transcript where they compare the store. Upstream's tests of an *async*
``get_session_history`` are not mirrored: langchain-core 1.8 calls the factory without
awaiting it. Where sessionrepo deliberately differs (a message added again with the same
``id`` is stored once), the test says so. Then: every message class round trip, the keys,
bad input, and end-to-end runs of ``RunnableWithMessageHistory`` around a fake chat model
that resume after a restart and after an outage parked in the outbox.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _langchain_runnables import (
    LengthChatModel,
    echo_as_dict,
    echo_as_message,
    echo_as_messages,
    echo_dict_messages,
    echo_history_and_input,
    echo_messages,
    echo_messages_key,
    with_history,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.runnables.utils import ConfigurableFieldSpec

from sessionrepo import (
    ArgumentTypeError,
    AsyncSessionRepository,
    AsyncTranscriptWriter,
    ConflictError,
    InvalidArgument,
    InvalidMessage,
    RepoError,
    SessionRepository,
    TranscriptWriter,
    is_sendable,
    open_async_repository,
    open_repository,
)
from sessionrepo.integrations.langchain import (
    LANGCHAIN_FIELD,
    MESSAGE_ID_NAMESPACE,
    SessionRepoChatMessageHistory,
    message_key,
)

from support.harness import holding_the_write_lock
from support.strategies import assert_identical, content_parts, identifiers, json_values, texts

History = SessionRepoChatMessageHistory


@pytest.fixture(autouse=True)
def _no_outbox_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SESSIONREPO_OUTBOX_URL", raising=False)


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("sqlite", marks=pytest.mark.sqlite),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ],
)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def database_url(
    backend: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """One database per backend for this module, not one per test (making and dropping a
    PostgreSQL database costs a second or more on a loaded machine): each test keeps to
    session ids of its own."""
    if backend == "sqlite":
        path = tmp_path_factory.mktemp("langchain") / "store.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
        return
    if backend == "citus":  # the Citus run (tests/conftest.py adds the param)
        citus = request.getfixturevalue("citus_server")
        url = citus.new_schema()
        yield url
        citus.release(url)
        return
    server = request.getfixturevalue("postgres_server")
    name = server.new_database()
    yield server.url_for(name)
    server.drop(name)


@pytest.fixture(scope="module")
def repository(database_url: str) -> Iterator[SessionRepository]:
    with open_repository(database_url) as repository:
        yield repository


def _histories(repository: SessionRepository | AsyncSessionRepository) -> Callable[..., History]:
    """A ``get_session_history``: a new history object per call, as a server makes them."""

    def get_session_history(session_id: str) -> History:
        return History(session_id, repository=repository)

    return get_session_history


def _config(session_id: str) -> RunnableConfig:
    return {"configurable": {"session_id": session_id}}


def _turns(*pairs: tuple[str, str]) -> list[BaseMessage]:
    turns: list[BaseMessage] = []
    for said, answered in pairs:
        turns += [HumanMessage(content=said), AIMessage(content=answered)]
    return turns


def _every_kind_of_message() -> list[BaseMessage]:
    """One of each message class, with every field LangChain has set somewhere."""
    return [
        SystemMessage("be brief", id="s-1"),
        SystemMessage("use metric units", additional_kwargs={"__openai_role__": "developer"}),
        HumanMessage("plain"),
        HumanMessage(
            content=[{"type": "text", "text": "what is this?"}, "and this", {"type": "image"}],
            id="h-1",
            name="ada",
            additional_kwargs={"client": {"platform": "discord", "ids": [1, 2.5, None]}},
        ),
        AIMessage(
            "",
            id="a-1",
            tool_calls=[
                {"name": "weather", "args": {"city": "Kyoto", "days": 2}, "id": "call-1"},
                {"name": "clock", "args": {}, "id": "call-2"},
            ],
            usage_metadata={"input_tokens": 12, "output_tokens": 3, "total_tokens": 15},
            response_metadata={"model_name": "fake", "finish_reason": "tool_calls"},
            additional_kwargs={"refusal": None},
        ),
        ToolMessage("21C", tool_call_id="call-1", name="weather", artifact={"raw": [21.0]}),
        ToolMessage("clock broke", tool_call_id="call-2", status="error", id="t-2"),
        AIMessage(
            "partly",
            tool_calls=[{"name": "lookup", "args": {"q": "x"}, "id": None}],
            invalid_tool_calls=[
                {"name": "bad", "args": "{not json", "id": "call-3", "error": "parse"}
            ],
        ),
        AIMessage("Kyoto: 21C.", name="assistant-2", id="a-2"),
        FunctionMessage("42", name="answer"),
        ChatMessage("a critic's note", role="critic"),
        ChatMessage("from the assistant role", role="assistant", name="n"),
        AIMessageChunk(
            "stream",
            id="c-1",
            tool_call_chunks=[{"name": "f", "args": "{}", "id": "call-9", "index": 0}],
        ),
        HumanMessage("a field of its own", custom_field={"kept": True}),
        # Ids no id column can hold: kept as LangChain has them.
        ToolMessage("no call id", tool_call_id=""),
        ToolMessage("a long call id", tool_call_id="c" * 300),
    ]


def _same(got: list[BaseMessage], sent: list[BaseMessage]) -> None:
    """Equal and of the same classes, message by message (so a failure names one)."""
    assert len(got) == len(sent)
    for index, (back, message) in enumerate(zip(got, sent, strict=True)):
        assert type(back) is type(message), index
        assert back == message, index


# -- mirrored from langchain-core's chat history tests ---------------------------------


def test_interfaces(repository: SessionRepository) -> None:
    """Upstream ``runnables/test_history.py::test_interfaces``."""
    history = History("interfaces", repository=repository)
    history.add_message(SystemMessage(content="system"))
    history.add_user_message("human 1")
    history.add_ai_message("ai")
    history.add_message(HumanMessage(content="human 2"))
    assert str(history) == "System: system\nHuman: human 1\nAI: ai\nHuman: human 2"


def test_add_message_and_bulk_add_messages(repository: SessionRepository) -> None:
    """Upstream ``chat_history/test_chat_history.py::test_add_message_implementation_only``
    and ``::test_bulk_message_implementation_only``: one at a time, then in bulk; equal
    messages without an id are separate messages."""
    history = History("bulk", repository=repository)
    history.add_message(HumanMessage(content="Hello"))
    assert history.messages == [HumanMessage(content="Hello")]
    history.add_message(HumanMessage(content="World"))
    history.add_messages([HumanMessage(content="Hello"), HumanMessage(content="World")])
    assert history.messages == [HumanMessage(content=t) for t in ("Hello", "World") * 2]
    assert len(repository.load_transcript("bulk")) == 4


def test_input_messages(repository: SessionRepository) -> None:
    """Upstream ``runnables/test_history.py::test_input_messages``."""
    chain = with_history(echo_messages(), _histories(repository))
    config = _config("1")
    assert chain.invoke([HumanMessage(content="hello")], config) == "you said: hello"
    assert chain.invoke([HumanMessage(content="good bye")], config) == ("you said: hello\ngood bye")
    streamed = list(chain.stream([HumanMessage(content="hi again")], config))
    assert streamed == ["you said: hello\ngood bye\nhi again"]
    assert History("1", repository=repository).messages == _turns(
        ("hello", "you said: hello"),
        ("good bye", "you said: hello\ngood bye"),
        ("hi again", "you said: hello\ngood bye\nhi again"),
    )


def test_input_messages_async(database_url: str) -> None:
    """Upstream ``runnables/test_history.py::test_input_messages_async``, on the async
    repository."""

    async def run() -> list[BaseMessage]:
        async with await open_async_repository(database_url) as repository:
            chain = with_history(echo_messages(), _histories(repository))
            config = _config("1_async")
            said = await chain.ainvoke([HumanMessage(content="hello")], config)
            assert said == "you said: hello"
            said = await chain.ainvoke([HumanMessage(content="good bye")], config)
            assert said == "you said: hello\ngood bye"
            chunks = [c async for c in chain.astream([HumanMessage(content="hi again")], config)]
            assert chunks == ["you said: hello\ngood bye\nhi again"]
            return await History("1_async", repository=repository).aget_messages()

    assert asyncio.run(run()) == _turns(
        ("hello", "you said: hello"),
        ("good bye", "you said: hello\ngood bye"),
        ("hi again", "you said: hello\ngood bye\nhi again"),
    )


#: (upstream test, runnable, RunnableWithMessageHistory keys, input of a text, output
#: expected for an answer)
_SHAPES: list[tuple[str, Callable[[], Any], dict[str, str], Any, Any]] = [
    (
        "test_input_dict",
        echo_dict_messages,
        {"input_messages_key": "messages"},
        lambda text: {"messages": [HumanMessage(content=text)]},
        lambda answer: answer,
    ),
    (
        "test_input_dict_with_history_key",
        echo_history_and_input,
        {"input_messages_key": "input", "history_messages_key": "history"},
        lambda text: {"input": text},
        lambda answer: answer,
    ),
    (
        "test_output_message",
        echo_as_message,
        {"input_messages_key": "input", "history_messages_key": "history"},
        lambda text: {"input": text},
        lambda answer: AIMessage(content=answer),
    ),
    (
        "test_output_messages",
        echo_as_messages,
        {"input_messages_key": "input", "history_messages_key": "history"},
        lambda text: {"input": text},
        lambda answer: [AIMessage(content=answer)],
    ),
    (
        "test_output_dict",
        echo_as_dict,
        {
            "input_messages_key": "input",
            "history_messages_key": "history",
            "output_messages_key": "output",
        },
        lambda text: {"input": text},
        lambda answer: {"output": [AIMessage(content=answer)]},
    ),
]
_TWO_TURNS = _turns(("hello", "you said: hello"), ("good bye", "you said: hello\ngood bye"))


def test_input_and_output_shapes(repository: SessionRepository) -> None:
    """Upstream ``runnables/test_history.py``'s ``test_input_dict``,
    ``test_input_dict_with_history_key``, ``test_output_message``,
    ``test_output_messages`` and ``test_output_dict``, one session each."""
    for name, runnable, keys, make_input, expected in _SHAPES:
        chain = with_history(runnable(), _histories(repository), **keys)
        config = _config(name)
        assert chain.invoke(make_input("hello"), config) == expected("you said: hello"), name
        second = chain.invoke(make_input("good bye"), config)
        assert second == expected("you said: hello\ngood bye"), name
        assert History(name, repository=repository).messages == _TWO_TURNS, name


def test_input_and_output_shapes_async(database_url: str) -> None:
    """The ``_async`` twins of the tests above (``test_input_dict_async``...), with
    ``ainvoke`` on the async repository."""

    async def run() -> None:
        async with await open_async_repository(database_url) as repository:
            for name, runnable, keys, make_input, expected in _SHAPES:
                chain = with_history(runnable(), _histories(repository), **keys)
                config = _config(f"{name}_async")
                first = await chain.ainvoke(make_input("hello"), config)
                assert first == expected("you said: hello"), name
                second = await chain.ainvoke(make_input("good bye"), config)
                assert second == expected("you said: hello\ngood bye"), name
                stored = await History(f"{name}_async", repository=repository).aget_messages()
                assert stored == _TWO_TURNS, name

    asyncio.run(run())


def test_input_messages_output_message(database_url: str, repository: SessionRepository) -> None:
    """Upstream ``test_input_messages_output_message`` (and its ``_async`` twin): a chat
    model sees the stored history plus the new message."""
    chain = with_history(LengthChatModel(), _histories(repository))
    assert chain.invoke([HumanMessage(content="hi")], _config("5")).content == "1"
    assert chain.invoke([HumanMessage(content="hi")], _config("5")).content == "3"

    async def run() -> list[str]:
        async with await open_async_repository(database_url) as async_repository:
            chain = with_history(LengthChatModel(), _histories(async_repository))
            answers = []
            for _ in range(2):
                answer = await chain.ainvoke([HumanMessage(content="hi")], _config("5_async"))
                answers.append(answer.content)
            return answers

    assert asyncio.run(run()) == ["1", "3"]


def test_using_custom_config_specs(repository: SessionRepository) -> None:
    """Upstream ``test_using_custom_config_specs``: the factory takes two configurable
    fields; here they name the session."""

    def get_session_history(user_id: str, conversation_id: str) -> History:
        return History(f"{user_id}/{conversation_id}", repository=repository)

    fields = [
        ConfigurableFieldSpec(id="user_id", annotation=str, default="", is_shared=True),
        ConfigurableFieldSpec(id="conversation_id", annotation=str, default=None, is_shared=True),
    ]
    chain = with_history(
        echo_messages_key(),
        get_session_history,
        input_messages_key="messages",
        history_messages_key="history",
        history_factory_config=fields,
    )

    def ask(text: str, user_id: str) -> Any:
        config: RunnableConfig = {"configurable": {"user_id": user_id, "conversation_id": "1"}}
        return chain.invoke({"messages": [HumanMessage(content=text)]}, config)

    assert ask("hello", "user1") == [AIMessage(content="you said: hello")]
    assert ask("goodbye", "user1") == [AIMessage(content="you said: goodbye")]
    assert ask("meow", "user2") == [AIMessage(content="you said: meow")]
    assert get_session_history("user1", "1").messages == _turns(
        ("hello", "you said: hello"), ("goodbye", "you said: goodbye")
    )
    assert get_session_history("user2", "1").messages == _turns(("meow", "you said: meow"))


def test_ignore_session_id(repository: SessionRepository) -> None:
    """Upstream ``test_ignore_session_id``: a factory without arguments."""
    history = History("no-config", repository=repository)
    chain = with_history(RunnableLambda(lambda m: [AIMessage(content=_last(m))]), lambda: history)
    chain.invoke("hello")
    chain.invoke("hello again")
    assert len(history.messages) == 4


def _last(messages: list[BaseMessage]) -> str:
    return str(messages[-1].content)


# -- what sessionrepo adds ------------------------------------------------------------------


def test_every_message_class_round_trips(repository: SessionRepository) -> None:
    """Every field of every message class comes back equal; the stored transcript is the
    OpenAI form (tool calls as OpenAI's, a valid transcript), plain messages stored
    plainly."""
    sent = _every_kind_of_message()
    history = History("every", repository=repository)
    history.add_messages(sent)
    _same(History("every", repository=repository).messages, sent)

    stored = [m.to_openai() for m in repository.load_transcript("every")]
    assert stored[2] == {"role": "user", "content": "plain"}
    assert stored[1]["role"] == "developer"
    assert stored[4]["tool_calls"] == [
        {
            "id": "call-1",
            "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Kyoto", "days": 2}'},
        },
        {"id": "call-2", "type": "function", "function": {"name": "clock", "arguments": "{}"}},
    ]
    assert [stored[5]["tool_call_id"], stored[6]["tool_call_id"]] == ["call-1", "call-2"]
    assert stored[3]["name"] == "ada"
    assert stored[9] == {"role": "function", "content": "42", "name": "answer"}
    assert (stored[10]["role"], stored[10][LANGCHAIN_FIELD]["role"]) == ("user", "critic")
    # A tool call without an id has no OpenAI form: kept in LangChain's, not sent as one.
    assert "tool_calls" not in stored[7]
    assert is_sendable(stored[:7])


@st.composite
def _langchain_messages(draw: st.DrawFn) -> BaseMessage:
    """Any LangChain message with any JSON in its free fields."""
    small_dicts = st.dictionaries(texts(max_size=6), json_values(max_leaves=3), max_size=2)
    fields: dict[str, Any] = {
        "content": draw(st.one_of(texts(), st.lists(texts() | content_parts(), max_size=2))),
        "additional_kwargs": draw(small_dicts),
        "response_metadata": draw(small_dicts),
        "id": draw(st.none() | identifiers()),
        "name": draw(st.none() | texts()),
    }
    kind = draw(st.sampled_from(["human", "ai", "system", "tool", "function", "chat"]))
    if kind == "ai":
        call = st.fixed_dictionaries(
            {"name": texts(), "args": small_dicts, "id": st.none() | identifiers()}
        )
        fields["tool_calls"] = draw(st.lists(call, max_size=2))
        tokens = st.integers(0, 2**40)
        usage = st.fixed_dictionaries(
            {"input_tokens": tokens, "output_tokens": tokens, "total_tokens": tokens}
        )
        fields["usage_metadata"] = draw(st.none() | usage)
    elif kind == "tool":
        fields["tool_call_id"] = draw(texts())
        fields["artifact"] = draw(json_values(max_leaves=3))
        fields["status"] = draw(st.sampled_from(["success", "error"]))
    elif kind == "function":
        fields["name"] = draw(texts())
    elif kind == "chat":
        fields["role"] = draw(st.sampled_from(["user", "tool", "developer"]) | texts())
    classes = {"human": HumanMessage, "ai": AIMessage, "system": SystemMessage}
    classes |= {"tool": ToolMessage, "function": FunctionMessage, "chat": ChatMessage}
    return classes[kind](**fields)


def _id_or_self(message: BaseMessage) -> object:
    return message.id or id(message)


# Few examples: generating these is slow (the suite's time budget), and the curated
# list above covers each field on its own.
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Distinct ids: two different messages with one id are a conflict (tested above).
@given(sent=st.lists(_langchain_messages(), min_size=1, max_size=3, unique_by=_id_or_self))
def test_any_message_round_trips_exactly(
    repository: SessionRepository, sent: list[BaseMessage]
) -> None:
    """Exactly: the same classes, and every field with the same types, float signs and
    key order (``==`` alone says ``1 == 1.0``)."""
    session_id = f"any-{uuid.uuid4()}"
    History(session_id, repository=repository).add_messages(sent)
    back = History(session_id, repository=repository).messages
    assert [type(m) for m in back] == [type(m) for m in sent]
    assert_identical([m.model_dump() for m in back], [m.model_dump() for m in sent])


def test_every_message_class_round_trips_async(database_url: str) -> None:
    sent = _every_kind_of_message()

    async def run() -> list[BaseMessage]:
        async with await open_async_repository(database_url) as repository:
            await History("every-async", repository=repository).aadd_messages(sent)
            return await History("every-async", repository=repository).aget_messages()

    _same(asyncio.run(run()), sent)


def test_a_retried_add_of_messages_with_ids_stores_nothing(repository: SessionRepository) -> None:
    """sessionrepo differs from LangChain's own histories here on purpose: they store a
    re-sent batch again; a message with an ``id`` is stored once under a key derived
    from it. Messages without an id are added again (LangChain's "each add appends")."""
    history = History("retry", repository=repository)
    with_ids = [HumanMessage("hi", id="m-1"), AIMessage("hello", id="m-2")]
    history.add_messages(with_ids)
    history.add_messages(with_ids)  # a retry after, say, a timeout that did commit
    History("retry", repository=repository).add_messages(with_ids)  # or from a new object
    assert history.messages == with_ids
    stored = repository.load_transcript("retry")
    assert [m.client_msg_uuid for m in stored] == [
        uuid.uuid5(MESSAGE_ID_NAMESPACE, "retry:m-1"),
        message_key("retry", "m-2"),
    ]
    documented = uuid.uuid5(uuid.NAMESPACE_URL, "sessionrepo:langchain:message-id")
    assert documented == MESSAGE_ID_NAMESPACE
    # The same id in another session is another message there.
    History("retry-2", repository=repository).add_messages(with_ids)
    assert len(repository.load_transcript("retry-2")) == 2

    history.add_messages([HumanMessage("no id")])
    history.add_messages([HumanMessage("no id")])
    assert [m.content for m in history.messages] == ["hi", "hello", "no id", "no id"]


def test_an_id_stored_with_other_content_raises_and_stores_nothing(
    repository: SessionRepository,
) -> None:
    history = History("conflict", repository=repository)
    history.add_messages([HumanMessage("original", id="m-1")])
    with pytest.raises(ConflictError) as caught:
        history.add_messages([HumanMessage("new", id="m-2"), HumanMessage("edited", id="m-1")])
    assert caught.value.conflicts == [message_key("conflict", "m-1")]
    assert history.messages == [HumanMessage("original", id="m-1")]  # atomic: not m-2


def test_clear_empties_the_live_transcript_and_keeps_history(
    database_url: str, repository: SessionRepository
) -> None:
    """Upstream histories delete on ``clear``; sessionrepo keeps the messages stored (out
    of the live transcript), so a cleared message's id, added again, stays cleared."""
    history = History("clear", repository=repository)
    History("never-written", repository=repository).clear()  # no session: nothing to do
    history.add_messages([HumanMessage("before", id="b-1"), AIMessage("reply")])
    history.clear()
    assert history.messages == []
    assert len(repository.load_transcript("clear", include_retracted=True)) == 2
    history.add_messages([HumanMessage("before", id="b-1"), HumanMessage("after")])
    assert history.messages == [HumanMessage("after")]

    async def run() -> list[BaseMessage]:
        async_history = History("clear", url=database_url)
        try:
            await async_history.aclear()
            return await async_history.aget_messages()
        finally:
            await async_history.aclose()

    assert asyncio.run(run()) == []
    assert History("clear", repository=repository).messages == []


def _call(name: str, args: dict[str, Any], call_id: str | None) -> Any:
    return {"name": name, "args": args, "id": call_id}


def _openai_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_bad_input_raises_before_anything_is_written(repository: SessionRepository) -> None:
    history = History("bad", repository=repository)
    good = HumanMessage("fine")
    bad_batches: list[tuple[Any, type[Exception]]] = [
        ([good, RemoveMessage(id="x")], InvalidMessage),  # LangGraph's, not a message
        ([good, HumanMessage("x", additional_kwargs={"raw": b"bytes"})], InvalidMessage),
        ([good, HumanMessage("x", additional_kwargs={"pair": (1, 2)})], InvalidMessage),
        ([good, AIMessage("", tool_calls=[_call("f", {"x": math.nan}, "c")])], InvalidMessage),
        ([good, {"role": "user", "content": "a dict"}], ArgumentTypeError),
        (good, ArgumentTypeError),  # one message, not a list
        ("hello", ArgumentTypeError),
    ]
    for batch, error in bad_batches:
        with pytest.raises(error) as caught:
            history.add_messages(batch)
        if isinstance(batch, list):  # the message is named by its place in the batch
            assert caught.value.field.startswith("messages[1]"), caught.value  # type: ignore[attr-defined]

        async def run(batch: Any = batch) -> None:
            await history.aadd_messages(batch)  # a sync repository: in an executor

        with pytest.raises(error):
            asyncio.run(run())
    assert history.messages == []


def test_constructor_arguments_are_checked(
    database_url: str, repository: SessionRepository, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/other.db"
    with pytest.raises(InvalidArgument, match="url"):
        History("s", url=url, repository=repository)
    with pytest.raises(ArgumentTypeError, match="repository"):
        History("s", repository=url)  # type: ignore[arg-type]
    writer = TranscriptWriter(repository, outbox_url=f"sqlite:///{tmp_path}/outbox.db")
    with writer, pytest.raises(InvalidArgument, match="writer"):
        History("s", url=url, writer=writer)
    with pytest.raises(ArgumentTypeError, match="session_id"):
        History(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidMessage, match="session_id"):
        History("")
    with pytest.raises(ArgumentTypeError, match="session_defaults"):
        History("s", repository=repository, session_defaults=["source"])  # type: ignore[arg-type]
    assert not Path(f"{tmp_path}/other.db").exists()  # nothing was opened

    async def mismatched() -> None:
        async with await open_async_repository(database_url) as async_repository:
            with (
                TranscriptWriter(repository, outbox_url=f"sqlite:///{tmp_path}/o.db") as writer,
                pytest.raises(ArgumentTypeError, match="AsyncTranscriptWriter"),
            ):
                History("s", repository=async_repository, writer=writer)
            history = History("s", repository=async_repository)
            await history.aadd_messages([HumanMessage("async only")])
            with pytest.raises(InvalidArgument, match="async methods only"):
                _ = history.messages

    asyncio.run(mismatched())


def test_session_defaults_fill_in_the_new_session(repository: SessionRepository) -> None:
    history = History("defaults", repository=repository, session_defaults={"source": "lc"})
    history.add_messages([HumanMessage("hi")])
    session = repository.get_session("defaults")
    assert session is not None
    assert session.source == "lc"


def test_a_history_on_a_url_opens_and_closes_what_it_needs(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``url=`` (here: omitted, so ``SESSIONREPO_DATABASE_URL``): the sync methods open a
    repository, the async ones its async twin, and ``aclose`` closes both."""
    monkeypatch.setenv("SESSIONREPO_DATABASE_URL", database_url)
    with History("owned") as history:
        history.add_messages([HumanMessage("sync")])
    with pytest.raises(RepoError, match="closed"):
        history.add_messages([HumanMessage("late")])

    async def run() -> list[BaseMessage]:
        history = History("owned")
        history.add_messages([HumanMessage("sync again")])
        await history.aadd_messages([HumanMessage("async")])
        with pytest.raises(RepoError, match="aclose"):
            history.close()  # the async repository needs its loop
        await history.aclose()
        with pytest.raises(RepoError, match="closed"):
            await history.aget_messages()
        async with History("owned") as reopened:
            return await reopened.aget_messages()

    assert [m.content for m in asyncio.run(run())] == ["sync", "sync again", "async"]
    with open_repository(database_url) as repository:
        assert len(repository.load_transcript("owned")) == 3


def test_reads_what_a_gateway_stored(repository: SessionRepository) -> None:
    """Messages stored by other code (OpenAI dicts, a Responses item) read as the
    LangChain messages they mean."""
    repository.append(
        "gateway",
        [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": "weather?", "name": "ada"},
            {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "tool_calls": [
                    _openai_call("c1", "w", '{"a": 1}'),
                    _openai_call("c2", "w", "{oops"),
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "21C"},
            {"type": "reasoning", "summary": []},
        ],
    )
    messages = History("gateway", repository=repository).messages
    assert messages[0] == SystemMessage(
        "be brief", additional_kwargs={"__openai_role__": "developer"}
    )
    assert messages[1] == HumanMessage("weather?", name="ada")
    assert isinstance(messages[2], AIMessage)
    assert messages[2].tool_calls == [
        {"name": "w", "args": {"a": 1}, "id": "c1", "type": "tool_call"}
    ]
    assert [c["args"] for c in messages[2].invalid_tool_calls] == ["{oops"]
    assert messages[2].additional_kwargs == {"refusal": None}
    assert messages[3] == ToolMessage("21C", tool_call_id="c1")
    assert messages[4] == ChatMessage(
        content="", role="reasoning", additional_kwargs={"type": "reasoning", "summary": []}
    )


# -- end to end: RunnableWithMessageHistory around a fake chat model ------------------------


def _recording_chain(seen: list[list[BaseMessage]], answers: list[str]) -> Any:
    """A fake chat model answering ``answers`` in turn; what it was given goes to
    ``seen``."""

    def record(messages: list[BaseMessage]) -> list[BaseMessage]:
        seen.append(list(messages))
        return messages

    return RunnableLambda(record) | FakeListChatModel(responses=answers)


_QUESTIONS = ["hello, I am Ada", "weather in Kyoto?", "thanks"]
_ANSWERS = ["Hi Ada.", "Sunny, 21C.", "You're welcome."]


def _check_resumed(seen: list[list[BaseMessage]], stored: list[BaseMessage]) -> None:
    """After a restart the model was given the whole stored conversation, then the new
    question; the stored conversation is every turn, in order, each once."""
    assert [m.content for m in stored] == [
        text for pair in zip(_QUESTIONS, _ANSWERS, strict=True) for text in pair
    ] + ["what is my name?", "Ada."]
    assert seen[-1] == [*stored[:-1]]
    for answer in stored[1::2]:
        # LangChain's chat models give their replies an id: their keys derive from it.
        assert answer.id is not None
        assert answer.id.startswith("lc_run-")


def test_end_to_end_resumes_after_a_restart(database_url: str) -> None:
    seen: list[list[BaseMessage]] = []
    with open_repository(database_url) as repository:
        chain = with_history(_recording_chain(seen, _ANSWERS), _histories(repository))
        for question, answer in zip(_QUESTIONS, _ANSWERS, strict=True):
            assert chain.invoke(question, _config("e2e")).content == answer
        assert len(seen[-1]) == 5  # two turns of history and the question
        keys = [m.client_msg_uuid for m in repository.load_transcript("e2e")]
        ids = [m.id for m in History("e2e", repository=repository).messages]
        assert keys[1::2] == [message_key("e2e", i) for i in ids[1::2] if i is not None]

    with open_repository(database_url) as restarted:  # a new process, say
        chain = with_history(_recording_chain(seen, ["Ada."]), _histories(restarted))
        assert chain.invoke("what is my name?", _config("e2e")).content == "Ada."
        _check_resumed(seen, History("e2e", repository=restarted).messages)


def test_end_to_end_async_resumes_after_a_restart(database_url: str) -> None:
    seen: list[list[BaseMessage]] = []

    async def first_run() -> None:
        async with await open_async_repository(database_url) as repository:
            chain = with_history(_recording_chain(seen, _ANSWERS), _histories(repository))
            for question, answer in zip(_QUESTIONS, _ANSWERS, strict=True):
                assert (await chain.ainvoke(question, _config("e2e-async"))).content == answer

    async def second_run() -> list[BaseMessage]:
        async with await open_async_repository(database_url) as repository:
            chain = with_history(_recording_chain(seen, ["Ada."]), _histories(repository))
            assert (await chain.ainvoke("what is my name?", _config("e2e-async"))).content == (
                "Ada."
            )
            return await History("e2e-async", repository=repository).aget_messages()

    asyncio.run(first_run())
    _check_resumed(seen, asyncio.run(second_run()))  # another event loop: a restart


def test_end_to_end_resumes_after_an_outage_parked_in_the_outbox(
    database_url: str, backend: str, tmp_path: Path
) -> None:
    """Through a ``TranscriptWriter``: while another connection holds the session's write
    lock, a turn's messages are parked in the outbox (the turn itself goes on); the
    drain stores them in order, and a restarted process continues with every turn."""
    seen: list[list[BaseMessage]] = []
    outbox = f"sqlite:///{tmp_path}/outbox.db"
    with (
        open_repository(database_url) as repository,
        TranscriptWriter(repository, outbox_url=outbox, deadline=0.5) as writer,
    ):

        def get_session_history(session_id: str) -> History:
            return History(session_id, repository=repository, writer=writer)

        chain = with_history(_recording_chain(seen, _ANSWERS), get_session_history)
        assert chain.invoke(_QUESTIONS[0], _config("outage")).content == _ANSWERS[0]
        # A loaded machine can take longer than the 0.5 s deadline for turn 1 too (then
        # it is parked): stored now, so that the outage below is the only one.
        writer.drain()
        assert writer.pending("outage") == 0
        with holding_the_write_lock(database_url, backend, "outage"):
            assert chain.invoke(_QUESTIONS[1], _config("outage")).content == _ANSWERS[1]
            assert writer.pending("outage") == 2  # the question and the answer, parked
            # Reads show what the primary has: the model was given turn 1 only.
            assert len(History("outage", repository=repository).messages) == 2
        report = writer.drain()
        # Replayed, or already stored by the attempt the deadline gave up on (which may
        # still commit once the lock is gone): the key makes that replay a no-op.
        assert (report.replayed + report.duplicates, report.remaining) == (2, 0)
        assert chain.invoke(_QUESTIONS[2], _config("outage")).content == _ANSWERS[2]
        assert len(seen[-1]) == 5

    with open_repository(database_url) as restarted:
        chain = with_history(_recording_chain(seen, ["Ada."]), _histories(restarted))
        assert chain.invoke("what is my name?", _config("outage")).content == "Ada."
        _check_resumed(seen, History("outage", repository=restarted).messages)

        with TranscriptWriter(restarted, outbox_url=outbox) as writer:
            history = History("outage", repository=restarted, writer=writer)
            answer = history.messages[1]
            edited = answer.model_copy(update={"content": "something else"})
            with pytest.raises(ConflictError) as caught:
                history.add_messages([edited, HumanMessage("also sent")])
            assert caught.value.conflicts == [message_key("outage", str(answer.id))]
            assert history.messages[1] == answer
            assert history.messages[-1] == HumanMessage("also sent")  # (not atomic here)
            history.clear()
            assert history.messages == []


def test_end_to_end_async_resumes_after_an_outage_parked_in_the_outbox(
    database_url: str, backend: str, tmp_path: Path
) -> None:
    """The same, awaited: ``ainvoke`` through an ``AsyncTranscriptWriter``; after the
    restart (another event loop), ``aclear`` goes through a writer too."""
    seen: list[list[BaseMessage]] = []
    outbox = f"sqlite:///{tmp_path}/outbox.db"

    def through(repository: AsyncSessionRepository, writer: AsyncTranscriptWriter) -> Any:
        return lambda session_id: History(session_id, repository=repository, writer=writer)

    async def first_run() -> None:
        async with (
            await open_async_repository(database_url) as repository,
            AsyncTranscriptWriter(repository, outbox_url=outbox, deadline=0.5) as writer,
        ):
            chain = with_history(_recording_chain(seen, _ANSWERS), through(repository, writer))
            config = _config("outage-async")
            assert (await chain.ainvoke(_QUESTIONS[0], config)).content == _ANSWERS[0]
            await writer.drain()  # turn 1 stored, even if a loaded machine parked it
            assert await writer.pending("outage-async") == 0
            with holding_the_write_lock(database_url, backend, "outage-async"):
                assert (await chain.ainvoke(_QUESTIONS[1], config)).content == _ANSWERS[1]
                assert await writer.pending("outage-async") == 2
            report = await writer.drain()
            assert (report.replayed + report.duplicates, report.remaining) == (2, 0)
            assert (await chain.ainvoke(_QUESTIONS[2], config)).content == _ANSWERS[2]

    async def second_run() -> tuple[list[BaseMessage], list[BaseMessage]]:
        async with (
            await open_async_repository(database_url) as repository,
            AsyncTranscriptWriter(repository, outbox_url=outbox) as writer,
        ):
            chain = with_history(_recording_chain(seen, ["Ada."]), through(repository, writer))
            await chain.ainvoke("what is my name?", _config("outage-async"))
            history = History("outage-async", repository=repository, writer=writer)
            resumed = await history.aget_messages()
            await history.aclear()
            return resumed, await history.aget_messages()

    asyncio.run(first_run())
    resumed, cleared = asyncio.run(second_run())
    _check_resumed(seen, resumed)
    assert cleared == []
