"""pytest plugin for the OpenAI Agents SDK's own session tests (loaded by ``run.py``):
their ``SQLiteSession(session_id, db_path, ...)`` makes a ``SessionRepoSession`` on the
run's backend instead, one sessionrepo database per ``db_path`` (``:memory:``: a new one).
Nothing else of their tests changes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _backends import Databases, Templates

from sessionrepo.integrations.openai_agents import SessionRepoSession


class SwappedSQLiteSession(SessionRepoSession):
    """``SQLiteSession``'s constructor, sessionrepo's session."""

    databases: Databases

    def __init__(
        self,
        session_id: str,
        db_path: str | Path = ":memory:",
        sessions_table: str = "agent_sessions",
        messages_table: str = "agent_messages",
        session_settings: Any = None,
    ) -> None:
        super().__init__(
            session_id, url=self.databases.url(db_path), session_settings=session_settings
        )


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
    monkeypatch.setattr(SwappedSQLiteSession, "databases", databases, raising=False)
    if hasattr(request.module, "SQLiteSession"):
        monkeypatch.setattr(request.module, "SQLiteSession", SwappedSQLiteSession)
    yield
    databases.close()
