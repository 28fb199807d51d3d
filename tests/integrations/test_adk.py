"""``sessionrepo.integrations.adk.SessionRepoSessionService`` against ADK's own contract.

The behaviours of ADK's shared session-service suite (google/adk-python,
``tests/unittests/sessions/test_session_service.py``, the backends of
``_conformance.py``'s ``BACKENDS`` registry), each test naming the upstream test it
follows, run on both backends; then an end-to-end ``Runner`` with a scripted model that
resumes after a restart. Where sessionrepo deliberately differs (a retried
``append_event`` is a no-op instead of an ``IntegrityError``), the test says so.

ADK is asyncio: each test runs its scenario with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from google.adk.agents.llm_agent import LlmAgent
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types
from pydantic import Field

from sessionrepo import InvalidArgument, InvalidMessage, RepoError, open_async_repository
from sessionrepo.integrations.adk import SessionRepoSessionService, session_key

from support.harness import holding_the_write_lock

Scenario = Callable[[SessionRepoSessionService], Awaitable[None]]


def run(database_url: str, scenario: Scenario, **options: Any) -> None:
    async def main() -> None:
        async with SessionRepoSessionService(url=database_url, **options) as service:
            await scenario(service)

    asyncio.run(main())


@pytest.fixture(params=["direct", "outbox"])
def options(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """The service's two write paths: its own transaction per event, or sessionrepo's
    write path (``outbox=``, a local SQLite outbox file) with the primary healthy."""
    if request.param == "direct":
        return {}
    return {"outbox": f"sqlite:///{tmp_path / 'outbox.db'}"}


def user_event(text: str, **fields: Any) -> Event:
    return Event(
        author="user",
        content=types.Content(role="user", parts=[types.Part(text=text)]),
        **fields,
    )


# -- ADK's contract (test_session_service.py) ----------------------------------------


def test_get_empty_session(database_url: str) -> None:
    """Upstream: ``test_get_empty_session``."""

    async def scenario(service: SessionRepoSessionService) -> None:
        assert await service.get_session(app_name="my_app", user_id="u", session_id="123") is None

    run(database_url, scenario)


def test_create_get_session(database_url: str) -> None:
    """Upstream: ``test_create_get_session`` (create, get equal, delete, gone)."""

    async def scenario(service: SessionRepoSessionService) -> None:
        session = await service.create_session(
            app_name="my_app", user_id="test_user", state={"key": "value"}
        )
        assert (session.app_name, session.user_id, session.state) == (
            "my_app",
            "test_user",
            {"key": "value"},
        )
        assert session.id
        assert session.last_update_time <= datetime.now(UTC).timestamp()
        got = await service.get_session(
            app_name="my_app", user_id="test_user", session_id=session.id
        )
        assert got == session
        await service.delete_session(app_name="my_app", user_id="test_user", session_id=session.id)
        assert (
            await service.get_session(app_name="my_app", user_id="test_user", session_id=session.id)
            is None
        )
        # Deleting what does not exist is a no-op, as in ADK.
        await service.delete_session(app_name="my_app", user_id="test_user", session_id=session.id)

    run(database_url, scenario)


def test_create_and_list_sessions(database_url: str) -> None:
    """Upstream: ``test_create_and_list_sessions``, ``test_list_sessions_all_users`` and
    ``test_list_sessions_ordered_by_last_update_time`` (oldest update first)."""

    async def scenario(service: SessionRepoSessionService) -> None:
        for user, sid in [("user1", "s1a"), ("user1", "s1b"), ("user2", "s2a")]:
            await service.create_session(
                app_name="my_app", user_id=user, session_id=sid, state={"key": "v" + sid}
            )
        await service.create_session(app_name="other_app", user_id="user1", session_id="x")
        one = (await service.list_sessions(app_name="my_app", user_id="user1")).sessions
        assert {s.id: s.state for s in one} == {"s1a": {"key": "vs1a"}, "s1b": {"key": "vs1b"}}
        every = (await service.list_sessions(app_name="my_app")).sessions
        assert [s.id for s in every] == ["s1a", "s1b", "s2a"]
        assert all(s.events == [] for s in every)
        # An event moves its session to the end.
        first = await service.get_session(app_name="my_app", user_id="user1", session_id="s1a")
        assert first is not None
        await service.append_event(first, user_event("hi", timestamp=first.last_update_time + 60))
        listed = (await service.list_sessions(app_name="my_app")).sessions
        assert [s.id for s in listed] == ["s1b", "s2a", "s1a"]
        assert listed[-1].last_update_time == first.last_update_time

    run(database_url, scenario)


def test_list_sessions_pages(database_url: str) -> None:
    """Not upstream (ADK 2.13 lists everything at once): ``page_size``/``page_token``
    walk sessionrepo's keyset-paged listing, newest activity first, each session once."""

    async def scenario(service: SessionRepoSessionService) -> None:
        for index in range(5):
            await service.create_session(app_name="app", user_id="u", session_id=f"s{index}")
        seen: list[str] = []
        token = None
        while True:
            page = await service.list_sessions(
                app_name="app", user_id="u", page_size=2, page_token=token
            )
            assert len(page.sessions) <= 2
            seen += [s.id for s in page.sessions]
            token = page.next_page_token
            if token is None:
                break
        assert sorted(seen) == [f"s{index}" for index in range(5)]
        assert seen == [
            s.id for s in reversed((await service.list_sessions(app_name="app")).sessions)
        ]
        with pytest.raises(InvalidArgument):
            await service.list_sessions(app_name="app", page_token="x")

    run(database_url, scenario)


