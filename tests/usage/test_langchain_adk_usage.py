"""The LangChain and ADK adapters record, once, the usage their framework reported: an
``AIMessage``'s ``usage_metadata`` and an ADK event's ``usage_metadata``, through a
re-sent message or event and through an outage parked in the outbox."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from sessionrepo import TranscriptWriter, open_repository

from support.harness import holding_the_write_lock, holding_the_write_lock_off_the_loop
from support.polling import eventually, eventually_async

pytest.importorskip("langchain_core")
pytest.importorskip("google.adk")

from google.adk.events.event import Event
from google.genai import types
from langchain_core.messages import AIMessage, HumanMessage

from sessionrepo.integrations.adk import SessionRepoSessionService, session_key
from sessionrepo.integrations.langchain import SessionRepoChatMessageHistory


def _ledger(url: str, session_id: str) -> list[tuple[Any, ...]]:
    with open_repository(url) as repo:
        return [
            (
                u.model,
                u.input_tokens,
                u.output_tokens,
                u.cache_read_tokens,
                u.cache_write_tokens,
                u.reasoning_tokens,
            )
            for u in repo.list_usage(session_id)
        ]


def _answer(text: str, message_id: str) -> AIMessage:
    return AIMessage(
        content=text,
        id=message_id,
        response_metadata={"model_name": "claude-sonnet-4"},
        usage_metadata={
            "input_tokens": 900,
            "output_tokens": 120,
            "total_tokens": 1020,
            "input_token_details": {"cache_read": 600, "cache_creation": 100},
            "output_token_details": {"reasoning": 30},
        },
    )


EXPECTED = ("claude-sonnet-4", 900, 120, 600, 100, 30)


def test_langchain_records_usage_metadata_once(database_url: str) -> None:
    history = SessionRepoChatMessageHistory("lc-1", url=database_url)
    turn = [HumanMessage(content="q", id="h1"), _answer("a", "ai1")]
    try:
        history.add_messages(turn)
        history.add_messages(turn[1:])  # re-sent: stored once, counted once
        history.add_messages([HumanMessage(content="no usage", id="h2")])
    finally:
        history.close()

    async def resent() -> None:
        again = SessionRepoChatMessageHistory("lc-1", url=database_url)
        try:
            await again.aadd_messages(turn[1:])
        finally:
            await again.aclose()

    asyncio.run(resent())
    assert _ledger(database_url, "lc-1") == [EXPECTED]


def test_langchain_usage_parked_in_an_outage_is_recorded_once(
    database_url: str, backend: str, tmp_path: Path
) -> None:
    with open_repository(database_url) as repo:
        repo.create_session("lc-2", source="langchain")
        writer = TranscriptWriter(
            repo, outbox_url=f"sqlite:///{tmp_path / 'outbox.db'}", deadline=0.5
        )
        try:
            history = SessionRepoChatMessageHistory("lc-2", repository=repo, writer=writer)
            assert writer.pending("lc-2") == 0  # the outbox file made before the outage
            with holding_the_write_lock(database_url, backend, "lc-2"):
                history.add_messages([_answer("a", "ai2")])
                assert writer.pending("lc-2") == 1  # the fault happened: it was parked
            # (the abandoned attempt may commit once the lock is gone: the key makes it one)
            # Drained until empty: a replay step held to the short deadline may miss it on
            # a loaded machine and be retried; what counts is that the usage lands once.
            eventually(
                lambda: (
                    writer.drain(ignore_backoff=True) is not None and writer.pending("lc-2") == 0
                ),
                "the parked turn drained",
            )
            history.add_messages([_answer("a", "ai2")])  # the flush after: no-op
        finally:
            writer.close()
    assert _ledger(database_url, "lc-2") == [EXPECTED]


def _model_event(text: str) -> Event:
    return Event(
        author="assistant",
        invocation_id="inv",
        model_version="gemini-2.5-flash",
        content=types.Content(role="model", parts=[types.Part(text=text)]),
        usage_metadata=types.GenerateContentResponseUsageMetadata(
            prompt_token_count=700,
            candidates_token_count=50,
            cached_content_token_count=500,
            thoughts_token_count=20,
            total_token_count=770,
        ),
    )


ADK_EXPECTED = ("gemini-2.5-flash", 700, 70, 500, 0, 20)


@pytest.mark.parametrize("path", ["direct", "outbox"])
def test_adk_records_the_event_usage_once(database_url: str, tmp_path: Path, path: str) -> None:
    options: dict[str, Any] = {}
    if path == "outbox":
        options["outbox"] = f"sqlite:///{tmp_path / 'outbox.db'}"
    sid: list[str] = []

    async def main() -> None:
        async with SessionRepoSessionService(url=database_url, **options) as service:
            session = await service.create_session(app_name="app", user_id="u")
            sid.append(session_key("app", "u", session.id))
            event = _model_event("hello")
            await service.append_event(session, event)
            await service.append_event(session, event)  # a retry: a no-op

    asyncio.run(main())
    assert _ledger(database_url, sid[0]) == [ADK_EXPECTED]


def test_adk_usage_parked_in_an_outage_is_recorded_once(
    database_url: str, backend: str, tmp_path: Path
) -> None:
    sid: list[str] = []

    async def main() -> None:
        async with SessionRepoSessionService(
            url=database_url, outbox=f"sqlite:///{tmp_path / 'outbox.db'}", deadline=0.5
        ) as service:
            session = await service.create_session(app_name="app", user_id="u")
            key = session_key("app", "u", session.id)
            sid.append(key)
            assert service.writer is not None
            assert await service.writer.pending() == 0  # the outbox file made before the outage
            async with holding_the_write_lock_off_the_loop(database_url, backend, key):
                await service.append_event(session, _model_event("parked"))
                with sqlite3.connect(tmp_path / "outbox.db") as outbox:
                    parked = outbox.execute("SELECT count(*) FROM pending_outbox").fetchone()
                assert parked == (1,)  # the fault happened: the event was parked
            # (the abandoned attempt may commit once the lock is gone: the key makes it one)
            writer = service.writer
            assert writer is not None

            async def drained() -> bool:  # retried: see the LangChain test above
                await writer.drain(ignore_backoff=True)
                return await writer.pending() == 0

            await eventually_async(drained, "the parked event drained")
            loaded = await service.get_session(app_name="app", user_id="u", session_id=session.id)
            assert loaded is not None
            assert [e.content.parts[0].text for e in loaded.events if e.content] == ["parked"]

    asyncio.run(main())
    assert _ledger(database_url, sid[0]) == [ADK_EXPECTED]


def test_usage_a_framework_reports_beyond_any_record_is_left_out_and_said(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A count past the sanity bound (or a provider that is not text) is the framework's
    bad data: the messages are stored, that record is not, and one WARNING says so."""
    history = SessionRepoChatMessageHistory("lc-bad", url=database_url)
    wild = AIMessage(
        content="an answer worth keeping",
        id="ai-wild",
        response_metadata={"model_name": "m", "model_provider": {"not": "text"}},
        usage_metadata={"input_tokens": 1, "output_tokens": 2**41, "total_tokens": 2**41 + 1},
    )
    try:
        with caplog.at_level("WARNING", logger="sessionrepo"):
            history.add_messages([HumanMessage(content="q", id="h-wild"), wild])
        assert [m.content for m in history.messages] == ["q", "an answer worth keeping"]
    finally:
        history.close()
    assert _ledger(database_url, "lc-bad") == []
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1, warned
    assert "the reported usage was not recorded" in warned[0]
    assert "output_tokens" in warned[0]
    assert "provider" in warned[0]
