"""pytest plugin for LangChain's own chat-history tests (loaded by ``run.py``): their
``InMemoryChatMessageHistory(messages=...)`` makes a ``SessionRepoChatMessageHistory``
on the run's backend instead (a session of its own in the test's database)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence

import pytest
from _backends import Databases, Templates
from langchain_core.messages import BaseMessage

from sessionrepo.integrations.langchain import SessionRepoChatMessageHistory


class SwappedHistory(SessionRepoChatMessageHistory):
    """``InMemoryChatMessageHistory``'s constructor, sessionrepo's history."""

    databases: Databases

    def __init__(self, messages: Sequence[BaseMessage] | None = None) -> None:
        super().__init__(f"langchain-{uuid.uuid4()}", url=self.databases.url("langchain"))
        if messages:
            self.add_messages(messages)

    # InMemoryChatMessageHistory is a Pydantic model, equal to another with the same
    # messages, and their tests build the expected history with that constructor (here:
    # this one, a session of its own): compared the same way, by what each reads back.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SwappedHistory):
            return NotImplemented
        return self.messages == other.messages

    __hash__ = None  # type: ignore[assignment]  # equal by value, as the model it stands for


@pytest.fixture(scope="session")
def _sessionrepo_templates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Templates]:
    templates = Templates(tmp_path_factory.mktemp("sessionrepo"))
    yield templates
    templates.close()


@pytest.fixture(autouse=True)
def _sessionrepo_backend(
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    _sessionrepo_templates: Templates,
) -> Iterator[None]:
    databases = Databases(_sessionrepo_templates)
    monkeypatch.setattr(SwappedHistory, "databases", databases, raising=False)
    if hasattr(request.module, "InMemoryChatMessageHistory"):
        monkeypatch.setattr(request.module, "InMemoryChatMessageHistory", SwappedHistory)
    yield
    databases.close()