def test_app_user_and_session_state_scopes(database_url: str, options: dict[str, Any]) -> None:
    """Upstream: ``test_app_state_is_shared_by_all_users_of_app``,
    ``test_user_state_is_shared_only_by_user_sessions``,
    ``test_session_state_is_not_shared``; and ``get_user_state``."""

    async def scenario(service: SessionRepoSessionService) -> None:
        s1 = await service.create_session(
            app_name="my_app",
            user_id="u1",
            session_id="s1",
            state={"app:k1": "v1", "user:k1": "v1", "sk1": "v1"},
        )
        delta = {"app:k2": "v2", "user:k2": "v2", "sk2": "v2"}
        await service.append_event(
            s1, Event(invocation_id="inv1", author="user", actions=EventActions(state_delta=delta))
        )
        s1b = await service.create_session(app_name="my_app", user_id="u1", session_id="s1b")
        assert s1b.state == {"app:k1": "v1", "app:k2": "v2", "user:k1": "v1", "user:k2": "v2"}
        s2 = await service.create_session(app_name="my_app", user_id="u2", session_id="s2")
        assert s2.state == {"app:k1": "v1", "app:k2": "v2"}
        got = await service.get_session(app_name="my_app", user_id="u1", session_id="s1")
        assert got is not None
        assert got.state == {
            "sk1": "v1",
            "sk2": "v2",
            "app:k1": "v1",
            "app:k2": "v2",
            "user:k1": "v1",
            "user:k2": "v2",
        }
        assert await service.get_user_state(app_name="my_app", user_id="u1") == {
            "k1": "v1",
            "k2": "v2",
        }
        assert await service.get_user_state(app_name="my_app", user_id="nobody") == {}

    run(database_url, scenario, **options)


def test_get_user_state(database_url: str) -> None:
    """Upstream: ``test_get_user_state_returns_empty_dict_when_no_state_exists``,
    ``..._returns_state_written_via_append_event``, ``..._is_not_visible_across_users``,
    ``..._is_not_visible_across_apps``, ``..._reflects_latest_write``."""

    async def scenario(service: SessionRepoSessionService) -> None:
        assert await service.get_user_state(app_name="my_app", user_id="u1") == {}
        session = await service.create_session(app_name="my_app", user_id="u1")
        for delta in (
            {"user:profile": {"name": "Alice"}, "session_key": 1, "user:counter": 1},
            {"user:counter": 2},
        ):
            await service.append_event(
                session, Event(author="system", actions=EventActions(state_delta=delta))
            )
        assert await service.get_user_state(app_name="my_app", user_id="u1") == {
            "profile": {"name": "Alice"},
            "counter": 2,
        }
        assert await service.get_user_state(app_name="my_app", user_id="u2") == {}
        assert await service.get_user_state(app_name="other_app", user_id="u1") == {}

    run(database_url, scenario)


