"""The OpenAI Agents adapter records, once, the usage the SDK reported for each of a
run's model requests (``RunContextWrapper.usage.request_usage_entries``): on a scripted
run, on a retried ``add_items``, and through an outage parked in the outbox."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, Runner, function_tool
from agents.items import ModelResponse, TResponseOutputItem
from agents.models.interface import Model
from agents.run_context import RunContextWrapper
from agents.usage import InputTokensDetails, OutputTokensDetails, Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from sessionrepo import open_repository
from sessionrepo.integrations.openai_agents import SessionRepoSession

from support.harness import holding_the_write_lock
from support.polling import eventually

#: (input, output, cached, reasoning, cache write) of each scripted model call.
CALLS = [(1000, 40, 800, 16, 200), (1300, 25, 1000, 0, 0)]


def _usage(input_tokens: int, output: int, cached: int, reasoning: int, written: int) -> Usage:
    return Usage(
        requests=1,
        input_tokens=input_tokens,
        output_tokens=output,
        total_tokens=input_tokens + output,
        input_tokens_details=InputTokensDetails(cached_tokens=cached, cache_write_tokens=written),
        output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning),
    )


class _Scripted(Model):
    """A function call, then an answer, each with its scripted usage."""

    def __init__(self) -> None:
        self.outputs: list[list[TResponseOutputItem]] = [
            [
                ResponseFunctionToolCall(
                    id="fc_1",
                    type="function_call",
                    call_id="call_1",
                    name="weather",
                    arguments='{"city": "Kyoto"}',
                )
            ],
            [
                ResponseOutputMessage(
                    id="msg_1",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=[ResponseOutputText(type="output_text", text="Sunny.", annotations=[])],
                )
            ],
        ]
        self.calls = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        output = self.outputs[self.calls]
        usage = _usage(*CALLS[self.calls])
        self.calls += 1
        return ModelResponse(output=output, usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def _ledger(url: str, session_id: str) -> list[tuple[int, int, int, int, int]]:
    with open_repository(url) as repo:
        return sorted(
            (
                u.input_tokens,
                u.output_tokens,
                u.cache_read_tokens,
                u.reasoning_tokens,
                u.cache_write_tokens,
            )
            for u in repo.list_usage(session_id)
        )


def test_a_scripted_run_records_each_request_once(database_url: str) -> None:
    async def main() -> SessionRepoSession:
        session = SessionRepoSession(
            "run-1", url=database_url, session_defaults={"model": "gpt-4.1"}
        )
        agent = Agent(name="a", model=_Scripted(), tools=[weather])
        await Runner.run(agent, "Weather in Kyoto?", session=session)
        return session

    session = asyncio.run(main())
    session.close()
    assert _ledger(database_url, "run-1") == sorted(CALLS)
    with open_repository(database_url) as repo:
        assert {u.model for u in repo.list_usage("run-1")} == {"gpt-4.1"}
        stored = repo.get_session("run-1")
        assert stored.input_tokens == sum(c[0] for c in CALLS)


def _wrapper() -> RunContextWrapper[Any]:
    wrapper: RunContextWrapper[Any] = RunContextWrapper(context=None)
    for call in CALLS:
        wrapper.usage.add(_usage(*call))
    return wrapper


def test_a_retried_add_items_counts_nothing_twice(database_url: str) -> None:
    items: list[Any] = [
        {"role": "user", "content": "hi"},
        {"id": "msg_9", "type": "message", "role": "assistant", "content": []},
    ]

    async def main() -> None:
        session = SessionRepoSession("retry", url=database_url)
        wrapper = _wrapper()
        await session.add_items(items, wrapper=wrapper)
        # The same batch and run context again (a retry after a lost acknowledgement: the
        # wrapper never learnt it was recorded), and a new object on the same run.
        setattr(wrapper, "sessionrepo_usage_recorded", 0)  # noqa: B010
        await session.add_items(items, wrapper=wrapper)
        await session.add_items(items, wrapper=wrapper)  # nothing new in the run
        await session.aclose()

    asyncio.run(main())
    assert _ledger(database_url, "retry") == sorted(CALLS)


def test_usage_parked_in_an_outage_is_recorded_once(
    database_url: str, backend: str, tmp_path: Any
) -> None:
    with open_repository(database_url) as repo:
        repo.create_session("parked", source="openai-agents")
    items: list[Any] = [{"id": "msg_5", "type": "message", "role": "assistant", "content": []}]

    async def main() -> None:
        session = SessionRepoSession(
            "parked",
            url=database_url,
            use_outbox=True,
            outbox_url=f"sqlite:///{tmp_path / 'outbox.db'}",
            writer_options={"deadline": 0.5},
        )
        writer = await session.writer()
        assert writer is not None
        assert writer.pending("parked") == 0  # the outbox file made before the outage
        with holding_the_write_lock(database_url, backend, "parked"):
            await session.add_items(items, wrapper=_wrapper())
            assert writer.pending("parked") == 1  # the fault happened: it was parked
        # (the abandoned attempt may commit once the lock is gone: the key makes it one)
        # Drained until empty: a replay step held to the short deadline may miss it on a
        # loaded machine and be retried; what counts is that each call lands once.
        eventually(
            lambda: writer.drain(ignore_backoff=True) is not None and writer.pending("parked") == 0,
            "the parked items drained",
        )
        await session.aclose()

    asyncio.run(main())
    assert _ledger(database_url, "parked") == sorted(CALLS)
