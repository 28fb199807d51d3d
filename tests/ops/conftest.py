"""Fixtures of the operator tools' tests: a store and a store on the other backend."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessionrepo import SessionRepository, open_repository


@pytest.fixture
def other_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database at the schema's head on the *other* backend (PostgreSQL for a
    SQLite test, SQLite for a PostgreSQL one)."""
    if backend == "sqlite":
        server = request.getfixturevalue("postgres_server")
        name = server.new_database()
        yield server.url_for(name)
        server.drop(name)
        return
    path = tmp_path / "other.db"
    shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
    yield f"sqlite:///{path}"


@pytest.fixture
def source(database_url: str) -> Iterator[SessionRepository]:
    """A repository on the test's backend."""
    repository = open_repository(database_url)
    yield repository
    repository.close()


@pytest.fixture
def target(other_url: str) -> Iterator[SessionRepository]:
    """A repository on the other backend."""
    repository = open_repository(other_url)
    yield repository
    repository.close()