def test_concurrent_first_calls(database_url: str) -> None:
    """Upstream: ``test_concurrent_prepare_tables_no_race_condition``: the first calls of
    a fresh service, at once, all succeed (it opens its repository once)."""

    async def scenario(service: SessionRepoSessionService) -> None:
        created = await asyncio.gather(
            *(
                service.create_session(app_name=f"app_{i}", user_id="user", session_id=f"s_{i}")
                for i in range(5)
            )
        )
        assert [s.id for s in created] == [f"s_{i}" for i in range(5)]
        for i in range(5):
            assert await service.get_session(
                app_name=f"app_{i}", user_id="user", session_id=f"s_{i}"
            )

    run(database_url, scenario)


def test_temp_state_is_not_persisted_in_state_or_events(database_url: str) -> None:
    """Upstream: ``test_temp_state_is_not_persisted_in_state_or_events`` and
    ``test_temp_state_visible_across_sequential_events``; here also read back."""

    async def scenario(service: SessionRepoSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="u1", session_id="s1")
        event = Event(
            invocation_id="inv1",
            author="agent1",
            actions=EventActions(state_delta={"temp:k1": "v1", "sk": "v2"}),
        )
        await service.append_event(session, event)
        assert session.state == {"temp:k1": "v1", "sk": "v2"}
        assert event.actions.state_delta == {"sk": "v2"}
        got = await service.get_session(app_name="my_app", user_id="u1", session_id="s1")
        assert got is not None
        assert got.state == {"sk": "v2"}
        assert got.events[0].actions.state_delta == {"sk": "v2"}

    run(database_url, scenario)


def test_get_session_respects_user_id(database_url: str) -> None:
    """Upstream: ``test_get_session_respects_user_id``; and
    ``test_create_session_with_existing_id_raises_error``."""

    async def scenario(service: SessionRepoSessionService) -> None:
        s1 = await service.create_session(app_name="my_app", user_id="u1", session_id="s1")
        await service.append_event(s1, Event(invocation_id="inv1", author="user"))
        await service.create_session(app_name="my_app", user_id="u2", session_id="s1")
        got = await service.get_session(app_name="my_app", user_id="u2", session_id="s1")
        assert got is not None
        assert (got.user_id, got.events) == ("u2", [])
        with pytest.raises(AlreadyExistsError):
            await service.create_session(app_name="my_app", user_id="u1", session_id="s1")
        # Ids with the separator in them stay apart.
        await service.create_session(app_name="a:b", user_id="c", session_id="d")
        await service.create_session(app_name="a", user_id="b:c", session_id="d")
        assert session_key("a:b", "c", "d") != session_key("a", "b:c", "d")

    run(database_url, scenario)


def test_append_event_bytes_and_complete(database_url: str) -> None:
    """Upstream: ``test_append_event_bytes`` and ``test_append_event_complete``: every
    field of an event comes back equal (bytes, metadata, actions, sets)."""

    async def scenario(service: SessionRepoSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="user")
        image = types.Content(
            role="user",
            parts=[types.Part.from_bytes(data=b"test_image_data\x00\xff", mime_type="image/png")],
        )
        grounding = types.GroundingMetadata(
            search_entry_point=types.SearchEntryPoint(sdk_blob=b"test_sdk_blob")
        )
        await service.append_event(
            session,
            Event(
                invocation_id="invocation",
                author="user",
                content=image,
                grounding_metadata=grounding,
            ),
        )
        complete = Event(
            invocation_id="invocation",
            author="user",
            content=types.Content(role="user", parts=[types.Part(text="test_text")]),
            turn_complete=True,
            partial=False,
            actions=EventActions(
                artifact_delta={"file": 0}, transfer_to_agent="agent", escalate=True
            ),
            long_running_tool_ids={"tool1"},
            error_code="error_code",
            error_message="error_message",
            interrupted=True,
            grounding_metadata=types.GroundingMetadata(web_search_queries=["query1"]),
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=1, candidates_token_count=1, total_token_count=2
            ),
            citation_metadata=types.CitationMetadata(),
            custom_metadata={"custom_key": "custom_value"},
            timestamp=1700000000.123,
            input_transcription=types.Transcription(text="input transcription", finished=True),
            output_transcription=types.Transcription(text="output transcription", finished=True),
        )
        await service.append_event(session, complete)
        got = await service.get_session(app_name="my_app", user_id="user", session_id=session.id)
        assert got == session
        assert got is not None
        assert got.events[0].content == image
        assert got.events[0].grounding_metadata == grounding

    run(database_url, scenario)


