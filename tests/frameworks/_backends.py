"""Fresh sessionrepo databases for the frameworks' own tests (see ``run.py``).

The backend is ``SESSIONREPO_FRAMEWORK_BACKEND`` (``sqlite`` or ``postgres``; PostgreSQL
from ``SESSIONREPO_TEST_POSTGRES_URL``, a server where databases may be created and
dropped). Each database a test names (the framework's own file path or URL) is one fresh
database at the schema's head, copied from a template migrated once per run; a name that
means "a new private store" to the framework (``:memory:``) is a new database each time.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Final

import psycopg
from sqlalchemy.engine import make_url

from sessionrepo.store.database import Database
from sessionrepo.store.schema import upgrade

BACKEND: Final = os.environ.get("SESSIONREPO_FRAMEWORK_BACKEND", "sqlite")
#: What the frameworks write for "a store of its own" (SQLite's in-memory database).
_PRIVATE: Final = frozenset({":memory:", "sqlite+aiosqlite:///:memory:", "sqlite:///:memory:"})


def _migrated(url: str) -> None:
    database = Database(url)
    try:
        upgrade(database)
    finally:
        database.dispose()


class Templates:
    """The migrated template of this run's backend, made once per test process."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._sqlite: Path | None = None
        self._postgres: str | None = None
        if BACKEND == "postgres":
            admin = os.environ.get("SESSIONREPO_TEST_POSTGRES_URL")
            if not admin:
                raise RuntimeError("the postgres backend needs SESSIONREPO_TEST_POSTGRES_URL")
            self.admin = make_url(admin).set(drivername="postgresql")
        elif BACKEND != "sqlite":
            raise RuntimeError(f"SESSIONREPO_FRAMEWORK_BACKEND={BACKEND!r}: sqlite or postgres")

    def _admin(self, sql: str) -> None:
        conninfo = self.admin.render_as_string(hide_password=False)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]  # psycopg types a literal query

    def _url(self, name: str) -> str:
        return self.admin.set(database=name).render_as_string(hide_password=False)

    def new_database(self) -> str:
        """A fresh database at the schema's head: its URL."""
        if BACKEND == "sqlite":
            if self._sqlite is None:
                self._sqlite = self.folder / "template.db"
                _migrated(f"sqlite:///{self._sqlite}")
            path = self.folder / f"{uuid.uuid4().hex}.db"
            shutil.copyfile(self._sqlite, path)
            return f"sqlite:///{path}"
        if self._postgres is None:
            self._postgres = f"sessionrepo_frameworks_{os.getpid()}"
            self._admin(f'DROP DATABASE IF EXISTS "{self._postgres}" WITH (FORCE)')
            self._admin(f'CREATE DATABASE "{self._postgres}"')
            _migrated(self._url(self._postgres))
        name = f"sessionrepo_framework_{uuid.uuid4().hex[:12]}"
        self._admin(f'CREATE DATABASE "{name}" TEMPLATE "{self._postgres}"')
        return self._url(name)

    def drop(self, url: str) -> None:
        if BACKEND == "postgres":
            self._admin(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)')

    def close(self) -> None:
        if self._postgres is not None:
            self._admin(f'DROP DATABASE IF EXISTS "{self._postgres}" WITH (FORCE)')


class Databases:
    """The databases of one test: one per name it uses."""

    def __init__(self, templates: Templates) -> None:
        self._templates = templates
        self._by_name: dict[str, str] = {}
        self._made: list[str] = []

    def url(self, name: object = ":memory:") -> str:
        key = str(name)
        if key in _PRIVATE or key not in self._by_name:
            url = self._templates.new_database()
            self._made.append(url)
            if key in _PRIVATE:
                return url
            self._by_name[key] = url
        return self._by_name[key]

    def close(self) -> None:
        for url in self._made:
            self._templates.drop(url)
