"""pytest plugin for the OpenAI Agents SDK's own session tests (loaded by ``run.py``):
their ``SQLiteSession(session_id, db_path, ...)`` and ``SQLAlchemySession(session_id,
engine=...)`` / ``SQLAlchemySession.from_url(session_id, url=...)`` make a
``SessionRepoSession`` on the run's backend instead, one sessionrepo database per
``db_path``, engine or URL (``:memory:``: a new one). Nothing else of their tests changes."""

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


class SwappedSQLAlchemySession(SessionRepoSession):
    """``SQLAlchemySession``'s constructors, sessionrepo's session."""

    databases: Databases

    def __init__(
        self,
        session_id: str,
        *,
        engine: object = None,
        create_tables: bool = False,
        sessions_table: str = "agent_sessions",
        messages_table: str = "agent_messages",
        session_settings: Any = None,
        ensure_ascii: bool = True,
        _url: str | None = None,
    ) -> None:
        url = _url or self.databases.url(f"engine:{id(engine)}")
        super().__init__(session_id, url=url, session_settings=session_settings)

    @classmethod
    def from_url(
        cls,
        session_id: str,
        *,
        url: str,
        engine_kwargs: dict[str, Any] | None = None,
        session_settings: Any = None,
        **kwargs: Any,
    ) -> SwappedSQLAlchemySession:
        return cls(session_id, session_settings=session_settings, _url=cls.databases.url(url))


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
    monkeypatch.setattr(SwappedSQLAlchemySession, "databases", databases, raising=False)
    for name, swapped in (
        ("SQLiteSession", SwappedSQLiteSession),
        ("SQLAlchemySession", SwappedSQLAlchemySession),
    ):
        if hasattr(request.module, name):
            monkeypatch.setattr(request.module, name, swapped)
    yield
    databases.close()
