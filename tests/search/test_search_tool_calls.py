"""Tool calls are searchable by their arguments and by the tool's name, in the chat
format (``tool_calls``: function and custom; a legacy ``function_call``) as in the
Responses format (a ``function_call`` item), and a tool result by the tool it names;
a store indexed before that finds them after ``reindex``."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import pytest

from sessionrepo import SessionStore, open_async_repository, open_repository
from sessionrepo.search import text as search_text
from sessionrepo.store import search_index

pytestmark = pytest.mark.contract  # every repo test runs on the sync and async API

CHAT_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        }
    ],
}
CUSTOM_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "call_2", "type": "custom", "custom": {"name": "run_sql", "input": "SELECT okapi"}}
    ],
}
LEGACY_CALL = {
    "role": "assistant",
    "content": None,
    "function_call": {"name": "find_flight", "arguments": '{"to": "Bergen"}'},
}
TOOL_RESULT = {
    "role": "tool",
    "tool_call_id": "call_1",
    "tool_name": "get_weather",
    "content": "3 degrees",
}
ITEM_CALL = {
    "type": "function_call",
    "call_id": "call_3",
    "name": "lookup_zebra",
    "arguments": '{"city": "Tromsø"}',
}


def _found(repo: SessionStore, query: str) -> list[tuple[str, int]]:
    return sorted((hit.session_id, hit.seq) for hit in repo.search(query))


def _seed(repo: SessionStore) -> None:
    repo.append("chat", [CHAT_CALL, TOOL_RESULT, CUSTOM_CALL, LEGACY_CALL])
    repo.append("items", [ITEM_CALL])


def _check(repo: SessionStore) -> None:
    assert _found(repo, "Oslo") == [("chat", 1)]
    assert _found(repo, "get_weather") == [("chat", 1), ("chat", 2)]  # the call, its result
    assert _found(repo, "weather") == [("chat", 1), ("chat", 2)]
    assert _found(repo, "okapi") == [("chat", 3)]
    assert _found(repo, "run_sql") == [("chat", 3)]
    assert _found(repo, "find_flight Bergen") == [("chat", 4)]
    assert _found(repo, "lookup_zebra") == [("items", 1)]
    assert _found(repo, "TROMSØ") == [("items", 1)]
    assert _found(repo, "Oslo -weather") == []


def test_tool_calls_are_found_by_arguments_and_name_in_both_formats(repo: SessionStore) -> None:
    _seed(repo)
    _check(repo)
    [hit] = repo.search("Oslo")
    assert hit.role == "assistant"
    assert hit.snippet == 'get_weather({"city": "[Oslo]"})'
    [item] = repo.search("zebra")
    assert item.snippet == 'lookup_[zebra]({"city": "Tromsø"})'


@pytest.mark.parametrize("api", ["sync", "async"])
@pytest.mark.parametrize("mode", [False, "immediate"])
def test_every_way_of_indexing_indexes_tool_calls(
    database_url: str, api: str, mode: Literal["immediate"] | Literal[False]
) -> None:
    """Indexed in the append's transaction, or stored unindexed and rebuilt by reindex."""
    if api == "sync":
        with open_repository(database_url, search_index=mode) as repo:
            _seed(repo)
            if mode is False:
                repo.reindex()
        with open_repository(database_url) as repo:
            _check(repo)
        return

    async def asynchronously() -> None:
        repo = await open_async_repository(database_url, search_index=mode)
        try:
            await repo.append("chat", [CHAT_CALL, TOOL_RESULT, CUSTOM_CALL, LEGACY_CALL])
            await repo.append("items", [ITEM_CALL])
            if mode is False:
                await repo.reindex()
            assert [h.seq for h in await repo.search("Oslo")] == [1]
            assert len(await repo.search("get_weather")) == 2
            assert [h.session_id for h in await repo.search("lookup_zebra")] == ["items"]
        finally:
            await repo.close()

    asyncio.run(asynchronously())


def test_a_store_indexed_before_finds_tool_calls_after_reindex(
    repo: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = search_text.searchable

    def as_before(content: Any, extra: Any, *tool_fields: Any) -> Any:
        return before(content, extra)  # what the index held: no chat tool calls

    with monkeypatch.context() as patch:
        patch.setattr(search_index, "searchable", as_before)
        repo.append("chat", [CHAT_CALL])
        repo.catch_up_search_index()
    assert repo.search("Oslo") == []
    repo.reindex()
    assert _found(repo, "Oslo") == [("chat", 1)]
