"""pytest plugin for Google ADK's own session-service tests (loaded by ``run.py``): their
``get_session_service(service_type, ...)`` returns a ``SessionRepoSessionService`` on
the run's backend for the database service types (``DATABASE``, ``SQLITE``); the
in-memory parameters of the same tests are skipped (they would run the same test on the
same service again), with the reason shown."""

from __future__ import annotations

import enum
import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from _backends import Databases, Templates

from sessionrepo.integrations.adk import SessionRepoSessionService

_DATABASE_TYPES = frozenset({"DATABASE", "SQLITE"})


def _service_type(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    for value in callspec.params.values() if callspec else ():
        if isinstance(value, enum.Enum) and type(value).__name__ == "SessionServiceType":
            return value.name
    return None


def _gets_a_service(item: pytest.Item) -> bool:
    """Whether the test asks ``get_session_service`` for its service (the one call that
    is swapped), rather than building one of ADK's own services itself."""
    function = getattr(item, "function", None)
    try:
        source = inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):
        return True  # cannot tell: run it
    return "session_service" in getattr(item, "fixturenames", ()) or (
        "get_session_service(" in source
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        kind = _service_type(item)
        if kind is not None and kind not in _DATABASE_TYPES:
            item.add_marker(
                pytest.mark.skip(reason=f"{kind}: ADK's in-memory service, not swapped")
            )
        elif not _gets_a_service(item):
            # Reported as skipped, not passed: it would test ADK's code, not ours.
            item.add_marker(
                pytest.mark.skip(reason="builds one of ADK's own services: nothing swapped")
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
    original = getattr(request.module, "get_session_service", None)
    if original is not None:

        def get_session_service(*args: Any, **kwargs: Any) -> Any:
            kind = args[0] if args else kwargs.get("service_type")
            if getattr(kind, "name", None) in _DATABASE_TYPES:
                return SessionRepoSessionService(url=databases.url("adk"))
            return original(*args, **kwargs)

        monkeypatch.setattr(request.module, "get_session_service", get_session_service)
    yield
    databases.close()