def test_session_last_update_time_updates_on_event(database_url: str) -> None:
    """Upstream: ``test_session_last_update_time_updates_on_event``."""

    async def scenario(service: SessionRepoSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="user")
        original = session.last_update_time
        await service.append_event(
            session, Event(invocation_id="i", author="user", timestamp=original + 10)
        )
        assert session.last_update_time == original + 10
        got = await service.get_session(app_name="my_app", user_id="user", session_id=session.id)
        assert got is not None
        assert got.last_update_time == original + 10

    run(database_url, scenario)


def test_append_event_to_stale_session(database_url: str, options: dict[str, Any]) -> None:
    """Upstream: ``test_append_event_to_stale_session`` (``DatabaseSessionService``'s
    stale-writer check): a session object loaded before another append is refused, and
    nothing of its event is stored."""

    async def scenario(service: SessionRepoSessionService) -> None:
        now = datetime.now(UTC).timestamp()
        original = await service.create_session(app_name="my_app", user_id="user")
        await service.append_event(
            original,
            Event(
                invocation_id="inv1",
                author="user",
                timestamp=now + 1,
                actions=EventActions(state_delta={"sk1": "v1"}),
            ),
        )
        updated = await service.get_session(
            app_name="my_app", user_id="user", session_id=original.id
        )
        assert updated is not None
        await service.append_event(
            updated,
            Event(
                invocation_id="inv2",
                author="user",
                timestamp=now + 2,
                actions=EventActions(state_delta={"sk2": "v2"}),
            ),
        )
        with pytest.raises(StaleSessionError, match="modified in storage"):
            await service.append_event(
                original,
                Event(
                    invocation_id="inv3",
                    author="user",
                    timestamp=now + 3,
                    actions=EventActions(state_delta={"sk3": "v3"}),
                ),
            )
        final = await service.get_session(app_name="my_app", user_id="user", session_id=original.id)
        assert final is not None
        assert [e.invocation_id for e in final.events] == ["inv1", "inv2"]
        assert (final.state.get("sk1"), final.state.get("sk2"), final.state.get("sk3")) == (
            "v1",
            "v2",
            None,
        )
        gone = original.model_copy(update={"id": "nope"})
        with pytest.raises(SessionNotFoundError):
            await service.append_event(gone, Event(invocation_id="x", author="user"))

    run(database_url, scenario, **options)


def test_append_event_concurrent_stale_sessions_reject_stale_writer(database_url: str) -> None:
    """Upstream: ``test_append_event_concurrent_stale_sessions_reject_stale_writer``: of
    two copies of one session appending at once, exactly one wins (the session's row
    lock decides, across processes too). Not with ``outbox=``: there the check is a read
    before the write (the writer may park the event), so two racing copies can both
    pass it; the README says so."""

    async def scenario(service: SessionRepoSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="user")
        rounds = 3
        for i in range(rounds):
            latest = await service.get_session(
                app_name="my_app", user_id="user", session_id=session.id
            )
            assert latest is not None
            copies = [latest.model_copy(deep=True), latest.model_copy(deep=True)]
            events = [
                Event(
                    invocation_id=f"inv{i}-{n}",
                    author="user",
                    timestamp=latest.last_update_time + 10 + n,
                    actions=EventActions(state_delta={f"sk{i}-{n}": f"v{i}-{n}"}),
                )
                for n in (1, 2)
            ]
            results = await asyncio.gather(
                *(service.append_event(c, e) for c, e in zip(copies, events, strict=True)),
                return_exceptions=True,
            )
            errors = [r for r in results if isinstance(r, BaseException)]
            assert len(errors) == 1
            assert isinstance(errors[0], StaleSessionError)
        final = await service.get_session(app_name="my_app", user_id="user", session_id=session.id)
        assert final is not None
        assert len(final.events) == rounds
        for i in range(rounds):
            values = {final.state.get(f"sk{i}-1"), final.state.get(f"sk{i}-2")}
            assert None in values
            assert values & {f"v{i}-1", f"v{i}-2"}

    run(database_url, scenario)


