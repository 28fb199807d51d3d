"""Where ADK's own session tests found ``SessionRepoSessionService`` behaving unlike ADK's
services (``make test-frameworks`` runs them against it): each case here, on both
backends and both write paths (the direct transaction and the outbox's).

- An event id is stored once: a retry of the same event is a no-op, a *different* event
  under a stored id raises ``ConflictError`` (ADK's database services raise too); it is
  never dropped silently.
- A state value JSON cannot encode (a callable, NaN) does not abort the append: the event
  is stored and the value kept in its string form, with a warning, as all three ADK
  services do.
- Session ids are trimmed as ADK's services trim them; a blank id gets a generated one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.genai import types

from sessionrepo import ConflictError
from sessionrepo.integrations.adk import SessionRepoSessionService, session_key

Scenario = Callable[[SessionRepoSessionService], Awaitable[None]]


def run(database_url: str, scenario: Scenario, **options: Any) -> None:
    async def main() -> None:
        async with SessionRepoSessionService(url=database_url, **options) as service:
            await scenario(service)

    asyncio.run(main())


@pytest.fixture(params=["direct", "outbox"])
def options(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    if request.param == "direct":
        return {}
    return {"outbox": f"sqlite:///{tmp_path / 'outbox.db'}"}


def text_event(text: str, **fields: Any) -> Event:
    return Event(
        author="user",
        content=types.Content(role="user", parts=[types.Part(text=text)]),
        **fields,
    )


def test_another_event_under_a_stored_id_raises(database_url: str, options: dict[str, Any]) -> None:
    """ADK's database services refuse it (an ``IntegrityError``); so does this one, with
    ``ConflictError``: the first event stays, the second is not stored, the session
    object does not show it, and a retry of the first is still a no-op."""

    async def scenario(service: SessionRepoSessionService) -> None:
        session = await service.create_session(app_name="app", user_id="u", session_id="s")
        first = text_event("first", id="event-1", invocation_id="inv-1")
        await service.append_event(session, first)
        other = text_event("another", id="event-1", invocation_id="inv-2")
        with pytest.raises(ConflictError, match="event-1") as raised:
            await service.append_event(session, other)
        assert raised.value.session_id == session_key("app", "u", "s")
        assert [event.id for event in session.events] == ["event-1"]
        await service.append_event(session, first)  # a retry: no-op, no error
        stored = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert stored is not None
        assert [event.content.parts[0].text for event in stored.events if event.content] == [
            "first"
        ]
        # A session object loaded before the first append (its marker is behind): the
        # same answer, not "stale" and not a silent no-op.
        fresh = await service.create_session(app_name="app", user_id="u", session_id="t")
        behind = await service.get_session(app_name="app", user_id="u", session_id="t")
        assert behind is not None
        await service.append_event(fresh, text_event("mine", id="event-2"))
        with pytest.raises(ConflictError):
            await service.append_event(behind, text_event("theirs", id="event-2"))

    run(database_url, scenario, **options)


def test_state_json_cannot_encode_is_stored_as_text(
    database_url: str, options: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A callable (or NaN) in a state delta: the event is stored, the state keeps the
    value's string form (NaN as null, as the event's own JSON has it), and a warning
    says so; the other values are stored as they are."""

    async def scenario(service: SessionRepoSessionService) -> None:
        session = await service.create_session(app_name="app", user_id="u", session_id="s")
        delta = {"callback": print, "ratio": float("nan"), "user:count": 3, "kept": [1, "a"]}
        event = text_event("hi", actions=EventActions(state_delta=delta))
        with caplog.at_level(logging.WARNING, logger="sessionrepo"):
            await service.append_event(session, event)
        assert any("string form" in record.getMessage() for record in caplog.records)
        stored = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert stored is not None
        assert [e.id for e in stored.events] == [event.id]
        assert stored.state == {
            "callback": repr(print),
            "ratio": None,
            "user:count": 3,
            "kept": [1, "a"],
        }
        made = await service.create_session(
            app_name="app", user_id="u", session_id="made", state={"hook": print}
        )
        assert made.state["hook"] == repr(print)
        again = await service.get_session(app_name="app", user_id="u", session_id="made")
        assert again is not None
        assert again.state["hook"] == repr(print)

    run(database_url, scenario, **options)


def test_session_ids_are_trimmed(database_url: str) -> None:
    """As ADK's services: a padded id is the trimmed one (create, get, delete), a padded
    duplicate is refused, and a blank id gets a generated one."""

    async def scenario(service: SessionRepoSessionService) -> None:
        session = await service.create_session(app_name="app", user_id="u", session_id="  s1 ")
        assert session.id == "s1"
        with pytest.raises(AlreadyExistsError):
            await service.create_session(app_name="app", user_id="u", session_id="s1\t")
        found = await service.get_session(app_name="app", user_id="u", session_id=" s1")
        assert found is not None
        assert found.id == "s1"
        blank = await service.create_session(app_name="app", user_id="u", session_id="   ")
        assert blank.id.strip() == blank.id
        assert blank.id
        listed = await service.list_sessions(app_name="app", user_id="u")
        assert sorted(s.id for s in listed.sessions) == sorted(["s1", blank.id])
        await service.delete_session(app_name="app", user_id="u", session_id="s1 ")
        assert await service.get_session(app_name="app", user_id="u", session_id="s1") is None

    run(database_url, scenario)


def test_a_padded_id_stored_before_is_still_found(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session made under a padded id before ids were trimmed is still found,
    appended to, refused as a duplicate and deleted under that id."""
    padded = " legacy "

    async def untrimmed(
        self: SessionRepoSessionService, app_name: str, user_id: str, session_id: str
    ) -> str:
        return session_id  # what the earlier release did

    async def made_before(service: SessionRepoSessionService) -> None:
        with monkeypatch.context() as earlier:
            earlier.setattr(SessionRepoSessionService, "_resolved_id", untrimmed)
            await service.create_session(app_name="app", user_id="u", session_id=padded)

    run(database_url, made_before)

    async def scenario(service: SessionRepoSessionService) -> None:
        found = await service.get_session(app_name="app", user_id="u", session_id=padded)
        assert found is not None
        assert found.id == padded
        await service.append_event(found, text_event("still here"))
        with pytest.raises(AlreadyExistsError):
            await service.create_session(app_name="app", user_id="u", session_id=padded)
        trimmed = await service.create_session(app_name="app", user_id="u", session_id="legacy")
        assert trimmed.id == "legacy"  # another session: the padded one is not "legacy"
        listed = await service.list_sessions(app_name="app", user_id="u")
        assert sorted(s.id for s in listed.sessions) == [padded, "legacy"]
        await service.delete_session(app_name="app", user_id="u", session_id=padded)
        listed = await service.list_sessions(app_name="app", user_id="u")
        assert [s.id for s in listed.sessions] == ["legacy"]
        # Once the padded one is gone, its id is the trimmed one's, as in ADK's services.
        found = await service.get_session(app_name="app", user_id="u", session_id=padded)
        assert found is not None
        assert found.id == "legacy"

    run(database_url, scenario)
