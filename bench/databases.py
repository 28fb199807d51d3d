"""Fresh databases for each contender: a new PostgreSQL database or a new SQLite file.

A ``Target`` names one contender's database on one backend; each contender turns it into
the URL its own driver wants. PostgreSQL databases are made with ``CREATE DATABASE`` on the
server the benchmark is pointed at and dropped afterwards; SQLite files are made in WAL
mode (the journal mode is stored in the file, so every contender, whatever it sets itself,
writes through WAL) and removed afterwards.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import tempfile
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


@dataclass(frozen=True)
class Target:
    """Where one contender keeps its data on one backend."""

    backend: str  # "sqlite" or "postgresql"
    #: A libpq URL (``postgresql://user@host:port/dbname``) or a SQLite file path.
    location: str

    def sqlalchemy_url(self, driver: str) -> str:
        """The SQLAlchemy URL with ``driver`` (``psycopg``, ``asyncpg``, ``pysqlite``,
        ``aiosqlite``)."""
        if self.backend == "sqlite":
            return f"sqlite+{driver}:///{self.location}"
        return re.sub(r"^postgres(ql)?://", f"postgresql+{driver}://", self.location)

    def connect(self) -> Any:
        """A plain DB-API connection (autocommit) for seeding and checks."""
        if self.backend == "sqlite":
            connection = sqlite3.connect(self.location, timeout=30, isolation_level=None)
            connection.execute("PRAGMA busy_timeout=30000")
            return connection
        return psycopg.connect(self.location, autocommit=True)


def _with_dbname(url: str, dbname: str) -> str:
    return make_url(url).set(database=dbname).render_as_string(hide_password=False)


class Databases:
    """Makes and drops the contenders' databases; use as a context manager."""

    def __init__(self, postgres_url: str | None, prefix: str) -> None:
        self.postgres_url = postgres_url
        self.prefix = prefix
        self._created: list[Target] = []
        self._dir = tempfile.mkdtemp(prefix=f"{prefix}-", dir=os.environ.get("BENCH_SQLITE_DIR"))

    def __enter__(self) -> Databases:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.drop_all()

    def create(self, backend: str, name: str) -> Target:
        dbname = f"{self.prefix}_{name}".lower()
        if backend == "sqlite":
            path = os.path.join(self._dir, f"{dbname}.db")
            with contextlib.closing(sqlite3.connect(path)) as connection:
                mode = connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if mode != "wal":
                    raise RuntimeError(f"{path}: SQLite refused WAL (got {mode!r})")
            target = Target("sqlite", path)
        else:
            if self.postgres_url is None:
                raise RuntimeError("no PostgreSQL URL")
            with psycopg.connect(self.postgres_url, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
                admin.execute(f'CREATE DATABASE "{dbname}"')
                # Stated, not assumed: every commit waits for the WAL flush.
                admin.execute(f'ALTER DATABASE "{dbname}" SET synchronous_commit = on')
            target = Target("postgresql", _with_dbname(self.postgres_url, dbname))
        self._created.append(target)
        return target

    def drop_all(self) -> None:
        for target in reversed(self._created):
            with contextlib.suppress(Exception):
                self._drop(target)
        self._created.clear()
        with contextlib.suppress(OSError):
            for name in os.listdir(self._dir):
                os.remove(os.path.join(self._dir, name))
            os.rmdir(self._dir)

    def _drop(self, target: Target) -> None:
        if target.backend == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(target.location + suffix)
            return
        assert self.postgres_url is not None
        dbname = make_url(target.location).database
        with psycopg.connect(self.postgres_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def postgres_settings(url: str) -> dict[str, str]:
    """The server's version and the settings that decide what a commit costs."""
    with psycopg.connect(url, autocommit=True) as connection:
        values = {"version": _show(connection, "server_version")}
        for name in (
            "synchronous_commit",
            "fsync",
            "wal_sync_method",
            "full_page_writes",
            "shared_buffers",
            "max_connections",
        ):
            values[name] = _show(connection, name)
    return values


def _show(connection: Any, name: str) -> str:
    row = connection.execute(f"SHOW {name}").fetchone()
    return "?" if row is None else str(row[0])