def test_append_event_allows_markerless_current_session(database_url: str) -> None:
    """Upstream: ``test_append_event_allows_markerless_current_session`` and
    ``test_append_event_allows_timestamp_drift_for_current_session``: a session object
    without the storage marker (or with a drifted time) that holds what is stored last
    is current, not stale; ``test_partial_events_are_not_persisted``."""

    async def scenario(service: SessionRepoSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="user", session_id="s1")
        first = Event(invocation_id="inv1", author="user", timestamp=session.last_update_time + 10)
        await service.append_event(session, first)
        session.last_update_time -= 0.0001
        await service.append_event(
            session, Event(invocation_id="inv2", author="user", timestamp=first.timestamp + 10)
        )
        session._storage_update_marker = None
        session.last_update_time -= 0.0001
        await service.append_event(
            session, Event(invocation_id="inv3", author="user", timestamp=first.timestamp + 20)
        )
        await service.append_event(session, Event(author="user", partial=True))
        assert len(session.events) == 3
        got = await service.get_session(app_name="my_app", user_id="user", session_id="s1")
        assert got is not None
        assert [e.invocation_id for e in got.events] == ["inv1", "inv2", "inv3"]

    run(database_url, scenario)


def test_append_event_is_one_transaction(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upstream: ``test_append_event_calls_rollback_on_commit_failure`` and
    ``test_service_recovers_after_multiple_failures``: a failure after the event was
    inserted (here injected into the state update, the transaction's last step) rolls
    the whole append back, event and state, and the service goes on working."""
    from sessionrepo.integrations import adk

    original = adk._apply
    failures: list[str] = []

    def failing_apply(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        failures.append("applied, then failed")
        raise RuntimeError("simulated failure inside the transaction")

    async def scenario(service: SessionRepoSessionService) -> None:
        session = await service.create_session(app_name="app", user_id="user", session_id="s1")
        delta = {"key1": "value1", "app:k": 1}
        await service.append_event(
            session,
            Event(invocation_id="inv1", author="user", actions=EventActions(state_delta=delta)),
        )
        monkeypatch.setattr(adk, "_apply", failing_apply)
        for attempt in range(3):
            with pytest.raises(RepoError):
                await service.append_event(
                    session,
                    Event(
                        invocation_id=f"inv2-{attempt}",
                        author="user",
                        actions=EventActions(state_delta={"key2": "value2", "app:k": 2}),
                    ),
                )
        assert len(failures) == 3  # the fault happened, after the insert, each time
        monkeypatch.setattr(adk, "_apply", original)
        got = await service.get_session(app_name="app", user_id="user", session_id="s1")
        assert got is not None
        assert [e.invocation_id for e in got.events] == ["inv1"]
        assert got.state == {"key1": "value1", "app:k": 1}
        repo = await service._repo()
        assert len(await repo.load_transcript(session_key("app", "user", "s1"))) == 1
        await service.append_event(got, Event(invocation_id="inv3", author="user"))

    run(database_url, scenario)


def test_retried_append_event_is_a_no_op(database_url: str, options: dict[str, Any]) -> None:
    """sessionrepo differs on purpose: ADK's ``DatabaseSessionService`` raises an
    ``IntegrityError`` when an event is appended again (the retry of a call whose commit
    the caller never heard of); here the event's key makes it a no-op: stored once, its
    state delta applied once, even from a stale copy of the session."""

    async def scenario(service: SessionRepoSessionService) -> None:
        session = await service.create_session(app_name="app", user_id="u", state={"n": 0})
        before = session.model_copy(deep=True)
        event = user_event("once", actions=EventActions(state_delta={"app:hits": 1, "n": 1}))
        await service.append_event(session, event)
        await service.append_event(session, event)  # the same object again
        await service.append_event(before, event.model_copy(deep=True))  # a stale copy
        got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
        assert got is not None
        assert [e.id for e in got.events] == [event.id]
        assert [e.id for e in session.events] == [event.id]
        assert got.state == {"n": 1, "app:hits": 1}
        # The retried copy is up to date now: its next append goes through.
        await service.append_event(before, user_event("next"))
        repo = await service._repo()
        stored = await repo.load_transcript(session_key("app", "u", session.id))
        assert [m.content for m in stored] == ["once", "next"]

    run(database_url, scenario, **options)


def test_get_session_with_config(database_url: str) -> None:
    """Upstream: ``test_get_session_with_config`` (``num_recent_events``,
    ``after_timestamp``, both, and 0 for no events)."""

    async def scenario(service: SessionRepoSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="user")
        base = session.last_update_time
        for index in range(1, 6):
            await service.append_event(
                session, Event(invocation_id=f"i{index}", author="user", timestamp=base + index)
            )

        async def ids(config: GetSessionConfig) -> list[str]:
            got = await service.get_session(
                app_name="my_app", user_id="user", session_id=session.id, config=config
            )
            assert got is not None
            return [e.invocation_id for e in got.events]

        assert await ids(GetSessionConfig(num_recent_events=3)) == ["i3", "i4", "i5"]
        assert await ids(GetSessionConfig(num_recent_events=0)) == []
        assert await ids(GetSessionConfig(after_timestamp=base + 4)) == ["i4", "i5"]
        assert await ids(GetSessionConfig(after_timestamp=base + 2, num_recent_events=2)) == [
            "i4",
            "i5",
        ]
        assert await ids(GetSessionConfig(after_timestamp=base + 99)) == []
        assert await ids(GetSessionConfig()) == ["i1", "i2", "i3", "i4", "i5"]

    run(database_url, scenario)


def test_events_are_searchable_and_rewind_maps_to_sessionrepo_rewind(
    database_url: str, options: dict[str, Any]
) -> None:
    """Not upstream: the event text is sessionrepo content (search finds it), and an ADK
    rewind event takes the invocations it undoes out of sessionrepo's live transcript,
    while ``get_session`` still returns every event, as ADK's own services do."""

    async def scenario(service: SessionRepoSessionService) -> None:
        session = await service.create_session(app_name="app", user_id="u", session_id="s")
        await service.append_event(session, user_event("mochi is a cat", invocation_id="inv1"))
        await service.append_event(session, user_event("the vet said fine", invocation_id="inv2"))
        rewind = Event(
            invocation_id="inv3",
            author="user",
            actions=EventActions(rewind_before_invocation_id="inv2"),
        )
        await service.append_event(session, rewind)
        repo = await service._repo()
        sid = session_key("app", "u", "s")
        assert [m.content for m in await repo.load_transcript(sid)] == ["mochi is a cat"]
        assert [h.session_id for h in await repo.search("mochi")] == [sid]
        assert await repo.search("vet") == []
        got = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert got is not None
        assert [e.invocation_id for e in got.events] == ["inv1", "inv2", "inv3"]
        # A message a gateway appends to the session directly is not an event: ADK is
        # not shown it, and the session goes on.
        await repo.append(sid, [{"role": "user", "content": "from elsewhere"}])
        got = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert got is not None
        assert [e.invocation_id for e in got.events] == ["inv1", "inv2", "inv3"]
        await service.append_event(got, user_event("after", invocation_id="inv4"))

    run(database_url, scenario, **options)


def test_bad_input_is_refused_before_anything_is_written(database_url: str) -> None:
    """An id sessionrepo cannot store (a control character) raises ``InvalidMessage``;
    nothing of the call is stored. (State JSON cannot encode is stored as ADK's services
    store it: see test_adk_parity.py.)"""

    async def scenario(service: SessionRepoSessionService) -> None:
        with pytest.raises(InvalidMessage):
            await service.create_session(app_name="app", user_id="u\x00", session_id="s")
        with pytest.raises(InvalidMessage):
            await service.create_session(app_name="app", user_id="u", session_id="s\x07")
        assert (await service.list_sessions(app_name="app")).sessions == []

    run(database_url, scenario)


def test_constructor_arguments(database_url: str) -> None:
    """A repository handed in stays the caller's; ``url`` and ``repository`` exclude
    each other; a sync repository is refused with a typed error."""

    async def main() -> None:
        repository = await open_async_repository(database_url)
        async with SessionRepoSessionService(repository=repository) as service:
            await service.create_session(app_name="app", user_id="u", session_id="s")
        assert await repository.get_session(session_key("app", "u", "s"))  # still open
        with pytest.raises(InvalidArgument):
            SessionRepoSessionService(url=database_url, repository=repository)
        await repository.close()

    asyncio.run(main())
    with pytest.raises(TypeError):
        SessionRepoSessionService(repository=object())  # type: ignore[arg-type]


# -- end to end: ADK's Runner ---------------------------------------------------------


class ScriptedModel(BaseLlm):
    """A model that answers each turn with the next scripted text (offline), and records
    how many contents each request carried (so a resumed run is seen to get history)."""

    replies: list[str]
    seen: list[int] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.seen.append(len(llm_request.contents))
        text = self.replies.pop(0)
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))


