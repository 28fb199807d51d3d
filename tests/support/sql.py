"""Plain SQL on a test's database, beside sessionrepo (autocommit, one connection a call):
for reading what the store wrote, and for what a test does to the server itself."""

from __future__ import annotations

from typing import Any

import psycopg
from sqlalchemy.engine import make_url


def conninfo(url: str) -> str:
    """A SQLAlchemy URL (``postgresql+psycopg://…``) as libpq takes it."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def query(url: str, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
    """The rows of ``sql``."""
    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        return [tuple(row) for row in conn.execute(sql, params).fetchall()]


def execute(url: str, sql: str, params: Any = ()) -> None:
    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        conn.execute(sql, params)