def _runner(service: SessionRepoSessionService, model: ScriptedModel) -> Runner:
    agent = LlmAgent(name="helper", model=model, instruction="Be brief.", output_key="last")
    return Runner(app_name="e2e", agent=agent, session_service=service)


async def _turn(runner: Runner, session_id: str, text: str) -> list[str]:
    replies: list[str] = []
    async for event in runner.run_async(
        user_id="alice",
        session_id=session_id,
        new_message=types.Content(role="user", parts=[types.Part(text=text)]),
    ):
        if event.content and event.content.parts and event.author == "helper":
            replies += [part.text for part in event.content.parts if part.text]
    return replies


def test_runner_resumes_after_a_restart(database_url: str) -> None:
    """ADK's Runner over several turns with a scripted model, then a new service object
    on a new repository (a restarted process) resumes the conversation: the model is
    sent the whole history and the agent's ``output_key`` state survived."""

    async def first_process() -> str:
        async with SessionRepoSessionService(url=database_url) as service:
            model = ScriptedModel(model="scripted", replies=["hello", "21C in Kyoto"])
            runner = _runner(service, model)
            session = await service.create_session(app_name="e2e", user_id="alice")
            assert await _turn(runner, session.id, "hi") == ["hello"]
            assert await _turn(runner, session.id, "weather in Kyoto?") == ["21C in Kyoto"]
            assert model.seen == [1, 3]
            return session.id

    async def second_process(session_id: str) -> None:
        async with SessionRepoSessionService(url=database_url) as service:
            model = ScriptedModel(model="scripted", replies=["you asked about Kyoto"])
            runner = _runner(service, model)
            assert await _turn(runner, session_id, "what did I ask?") == ["you asked about Kyoto"]
            assert model.seen == [5]  # four earlier events and the new question
            session = await service.get_session(
                app_name="e2e", user_id="alice", session_id=session_id
            )
            assert session is not None
            assert session.state["last"] == "you asked about Kyoto"
            texts = [
                e.content.parts[0].text for e in session.events if e.content and e.content.parts
            ]
            assert texts == [
                "hi",
                "hello",
                "weather in Kyoto?",
                "21C in Kyoto",
                "what did I ask?",
                "you asked about Kyoto",
            ]
            repo = await service._repo()
            stored = await repo.load_transcript(session_key("e2e", "alice", session_id))
            assert [m.role for m in stored] == ["user", "assistant"] * 3

    session_id = asyncio.run(first_process())
    asyncio.run(second_process(session_id))


def test_runner_resumes_after_an_outage_parked_in_the_outbox(
    database_url: str, backend: str, tmp_path: Path
) -> None:
    """With ``outbox=``, events take sessionrepo's write path: while another connection
    holds what an append needs (a real outage of the primary for this session), the
    Runner's turn goes on and its events park in the outbox file; the process stops
    with them parked. A new process on the same outbox replays them (its drain), their
    state deltas are applied once, and the conversation resumes with the whole
    history."""
    outbox = f"sqlite:///{tmp_path / 'outbox.db'}"

    async def first_process() -> str:
        # A second for the attempt and the park: on a loaded 2-core machine half of one
        # was once too little for both (the turn then raised BackendUnavailable).
        service = SessionRepoSessionService(url=database_url, outbox=outbox, deadline=1.0)
        async with service:
            model = ScriptedModel(model="scripted", replies=["hello", "noted: Mochi"])
            runner = _runner(service, model)
            session = await service.create_session(app_name="e2e", user_id="alice")
            assert await _turn(runner, session.id, "hi") == ["hello"]
            writer = service.writer
            assert writer is not None
            sid = session_key("e2e", "alice", session.id)
            with holding_the_write_lock(database_url, backend, sid):
                assert await _turn(runner, session.id, "my cat is Mochi") == ["noted: Mochi"]
                # The fault happened: both events of the turn are parked, not stored.
                assert await writer.pending(sid) == 2
                assert writer.primary_down is not None
                await writer.stop()  # the process goes away with them parked
            repo = await service._repo()
            stored = [m.content for m in await repo.load_transcript(sid)]
            # The attempt that missed its deadline may still commit once the lock goes
            # (PostgreSQL: it was queued on the row lock); its replay is then a no-op.
            assert stored in (["hi", "hello"], ["hi", "hello", "my cat is Mochi"])
            return session.id

    async def second_process(session_id: str) -> None:
        # No fault here: a deadline a cold process meets on a loaded machine (its first
        # replay step opens the store and applies the state deltas), so a missed one is
        # not mistaken for a drain that leaves rows behind.
        service = SessionRepoSessionService(url=database_url, outbox=outbox, deadline=5.0)
        async with service:
            assert await service.get_user_state(app_name="e2e", user_id="alice") == {}
            writer = service.writer
            assert writer is not None
            await writer.drain(ignore_backoff=True)
            assert await writer.pending() == 0
            resumed = await service.get_session(
                app_name="e2e", user_id="alice", session_id=session_id
            )
            assert resumed is not None
            assert resumed.state["last"] == "noted: Mochi"  # the parked delta, applied
            model = ScriptedModel(model="scripted", replies=["your cat is Mochi"])
            runner = _runner(service, model)
            assert await _turn(runner, session_id, "what is my cat called?") == [
                "your cat is Mochi"
            ]
            assert model.seen == [5]
            repo = await service._repo()
            stored = await repo.load_transcript(session_key("e2e", "alice", session_id))
            assert [m.content for m in stored] == [
                "hi",
                "hello",
                "my cat is Mochi",
                "noted: Mochi",
                "what is my cat called?",
                "your cat is Mochi",
            ]

    session_id = asyncio.run(first_process())
    asyncio.run(second_process(session_id))


def test_runner_rewind_maps_to_sessionrepo_rewind(database_url: str) -> None:
    """``Runner.rewind_async`` (ADK's rewind: an event that undoes the invocations from
    the one named on) takes those invocations out of sessionrepo's live transcript and
    restores the state they changed; the next turn sees only what was before them."""

    async def scenario(service: SessionRepoSessionService) -> None:
        model = ScriptedModel(model="scripted", replies=["hello", "21C", "hello again"])
        runner = _runner(service, model)
        session = await service.create_session(app_name="e2e", user_id="alice")
        await _turn(runner, session.id, "hi")
        await _turn(runner, session.id, "weather?")
        loaded = await service.get_session(app_name="e2e", user_id="alice", session_id=session.id)
        assert loaded is not None
        second = loaded.events[2].invocation_id
        await runner.rewind_async(
            user_id="alice", session_id=session.id, rewind_before_invocation_id=second
        )
        repo = await service._repo()
        sid = session_key("e2e", "alice", session.id)
        assert [m.content for m in await repo.load_transcript(sid)] == ["hi", "hello"]
        assert len(await repo.load_transcript(sid, include_retracted=True)) == 5
        rewound = await service.get_session(app_name="e2e", user_id="alice", session_id=session.id)
        assert rewound is not None
        assert rewound.state["last"] == "hello"
        assert await _turn(runner, session.id, "hi again") == ["hello again"]
        assert model.seen == [1, 3, 3]  # the rewound turn is not sent to the model

    run(database_url, scenario)
